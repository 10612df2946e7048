use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};

use super::{dev, rand_tensor, to_vec};
use crate::attention::ForwardOptions;
use crate::model::ReformerConfig;

/// Max |a - b| over all float parameters, and the number of parameters missing in either.
struct Compare<'a> {
    a: &'a GradientsParams,
    b: &'a GradientsParams,
    max_diff: f32,
    max_ref: f32,
    n: usize,
    missing: usize,
}

impl ModuleVisitor for Compare<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.n += 1;
        match (self.a.get::<D>(param.id), self.b.get::<D>(param.id)) {
            (Some(x), Some(y)) => {
                let d: f32 = (x.clone() - y).abs().max().into_scalar();
                let r: f32 = x.abs().max().into_scalar();
                self.max_diff = self.max_diff.max(d);
                self.max_ref = self.max_ref.max(r);
            }
            _ => self.missing += 1,
        }
    }
}

fn small_config() -> ReformerConfig {
    ReformerConfig::new()
        .with_vocab_size(11)
        .with_d_model(16)
        .with_n_layers(3)
        .with_n_heads(2)
        .with_d_head(8)
        .with_d_ff(32)
        .with_max_seq_len(16)
        .with_attn_layers(vec!["local".into(), "lsh".into()])
        .with_bucket_size(4)
        .with_n_rounds(2)
        .with_ff_chunk_len(3)
        .with_dropout(0.1)
        .with_dropatt(0.1)
        .with_init_std(0.3)
}

fn tokens(b: usize, l: usize, vocab: i64, seed: i64, device: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = (0..(b * l) as i64)
        .map(|i| (i * 7 + seed * 3 + i * i) % vocab)
        .collect();
    Tensor::from_data(TensorData::new(v, [b, l]), device)
}

#[test]
fn reversible_gradients_equal_plain_autodiff() {
    let device = dev().autodiff();
    let model = small_config().init(&device).unwrap();
    // length 10: not a multiple of the bucket size (padded inside the attention)
    let (x, y) = (tokens(2, 10, 11, 1, &device), tokens(2, 10, 11, 2, &device));
    let weights = rand_tensor([2, 10], 3, &device).abs();
    let opts = ForwardOptions::train(42);
    let loss_ref = model
        .forward_loss_with(x.clone(), y.clone(), Some(weights.clone()), &opts)
        .unwrap();
    let loss_ref_v: f32 = loss_ref.clone().inner().into_scalar();
    let grads_ref = GradientsParams::from_grads(loss_ref.backward(), &model);
    let (loss, grads) = model.train_step_with(x, y, Some(weights), &opts).unwrap();
    let loss_v: f32 = loss.into_scalar();
    assert!(
        (loss_v - loss_ref_v).abs() < 1e-5,
        "loss {loss_v} vs {loss_ref_v}"
    );
    let mut cmp = Compare {
        a: &grads_ref,
        b: &grads,
        max_diff: 0.0,
        max_ref: 0.0,
        n: 0,
        missing: 0,
    };
    model.visit(&mut cmp);
    eprintln!(
        "reversible vs plain: loss {loss_v} / {loss_ref_v}, max grad diff {} (max grad {}), {} params",
        cmp.max_diff, cmp.max_ref, cmp.n
    );
    assert_eq!(
        cmp.missing, 0,
        "{} of {} parameters have no gradient",
        cmp.missing, cmp.n
    );
    assert!(
        cmp.max_ref > 1e-3,
        "gradients are suspiciously small: {}",
        cmp.max_ref
    );
    assert!(
        cmp.max_diff < 1e-5 * cmp.max_ref.max(1.0),
        "max |grad_ref - grad_rev| = {} (max |grad| {})",
        cmp.max_diff,
        cmp.max_ref
    );
    // dropout really is on: another seed gives another loss
    let other = model
        .forward_loss_with(
            tokens(2, 10, 11, 1, &device),
            tokens(2, 10, 11, 2, &device),
            None,
            &ForwardOptions::train(43),
        )
        .unwrap()
        .into_scalar::<f32>();
    let same = model
        .forward_loss_with(
            tokens(2, 10, 11, 1, &device),
            tokens(2, 10, 11, 2, &device),
            None,
            &ForwardOptions::train(42),
        )
        .unwrap()
        .into_scalar::<f32>();
    assert!(
        (other - same).abs() > 1e-6,
        "seed must change dropout / rotations"
    );
}

#[test]
fn block_inverse_rebuilds_its_input() {
    let device = dev();
    let model = small_config().init(&device).unwrap();
    let x1 = rand_tensor([2, 9, 16], 5, &device);
    let x2 = rand_tensor([2, 9, 16], 6, &device);
    let opts = ForwardOptions::train(3);
    for blk in &model.blocks {
        let (y1, y2) = blk.forward_reversible(x1.clone(), x2.clone(), None, &opts);
        let (r1, r2) = blk.inverse(y1, y2, None, &opts);
        let d1: f32 = (r1 - x1.clone()).abs().max().into_scalar();
        let d2: f32 = (r2 - x2.clone()).abs().max().into_scalar();
        assert!(d1 < 1e-5 && d2 < 1e-5, "reconstruction error {d1} {d2}");
    }
}

#[test]
fn lm_forward_shapes_and_errors() {
    let device = dev();
    let cfg = small_config().with_reversible(false);
    let model = cfg.init(&device).unwrap();
    let logits = model.forward(tokens(3, 7, 11, 0, &device)).unwrap();
    assert_eq!(logits.dims(), [3, 7, 11]);
    // evaluation is deterministic
    let again = model.forward(tokens(3, 7, 11, 0, &device)).unwrap();
    assert_eq!(to_vec(logits), to_vec(again));
    let err = model
        .forward(tokens(1, 17, 11, 0, &device))
        .unwrap_err()
        .to_string();
    assert!(err.contains("17"), "{err}");
    let err = model
        .train_step(tokens(1, 5, 11, 0, &device), tokens(1, 5, 11, 0, &device))
        .unwrap_err()
        .to_string();
    assert!(err.contains("autodiff"), "{err}");
    let err = small_config()
        .with_n_buckets(Some(5))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains('5'), "{err}");
    let err = small_config()
        .with_axial_dims(Some([4, 4]))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("(4, 4)"), "{err}");
    let err = small_config()
        .with_attn_layers(vec!["full".into()])
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("full"), "{err}");
}

#[test]
fn default_config_is_reformer_small() {
    let cfg = ReformerConfig::new();
    cfg.validate().unwrap();
    assert_eq!(
        (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head),
        (6, 256, 8, 32)
    );
    assert_eq!(
        (
            cfg.max_seq_len,
            cfg.bucket_size,
            cfg.n_rounds,
            cfg.vocab_size
        ),
        (4096, 64, 4, 256)
    );
    assert!(cfg.causal && cfg.reversible && cfg.axial_positions && cfg.ff_chunk_len > 0);
    assert_eq!(cfg.axial_grid(), [64, 64]);
}

#[test]
fn train_steps_reduce_the_loss() {
    use burn::optim::AdamWConfig;
    let device = dev().autodiff();
    let mut model = small_config()
        .with_dropout(0.0)
        .with_dropatt(0.0)
        .init(&device)
        .unwrap();
    let mut optim = AdamWConfig::new().init();
    let (x, y) = (tokens(2, 12, 11, 4, &device), tokens(2, 12, 11, 5, &device));
    let first: f32 = model
        .forward_loss(x.clone(), y.clone())
        .unwrap()
        .into_scalar();
    for _ in 0..15 {
        let (_, grads) = model.train_step(x.clone(), y.clone()).unwrap();
        model = optim.step(3e-3, model, grads);
    }
    let last: f32 = model.forward_loss(x, y).unwrap().into_scalar();
    assert!(last < first - 0.1, "loss {first} -> {last}");
}
