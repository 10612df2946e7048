//! Checkpoint import from block-recurrent-transformer-pytorch 0.4.4: its
//! `BlockRecurrentTransformer` read into memzoo's Block-Recurrent stack, compared with the
//! package's own run.
//!
//! The fixture (`tests/fixtures/lucidrains-block-recurrent`) is a small random-weight model (3
//! layers, d 32, 2 heads of 8 with one key/value head, blocks of 4, `max_seq_len` 8 = 2
//! blocks, 3 state vectors written by layer 3 and read by layer 2, rotary/xPos positions,
//! qk-RMSNorm in the recurrent layer, GEGLU of width 42) run by the package itself
//! (`xtask/peers/fixtures/lucidrains_block_recurrent_model.py`) over 3 segments through its
//! `RecurrentTrainerWrapper`: logits, losses, the carried states and XL memories after every
//! segment, and every parameter's gradient of the wrapper's loss. Float comparisons: `max
//! |memzoo - package| <= 1e-4 · max(1, max |package|)` (`import::check`).

use std::path::{Path, PathBuf};

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};
use memzoo_import::BlockRecurrentPeerConfig;
use memzoo_import::lucidrains_block_recurrent::{self, block_recurrent_to_peer};
use memzoo_import::mapping::Source;
use memzoo_stack::{LayerKind, QkNormConfig, UnrollSegment, XlConfig, XlState};
use memzoo_tests::*;

use crate::import::{GradientMean, ModelEdit, Reference, assert_each_option_matters, check};

const SEGMENTS: usize = 3;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-block-recurrent")
}

/// `max |got - want|`, printed (the report's numbers) and returned.
fn report(got: &[f32], want: &[f32], what: &str) -> f32 {
    let d = max_abs_diff(got, want);
    eprintln!("{what}: max |memzoo - package| = {d:e}");
    d
}

/// The `b`-th block of `w` tokens of a `[batch, len]` segment.
fn block(t: &Tensor<2, Int>, b: usize, w: usize) -> Tensor<2, Int> {
    t.clone().narrow(1, b * w, w)
}

#[test]
fn lucidrains_block_recurrent_matches_the_package() {
    let dev = flex();
    let dir = fixture();
    let (model, cfg) = lucidrains_block_recurrent::load(&dir, &dev).expect("import");
    assert_eq!(model.stack_family(), "block-recurrent");
    assert_eq!(cfg.layers().unwrap(), (3, 2));
    let rec = model.block_recurrent_config().unwrap();
    let (w, k) = (cfg.block_width, rec.bptt_segments);
    assert_eq!((k, rec.layer, rec.read_layer), (2, 2, Some(1)));
    let r = Reference::at(&dir);
    let batch = r.data("input_ids.0").shape()[0];
    let reset = vec![false; batch];
    // Values: logits and losses of every segment (read block by block), the state and the
    // key/value memories it leaves.
    let mut state = XlState::new();
    let (mut d_logits, mut d_state, mut d_mem) = (0.0f32, 0.0f32, 0.0f32);
    for s in 0..SEGMENTS {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        let y = r.tokens::<2>(&format!("targets.{s}"), &dev);
        let logits: Vec<Tensor<3>> = (0..k)
            .map(|b| {
                let h = model
                    .forward_state(block(&x, b, w), &mut state, &reset)
                    .unwrap();
                model.logits(h)
            })
            .collect();
        let logits = Tensor::cat(logits, 1);
        let want = r.floats(&format!("logits.{s}"));
        check(&host(logits.clone()), &want, &format!("logits {s}"));
        d_logits = d_logits.max(report(&host(logits.clone()), &want, &format!("logits {s}")));
        let lp = log_softmax(logits, 2);
        let [b, q, _] = lp.dims();
        let nll = lp.gather(2, y.reshape([b, q, 1])).reshape([b, q]).neg();
        check(
            &host(nll.clone()),
            &r.floats(&format!("losses.{s}")),
            "losses",
        );
        check(&host(nll.mean()), &r.floats(&format!("loss.{s}")), "loss");
        // The carried state, [batch, S, d].
        let c = state
            .block_recurrent
            .value
            .clone()
            .expect("a written state");
        let want = r.floats(&format!("states.{s}"));
        check(&host(c.clone()), &want, &format!("state {s}"));
        d_state = d_state.max(report(&host(c), &want, &format!("state {s}")));
        // Each layer's memory: memzoo's [batch, w, k ; v] against the package's [2, batch, w,
        // d_head].
        for l in 0..cfg.depth {
            let m = state.xl.layer(l).expect("a memory").clone();
            let [mb, mw, kv] = m.dims();
            let m = m.reshape([mb, mw, 2, kv / 2]).permute([2, 0, 1, 3]);
            let want = r.floats(&format!("memories.{s}.{l}"));
            check(&host(m.clone()), &want, &format!("memory {s}.{l}"));
            d_mem = d_mem.max(max_abs_diff(&host(m), &want));
        }
    }
    eprintln!("max over segments: logits {d_logits:e}, states {d_state:e}, memories {d_mem:e}");

    // Gradients: the wrapper's loss (1/3) Σ_s L_s, each segment's states and memories in the
    // graph over its 2 blocks and detached after it, is the mean of three unrolled steps of
    // 2 blocks, (1/2)(L_{s,0} + L_{s,1}).
    let ad = dev.autodiff();
    let (model, _) = lucidrains_block_recurrent::load(&dir, &ad).unwrap();
    let mut state = XlState::new();
    let mut mean = GradientMean::default();
    for s in 0..SEGMENTS {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &ad);
        let y = r.tokens::<2>(&format!("targets.{s}"), &ad);
        let blocks = (0..k)
            .map(|b| UnrollSegment {
                inputs: block(&x, b, w),
                targets: block(&y, b, w),
                reset: reset.clone(),
                weights: None,
            })
            .collect();
        let (loss, grads) = model.train_unroll(blocks, &mut state).unwrap();
        let grads = block_recurrent_to_peer(&model, Source::Gradients(&grads));
        mean.add(loss.into_scalar::<f64>(), grads, SEGMENTS);
    }
    let (d_loss, d_grad) = mean.check(&r);
    eprintln!("the wrapper's loss: max |memzoo - package| = {d_loss:e}");
    eprintln!("max over every gradient: {d_grad:e}");
}

/// Without each of the package's options the import is another function: the parity test
/// above would fail if any one were switched back.
#[test]
fn lucidrains_block_recurrent_options_each_change_the_function() {
    let dev = flex();
    let (model, cfg) = lucidrains_block_recurrent::load(&fixture(), &dev).unwrap();
    let r = Reference::at(&fixture());
    let x = r.tokens::<2>("input_ids.0", &dev);
    let batch = x.dims()[0];
    let w = cfg.block_width;
    // Two blocks: the second reads the first's memory and state.
    let logits = |m: &memzoo_stack::TransformerXl| {
        let mut state = XlState::new();
        let out: Vec<Tensor<3>> = (0..2)
            .map(|b| {
                let h = m
                    .forward_state(block(&x, b, w), &mut state, &vec![false; batch])
                    .unwrap();
                m.logits(h)
            })
            .collect();
        host(Tensor::cat(out, 1))
    };
    let want = r.floats("logits.0");
    check(&logits(&model), &want, "logits 0");
    let variants: Vec<(&str, ModelEdit)> = vec![
        (
            "no xPos",
            Box::new(|m| {
                for l in &mut m.layers {
                    l.attention
                        .relative_mut()
                        .unwrap()
                        .positions
                        .xpos_scale_base = None;
                }
            }),
        ),
        (
            "no qk-RMSNorm in the recurrent layer",
            Box::new(|m| m.layers[2].attention.relative_mut().unwrap().qk_norm = None),
        ),
        (
            "no qk-RMSNorm in the state's read",
            Box::new(|m| m.block_recurrent.as_mut().unwrap().read_qk_norm = None),
        ),
        (
            "the state read at the recurrent layer",
            Box::new(|m| m.block_recurrent.as_mut().unwrap().config.read_layer = None),
        ),
    ];
    assert_each_option_matters(&model, variants, logits, &want);
}

/// The import refuses what memzoo's stack cannot express, naming it; the stack refuses the
/// combinations it cannot compute.
#[test]
fn lucidrains_block_recurrent_refuses_what_it_cannot_express() {
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    let cfg: BlockRecurrentPeerConfig = serde_json::from_str(&text).unwrap();
    let stack = cfg.xl_config().unwrap();
    type Edit = fn(&mut BlockRecurrentPeerConfig);
    let edits: [(&str, Edit); 4] = [
        ("use_compressed_mem", |c| c.use_compressed_mem = true),
        ("max_seq_len", |c| c.max_seq_len = 6),
        ("recurrent_layers", |c| {
            c.recurrent_layers = Some(vec![2, 3])
        }),
        ("read_recurrent_layers", |c| {
            c.read_recurrent_layers = Some(vec![1, 2])
        }),
    ];
    for (name, edit) in edits {
        let mut c = cfg.clone();
        edit(&mut c);
        let err = c.xl_config().unwrap_err().to_string();
        assert!(err.contains(name), "{name}: {err}");
    }
    // The package's defaults: the recurrent layer in the middle, read there.
    let defaults: BlockRecurrentPeerConfig =
        serde_json::from_str(r#"{"num_tokens": 20, "dim": 16, "depth": 4}"#).unwrap();
    let d = defaults.xl_config().unwrap();
    let rec = d.block_recurrent.as_ref().unwrap();
    assert_eq!(
        (rec.layer, rec.read_layer, rec.bptt_segments, rec.state_len),
        (1, None, 2, 512)
    );
    // The stack's own refusals.
    let stack_err = |c: XlConfig| c.validate().unwrap_err().to_string();
    let mut bad = stack.clone();
    bad.block_recurrent.as_mut().unwrap().read_layer = Some(2 + 1);
    assert!(stack_err(bad).contains("block_recurrent.read_layer"));
    let mut bad = stack.clone();
    bad.block_recurrent.as_mut().unwrap().memory_replay = true;
    assert!(stack_err(bad).contains("memory_replay"));
    let bad = stack.clone().with_layers(vec![LayerKind::Xl; 3]);
    assert!(stack_err(bad).contains("qk_norm"));
    let bad = stack
        .clone()
        .with_block_recurrent(None)
        .with_qk_norm(Some(QkNormConfig::new()));
    assert!(stack_err(bad).contains("qk_norm.all_layers"));
}

/// Export writes what the import reads: the package's config and every tensor (the zero
/// `beta` buffers included), unchanged; a stack the package cannot express is refused naming
/// the field; the other formats refuse the package's layer options.
#[test]
fn lucidrains_block_recurrent_export_round_trips() {
    let dev = flex();
    let (model, cfg) = lucidrains_block_recurrent::load(&fixture(), &dev).unwrap();
    let stack = cfg.xl_config().unwrap();
    let format = memzoo_import::format("lucidrains-block-recurrent").unwrap();
    let dir = crate::import::scratch("block-recurrent-export");
    format.export(&model, &stack, &dir).unwrap();
    let (_, back) = lucidrains_block_recurrent::load(&dir, &dev).unwrap();
    assert_eq!(back.xl_config().unwrap().to_string(), stack.to_string());
    assert_eq!(back.layers().unwrap(), cfg.layers().unwrap());
    assert_same_tensors(
        &fixture().join("model.safetensors"),
        &dir.join("model.safetensors"),
    );
    let mut other = stack.clone();
    other.compat.norm_bias = true;
    let err = format.export(&model, &other, &dir).unwrap_err().to_string();
    assert!(err.contains("compat.norm_bias = true"), "{err}");
    let hf = memzoo_import::format("hf-transfo-xl").unwrap();
    let err = hf.export(&model, &stack, &dir).unwrap_err().to_string();
    assert!(err.contains("rotary layers"), "{err}");
}
