//! The Reformer as a preset of the layer stack: the reversible training step against plain
//! autodiff of the same forward, the blocks' inverse, bucket replay, the checkpoints of the
//! Reformer model from before the stack, and the combinations with kNN layers and XL memory.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_reformer::ForwardOptions;
use memzoo_reformer::rng::normal_vec;
use memzoo_stack::{
    LayerContext, LayerKind, LshConfig, Randomness, ReformerConfig, Replay, Step, XlState,
};
use memzoo_tests::*;

fn dev() -> Device {
    flex()
}

/// A standard normal tensor drawn from `seed`.
fn rand_tensor<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(normal_vec(n, seed), shape), device)
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    host(t)
}

/// What a layer reads in a seeded pass under `opts`, with no positions, memory or kNN store.
fn cx(opts: &ForwardOptions) -> LayerContext<'static> {
    LayerContext {
        positions: None,
        shared: None,
        knn: None,
        seed: 0,
        opts: Some(opts.clone()),
        randomness: Randomness::Seeded,
        trace: None,
    }
}

/// Max |a - b| over all float parameters, and the number of parameters missing in either.
struct Compare<'a> {
    a: &'a GradientsParams,
    b: &'a GradientsParams,
    max_diff: f32,
    max_ref: f32,
    n: usize,
    missing: usize,
    /// Parameters with a NaN or infinite gradient in either (`f32::max` skips NaN).
    non_finite: usize,
}

impl ModuleVisitor for Compare<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.n += 1;
        match (self.a.get::<D>(param.id), self.b.get::<D>(param.id)) {
            (Some(x), Some(y)) => {
                let sx: f32 = x.clone().powi_scalar(2).sum().into_scalar();
                let sy: f32 = y.clone().powi_scalar(2).sum().into_scalar();
                if !(sx.is_finite() && sy.is_finite()) {
                    self.non_finite += 1;
                }
                let d: f32 = (x.clone() - y).abs().max().into_scalar();
                let r: f32 = x.abs().max().into_scalar();
                self.max_diff = self.max_diff.max(d);
                self.max_ref = self.max_ref.max(r);
            }
            _ => self.missing += 1,
        }
    }
}

/// [`Compare`] of two gradient sets over the float parameters of `module`.
/// The loss of a pass as a number, asserted within 1e-5 of `reference`.
fn assert_loss_close(loss: Tensor<1>, reference: f32) -> f32 {
    let loss: f32 = loss.into_scalar();
    assert!(
        (loss - reference).abs() < 1e-5,
        "loss {loss} vs {reference}"
    );
    loss
}

fn compare<M: Module>(
    module: &M,
    a: &GradientsParams,
    b: &GradientsParams,
) -> (f32, f32, usize, usize, usize) {
    let mut cmp = Compare {
        a,
        b,
        max_diff: 0.0,
        max_ref: 0.0,
        n: 0,
        missing: 0,
        non_finite: 0,
    };
    module.visit(&mut cmp);
    (
        cmp.max_diff,
        cmp.max_ref,
        cmp.n,
        cmp.missing,
        cmp.non_finite,
    )
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
        .with_attn_layers(vec![LayerKind::Local, LayerKind::Lsh])
        .with_lsh(LshConfig::new().with_chunk_len(4).with_n_rounds(2))
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
    let loss_ref = seeded_loss(&model, x.clone(), y.clone(), Some(weights.clone()), &opts).unwrap();
    let loss_ref_v: f32 = loss_ref.clone().inner().into_scalar();
    let grads_ref = GradientsParams::from_grads(loss_ref.backward(), &model);
    let (loss, grads) = model
        .train_step(
            x,
            y,
            &mut XlState::new(),
            &Step::default()
                .with_weights(Some(weights))
                .with_options(opts),
        )
        .unwrap();
    let loss_v = assert_loss_close(loss, loss_ref_v);
    let (max_diff, max_ref, n, missing, non_finite) = compare(&model, &grads_ref, &grads);
    eprintln!(
        "reversible vs plain: loss {loss_v} / {loss_ref_v}, max grad diff {} (max grad {}), {} params",
        max_diff, max_ref, n
    );
    assert_eq!(
        missing, 0,
        "{} of {} parameters have no gradient",
        missing, n
    );
    assert_eq!(
        non_finite, 0,
        "{} of {} parameters have a NaN or infinite gradient",
        non_finite, n
    );
    assert!(
        max_ref > 1e-3,
        "gradients are suspiciously small: {}",
        max_ref
    );
    assert!(
        max_diff < 1e-5 * max_ref.max(1.0),
        "max |grad_ref - grad_rev| = {} (max |grad| {})",
        max_diff,
        max_ref
    );
    // dropout really is on: another seed gives another loss
    let loss_with_seed = |seed| {
        seeded_loss(
            &model,
            tokens(2, 10, 11, 1, &device),
            tokens(2, 10, 11, 2, &device),
            None,
            &ForwardOptions::train(seed),
        )
        .unwrap()
        .into_scalar::<f32>()
    };
    let (other, same) = (loss_with_seed(43), loss_with_seed(42));
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
    for blk in &model.layers {
        let (y1, y2, replay) = blk
            .forward_reversible(x1.clone(), x2.clone(), None, cx(&opts))
            .unwrap();
        let (r1, r2) = blk.inverse(y1, y2, None, cx(&opts), replay).unwrap();
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
    let logits = window_logits(&model, tokens(3, 7, 11, 0, &device)).unwrap();
    assert_eq!(logits.dims(), [3, 7, 11]);
    // evaluation is deterministic
    let again = window_logits(&model, tokens(3, 7, 11, 0, &device)).unwrap();
    assert_eq!(to_vec(logits), to_vec(again));
    let err = window_logits(&model, tokens(1, 17, 11, 0, &device))
        .unwrap_err()
        .to_string();
    assert!(err.contains("17"), "{err}");
    let err = model
        .train_step(
            tokens(1, 5, 11, 0, &device),
            tokens(1, 5, 11, 0, &device),
            &mut XlState::new(),
            &Step::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("autodiff"), "{err}");
    let small = small_config();
    let lsh = small.lsh.clone().with_n_buckets(Some(5));
    let err = small.with_lsh(lsh).validate().unwrap_err().to_string();
    assert!(err.contains('5'), "{err}");
    let err = small_config()
        .with_axial_dims(Some([4, 4]))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("(4, 4)"), "{err}");
    let err = serde_json::from_str::<ReformerConfig>(r#"{"attn_layers": ["full"]}"#)
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
            cfg.lsh.chunk_len,
            cfg.lsh.n_rounds,
            cfg.vocab_size
        ),
        (4096, 64, 4, 256)
    );
    assert!(cfg.lsh.causal && cfg.reversible && cfg.axial_positions && cfg.ff_chunk_len > 0);
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
    let first: f32 = seeded_loss(&model, x.clone(), y.clone(), None, &model.eval_options())
        .unwrap()
        .into_scalar();
    for _ in 0..15 {
        let (_, grads) = model
            .train_step(x.clone(), y.clone(), &mut XlState::new(), &Step::default())
            .unwrap();
        model = optim.step(3e-3, model, grads);
    }
    let last: f32 = seeded_loss(&model, x, y, None, &model.eval_options())
        .unwrap()
        .into_scalar();
    assert!(last < first - 0.1, "loss {first} -> {last}");
}

/// A one-layer, all-LSH reversible model without dropout, for the hashing tests.
fn lsh_config() -> ReformerConfig {
    ReformerConfig::new()
        .with_vocab_size(11)
        .with_d_model(16)
        .with_n_layers(1)
        .with_n_heads(2)
        .with_d_head(8)
        .with_d_ff(32)
        .with_max_seq_len(16)
        .with_lsh(LshConfig::new().with_chunk_len(4).with_n_rounds(2))
        .with_ff_chunk_len(3)
        .with_dropout(0.0)
        .with_init_std(0.3)
}

fn int_vec(r: Replay) -> Vec<i64> {
    match r {
        Replay::Buckets(t) => t.into_data().iter::<i64>().collect(),
        other => panic!("an LSH layer records buckets, got {other:?}"),
    }
}

/// Bug: a length that is not a multiple of the bucket size pads the LSH input with zero rows,
/// whose key normalisation `q / ||q||` backpropagated `0 * d sqrt(0) = NaN` into every weight.
#[test]
fn padded_lsh_length_has_finite_gradients() {
    let device = dev().autodiff();
    for reversible in [true, false] {
        let model = lsh_config()
            .with_reversible(reversible)
            .init(&device)
            .unwrap();
        // 10 tokens, buckets of 4: padded to 12 inside the attention.
        let (x, y) = (tokens(2, 10, 11, 1, &device), tokens(2, 10, 11, 2, &device));
        let (loss, grads) = model
            .train_step(
                x,
                y,
                &mut XlState::new(),
                &Step::default().with_options(ForwardOptions::train(5)),
            )
            .unwrap();
        assert!(loss.into_scalar::<f32>().is_finite());
        let (_, max_ref, n, missing, non_finite) = compare(&model, &grads, &grads);
        assert_eq!(
            (non_finite, missing),
            (0, 0),
            "reversible {reversible}: {} of {} gradients not finite, {} missing",
            non_finite,
            n,
            missing
        );
        assert!(max_ref > 1e-4, "gradients vanish: {}", max_ref);
    }
}

/// Bug: the reversible backward hashed the rebuilt input `x_2 = y_2 - G(y_1)`, whose rounding
/// error can flip an argmax, and then differentiated another sparsity pattern than the forward
/// used. The test searches (bisection along a line between two random inputs, to a bucket
/// boundary) for an `x_2` whose rebuilt copy hashes differently and whose re-hashed backward
/// gives other gradients; the backward replaying the forward's buckets must still match plain
/// autodiff of the forward.
#[test]
fn reverse_replays_the_forward_buckets_when_a_hash_flips() {
    let device = dev().autodiff();
    let model = lsh_config().init(&device).unwrap();
    let blk = &model.layers[0];
    let plain = blk.valid();
    let opts = ForwardOptions::eval(11);
    let o = Some(&opts);
    let shape = [1, 12, 16];
    let n: usize = shape.iter().product();
    let inner = dev();
    let x1 = rand_tensor(shape, 1, &inner);
    let dy1 = rand_tensor(shape, 2, &inner);
    let dy2 = rand_tensor(shape, 3, &inner);
    let hash = |x2: &Tensor<3>| {
        int_vec(
            plain
                .f(x2.clone(), None, &mut cx(&opts), Replay::Nothing)
                .unwrap()
                .1,
        )
    };
    // The forward pass (no graph): outputs and the bucket ids it hashed.
    let forward = |x2: &Tensor<3>| {
        let (y1, y2, buckets) = plain
            .forward_reversible(x1.clone(), x2.clone(), None, cx(&opts))
            .unwrap();
        (y1, y2, buckets)
    };
    // Gradients of sum(y1 dy1 + y2 dy2), (param grads, [dx1, dx2] on the host): by plain
    // autodiff of the forward with `buckets`, and by `reverse` with those buckets or hashing
    // the rebuilt input again.
    let reference = |x2: &Tensor<3>, buckets: &Replay| {
        let a1 = x1.clone().autodiff().require_grad();
        let a2 = x2.clone().autodiff().require_grad();
        let b = match buckets {
            Replay::Buckets(b) => Replay::Buckets(Box::new(b.as_ref().clone().autodiff())),
            _ => unreachable!(),
        };
        let y1 = a1.clone() + blk.f(a2.clone(), None, &mut cx(&opts), b).unwrap().0;
        let y2 = a2.clone() + blk.g(y1.clone(), o);
        let loss = (y1 * dy1.clone().autodiff()).sum() + (y2 * dy2.clone().autodiff()).sum();
        let g = loss.backward();
        let mut v = to_vec(a1.grad(&g).unwrap());
        v.extend(to_vec(a2.grad(&g).unwrap()));
        (v, GradientsParams::from_grads(g, blk))
    };
    let reversed = |y1: &Tensor<3>, y2: &Tensor<3>, buckets: Replay| {
        let mut acc = burn::optim::GradientsAccumulator::new();
        let (_, _, dx1, dx2) = blk
            .reverse(
                y1.clone(),
                y2.clone(),
                dy1.clone(),
                dy2.clone(),
                None,
                cx(&opts),
                buckets,
                &mut |g| acc.accumulate(blk, GradientsParams::from_module(g, blk)),
            )
            .unwrap();
        let mut v = to_vec(dx1);
        v.extend(to_vec(dx2));
        (v, acc.grads())
    };
    let diff = |a: &(Vec<f32>, GradientsParams), b: &(Vec<f32>, GradientsParams)| {
        let (max_diff, _, _, missing, non_finite) = compare(blk, &a.1, &b.1);
        assert_eq!((missing, non_finite), (0, 0));
        let dx = a.0.iter().zip(&b.0).map(|(p, q)| (p - q).abs());
        dx.fold(max_diff, f32::max)
    };
    let line = |a: &[f32], b: &[f32], t: f64| {
        let v: Vec<f32> = a
            .iter()
            .zip(b)
            .map(|(&p, &q)| (p as f64 + t * (q as f64 - p as f64)) as f32)
            .collect();
        Tensor::<3>::from_data(TensorData::new(v, shape), &inner)
    };
    let mut found = None;
    'search: for seed in 0..40u64 {
        let a = normal_vec(n, 100 + 2 * seed);
        let b = normal_vec(n, 101 + 2 * seed);
        let start = hash(&line(&a, &b, 0.0));
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        if hash(&line(&a, &b, hi)) == start {
            continue;
        }
        // hash(lo) == start != hash(hi), down to adjacent floats.
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if hash(&line(&a, &b, mid)) == start {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        for k in -8i32..=8 {
            let x2 = line(&a, &b, lo + k as f64 * (hi - lo).max(1e-9));
            let (y1, y2, buckets) = forward(&x2);
            let rebuilt = y2.clone() - plain.g(y1.clone(), o);
            if int_vec(buckets.clone()) == hash(&rebuilt) {
                continue;
            }
            let want = reference(&x2, &buckets);
            let rehashed = diff(&want, &reversed(&y1, &y2, Replay::Nothing));
            if rehashed > 1e-3 {
                let replayed = diff(&want, &reversed(&y1, &y2, buckets));
                found = Some((rehashed, replayed, seed));
                break 'search;
            }
        }
    }
    let (rehashed, replayed, seed) =
        found.expect("no input found whose rebuilt copy hashes differently");
    eprintln!(
        "line {seed}: gradient error re-hashing the rebuilt input {rehashed:e}, replaying the \
         forward's buckets {replayed:e}"
    );
    assert!(
        replayed < 1e-4,
        "replayed buckets: gradient error {replayed:e}"
    );
}

/// The fixture's model (tests/fixtures/legacy/reformer*.bpk, written by the `ReformerLm` code
/// before the Reformer became a preset of the stack, with this config).
fn fixture_config(reversible: bool) -> ReformerConfig {
    let small = small_config();
    let lsh = small.lsh.clone().with_seed(7);
    small
        .with_vocab_size(32)
        .with_dropout(0.0)
        .with_dropatt(0.0)
        .with_lsh(lsh)
        .with_reversible(reversible)
        .with_axial_positions(reversible)
}

/// Checkpoints of the Reformer model from before the stack (a reversible one with axial
/// positions, a plain one without) load into the preset — renamed by `memzoo_stack::legacy` —
/// and give the evaluation logits the old code computed and stored beside them (same LSH
/// rotations: the seeding scheme moved with the model).
#[test]
fn reformer_checkpoints_from_before_the_stack_load_and_compute_the_same() {
    let device = dev();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/legacy");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reformer.json")).unwrap()).unwrap();
    let v: Vec<i64> = (0..20).map(|i| ((i * 7 + 3 + i * i) % 32) as i64).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(v, [2, 10]), &device);
    for (name, reversible) in [("reformer", true), ("reformer_plain", false)] {
        let path = dir.join(format!("{name}.bpk"));
        let fresh = fixture_config(reversible).init(&device).unwrap();
        assert!(
            fresh.clone().try_load_file(&path).is_err(),
            "{name}: old layout"
        );
        let (model, converted) = memzoo_stack::legacy::load_any(fresh, &path).unwrap();
        assert!(converted, "{name}: read as the old layout");
        let got = host(window_logits(&model, tokens.clone()).unwrap());
        let want: Vec<f64> = expected[name]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), want.len());
        let d = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(d < 1e-5, "{name}: max |logit diff| {d}");
    }
    // Another architecture is refused with the file named.
    let err = memzoo_stack::legacy::load_any(
        fixture_config(true).with_d_ff(16).init(&device).unwrap(),
        &dir.join("reformer.bpk"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("reformer.bpk"), "{err}");
}

/// A reversible Reformer stack with a kNN memory layer and an XL memory (no peer offers
/// either): over a second segment (the first filled both memories), the reversible step's loss
/// and gradients equal plain autodiff through the same reversible forward (the kNN layer's
/// retrieved pairs and the LSH buckets replayed), both leave the same memories behind, and
/// training on a repeated batch lowers the loss.
#[test]
fn reversible_stack_with_knn_layer_and_xl_memory_has_exact_gradients_and_trains() {
    let device = dev().autodiff();
    let config = small_config()
        .with_n_layers(3)
        .with_attn_layers(vec![LayerKind::Local, LayerKind::Knn, LayerKind::Lsh])
        .with_axial_positions(false)
        .with_mem_len(6)
        .with_dropatt(0.0)
        .with_knn(
            memzoo_stack::KnnLayerConfig::new()
                .with_top_k(4)
                .with_max_memories(64),
        );
    let model = config.init(&device).unwrap();
    assert_eq!(
        model.layer_kinds(),
        [LayerKind::Local, LayerKind::Knn, LayerKind::Lsh]
    );
    let reset = [false, false];
    let fill = |state: &mut XlState| {
        model
            .forward_state(tokens(2, 8, 11, 7, &device), state, &reset)
            .unwrap();
    };
    let (mut plain, mut rev) = (XlState::default(), XlState::default());
    fill(&mut plain);
    fill(&mut rev);
    assert_eq!(plain.xl.len(), 6);
    let (x, y) = (tokens(2, 8, 11, 1, &device), tokens(2, 8, 11, 2, &device));
    let opts = ForwardOptions::train(42);
    let step = Step::reset(&reset).with_options(opts);
    let nll = model
        .eval_step(x.clone(), y.clone(), &mut plain, &step)
        .unwrap()
        .nll;
    let loss_ref = memzoo_stack::mean_nll(nll, None);
    let loss_ref_v: f32 = loss_ref.clone().inner().into_scalar();
    let grads_ref = GradientsParams::from_grads(loss_ref.backward(), &model);
    let (loss, grads) = model.train_step(x, y, &mut rev, &step).unwrap();
    assert_loss_close(loss, loss_ref_v);
    let (max_diff, max_ref, n, missing, non_finite) = compare(&model, &grads_ref, &grads);
    eprintln!(
        "reversible kNN + memory stack: max grad diff {} (max grad {}), {} params, {} without a gradient",
        max_diff, max_ref, n, missing
    );
    assert_eq!(non_finite, 0);
    assert!(max_ref > 1e-3, "gradients vanish: {}", max_ref);
    assert!(
        max_diff < 1e-4 * max_ref.max(1.0),
        "max |grad_ref - grad_rev| = {} (max |grad| {})",
        max_diff,
        max_ref
    );
    // The same memories after the step: XL memory (the x_2 streams) and the kNN store.
    for l in 0..3 {
        let (a, b) = (plain.xl.layer(l).unwrap(), rev.xl.layer(l).unwrap());
        assert_close(&host(a.clone()), &host(b.clone()), 1e-5, "XL memory");
    }
    assert_eq!(plain.knn[0].rows(), rev.knn[0].rows());

    use burn::optim::AdamWConfig;
    let mut model = config.with_dropout(0.0).init(&device).unwrap();
    let mut optim = AdamWConfig::new().init();
    let (x, y) = (tokens(2, 8, 11, 4, &device), tokens(2, 8, 11, 5, &device));
    let mut losses = Vec::new();
    for _ in 0..20 {
        let mut state = XlState::default();
        fill(&mut state);
        let opts = model.next_train_options();
        let (loss, grads) = model
            .train_step(
                x.clone(),
                y.clone(),
                &mut state,
                &Step::reset(&reset).with_options(opts),
            )
            .unwrap();
        losses.push(loss.into_scalar::<f32>());
        model = optim.step(3e-3, model, grads);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < first - 0.1, "loss {first} -> {last}");
}

/// Combinations the reversible stack cannot honour are errors that say why.
#[test]
fn ill_defined_combinations_are_errors_that_say_why() {
    use memzoo_stack::{Randomness, Residual, XlConfig};
    let rev = || {
        XlConfig::new()
            .with_n_layers(2)
            .with_d_model(16)
            .with_n_heads(2)
            .with_d_inner(32)
            .with_residual(Residual::Reversible)
            .with_pre_ln(true)
            .with_randomness(Randomness::Seeded)
    };
    rev().validate().unwrap();
    for (config, words) in [
        (rev().with_pre_ln(false), "post-LN"),
        (rev().with_randomness(Randomness::Device), "replays"),
        (rev().with_dropatt(0.1), "dropatt"),
    ] {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("reversible") && err.contains(words), "{err}");
    }
    let err = small_config()
        .with_mem_len(4)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("axial") && err.contains("mem_len = 4"),
        "{err}"
    );
    // ... and so is a memory given to an axial stack at run time (e.g. `with_mem_len`).
    let device = dev();
    let model = small_config().init(&device).unwrap().with_mem_len(4);
    let mut state = XlState::default();
    model
        .forward_state(tokens(1, 4, 11, 0, &device), &mut state, &[false])
        .unwrap();
    let err = model
        .forward_state(tokens(1, 4, 11, 0, &device), &mut state, &[false])
        .unwrap_err()
        .to_string();
    assert!(err.contains("axial") && err.contains("mem_len 0"), "{err}");
}

/// Reformer-small and the paper's enwik8 configuration keep their meaning as stacks.
#[test]
fn reformer_presets_build_the_stack() {
    use memzoo_stack::{Activation, Randomness, Residual};
    let small = ReformerConfig::small().stack();
    assert_eq!(small.layer_kinds(), vec![LayerKind::Lsh; 6]);
    assert_eq!(
        (small.residual, small.ff_activation, small.randomness),
        (Residual::Reversible, Activation::Gelu, Randomness::Seeded)
    );
    assert_eq!(small.axial.as_ref().unwrap().shape, [64, 64]);
    let enwik8 = ReformerConfig::enwik8().stack();
    assert_eq!(
        &enwik8.layer_kinds()[..4],
        [
            LayerKind::Local,
            LayerKind::Local,
            LayerKind::Lsh,
            LayerKind::Local
        ]
    );
    assert_eq!(
        (
            enwik8.d_model,
            enwik8.n_layers,
            enwik8.lsh.chunk_len,
            enwik8.lsh.n_buckets
        ),
        (1024, 12, 256, Some(512))
    );
    assert_eq!(enwik8.axial.as_ref().unwrap().dims, [256, 768]);
    enwik8.validate().unwrap();
}
