//! Checkpoint import from recurrent-memory-transformer-pytorch 0.7.0: its
//! `RecurrentMemoryTransformer` read into memzoo's RMT stack, compared with the package's own
//! run; and each layer option the import needs, alone, against a naive formula.
//!
//! The fixture (`tests/fixtures/lucidrains-rmt`) is a small random-weight model (3 layers, d 16,
//! 2 heads of 8, 3 memory tokens, segments of 4, GEGLU of width 42) run by the package itself
//! (`xtask/peers/fixtures/lucidrains_rmt.py`) over 4 segments through its wrapper with
//! `truncate_at_step = 2`: logits, losses and the written memories of every segment, and every
//! parameter's gradient of the wrapper's loss (truncated backpropagation through time, the
//! embedding's gradient scaled by 0.1). Float comparisons: `max |memzoo - package| <= 1e-4 ·
//! max(1, max |package|)` (`import::check`).

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Tensor, TensorData};
use memzoo_import::lucidrains_rmt::{self, rmt_to_peer};
use memzoo_import::mapping::Source;
use memzoo_relative::{
    AttentionMask, PeerAttentionParams, PositionConfig, PositionKind, RelativeAttentionConfig,
    RelativeContext,
};
use memzoo_stack::{
    Activation, LayerKind, Norm, NormKind, PeerCompat, RmtConfig, UnrollSegment, XlConfig, XlState,
};
use memzoo_tests::*;

use crate::import::{GradientMean, ModelEdit, Reference, assert_each_option_matters, check};

const SEGMENTS: usize = 4;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-rmt")
}

/// `max |got - want|` over two host vectors, printed (the report's numbers) and returned.
fn report(got: &[f32], want: &[f32], what: &str) -> f32 {
    let d = max_abs_diff(got, want);
    eprintln!("{what}: max |memzoo - package| = {d:e}");
    d
}

#[test]
fn lucidrains_rmt_matches_the_package() {
    matches_the_package(&fixture(), 1);
}

/// The same with the package's default 4 residual streams (hyper-connections).
#[test]
fn lucidrains_rmt_hyper_connections_match_the_package() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-rmt-hyper");
    matches_the_package(&dir, 4);
}

/// The fixture in `dir` (`streams` residual streams) against the package's run.
fn matches_the_package(dir: &Path, streams: usize) {
    let dev = flex();
    let (model, cfg) = lucidrains_rmt::load(dir, &dev).expect("import");
    assert_eq!(model.stack_family(), "rmt");
    assert_eq!(
        (
            cfg.depth,
            cfg.seq_len,
            cfg.num_memory_tokens,
            cfg.truncate_at_step,
            cfg.num_residual_streams
        ),
        (3, 4, 3, Some(2), streams)
    );
    let r = Reference::at(dir);
    let batch = r.data("input_ids.0").shape()[0];
    let reset = vec![false; batch];
    // Values: logits, losses and the written memories of every segment.
    let mut state = XlState::new();
    let (mut d_logits, mut d_mem) = (0.0f32, 0.0f32);
    for s in 0..SEGMENTS {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        let y = r.tokens::<2>(&format!("targets.{s}"), &dev);
        let logits = model.logits(model.forward_state(x, &mut state, &reset).unwrap());
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
        let mem = state.rmt.value.clone().expect("a written memory");
        let want = r.floats(&format!("memories.{s}"));
        check(&host(mem.clone()), &want, &format!("memories {s}"));
        d_mem = d_mem.max(report(&host(mem), &want, &format!("memories {s}")));
    }
    eprintln!("{streams} streams, max over segments: logits {d_logits:e}, memories {d_mem:e}");

    // Gradients: the wrapper's loss (1/4) Σ_s L_s with the memory detached after every
    // second segment is the mean of two unrolled steps of 2 segments, (1/2)(L_0 + L_1) and
    // (1/2)(L_2 + L_3).
    let ad = dev.autodiff();
    let (model, _) = lucidrains_rmt::load(dir, &ad).unwrap();
    let k = cfg.truncate_at_step.unwrap();
    assert_eq!(model.rmt_config().unwrap().bptt_segments, k);
    let mut state = XlState::new();
    let mut mean = GradientMean::default();
    let steps = SEGMENTS / k;
    for step in 0..steps {
        let segments = (step * k..(step + 1) * k)
            .map(|s| UnrollSegment {
                inputs: r.tokens::<2>(&format!("input_ids.{s}"), &ad),
                targets: r.tokens::<2>(&format!("targets.{s}"), &ad),
                reset: reset.clone(),
                weights: None,
            })
            .collect();
        let (loss, grads) = model.train_unroll(segments, &mut state).unwrap();
        let grads = rmt_to_peer(&model, Source::Gradients(&grads));
        mean.add(loss.into_scalar::<f64>(), grads, steps);
    }
    let (d_loss, d_grad) = mean.check(&r);
    eprintln!(
        "{streams} streams, the wrapper's loss within {d_loss:e}, every gradient within {d_grad:e}"
    );
}

/// Without each of the package's options the import is another function: the parity test
/// above would fail if any one were switched back.
#[test]
fn lucidrains_rmt_options_each_change_the_function() {
    let dev = flex();
    let (model, _) = lucidrains_rmt::load(&fixture(), &dev).unwrap();
    let r = Reference::at(&fixture());
    let x = r.tokens::<2>("input_ids.0", &dev);
    let batch = x.dims()[0];
    let logits = |m: &memzoo_stack::TransformerXl| {
        let h = m
            .forward_state(x.clone(), &mut XlState::new(), &vec![false; batch])
            .unwrap();
        host(m.logits(h))
    };
    let want = r.floats("logits.0");
    check(&logits(&model), &want, "logits 0");
    let peer = |m: &mut memzoo_stack::TransformerXl, edit: &dyn Fn(&mut PeerAttentionParams)| {
        for layer in &mut m.layers {
            edit(
                layer
                    .attention
                    .relative_mut()
                    .unwrap()
                    .peer
                    .as_mut()
                    .unwrap(),
            );
        }
    };
    let variants: Vec<(&str, ModelEdit)> = vec![
        (
            "LayerNorm",
            Box::new(|m| {
                for layer in &mut m.layers {
                    for n in [&mut layer.block.norm_attention, &mut layer.block.norm_ff] {
                        n.kind = NormKind::Layer;
                        n.beta = Some(Param::from_tensor(n.gamma.val().zeros_like()));
                    }
                }
            }),
        ),
        (
            "no null key/value",
            Box::new(move |m| peer(m, &|p| p.null_kv = None)),
        ),
        (
            "no value residual",
            Box::new(move |m| peer(m, &|p| p.value_gate = None)),
        ),
        (
            "causal memory",
            Box::new(|m| m.rmt.as_mut().unwrap().config.causal_memory = true),
        ),
        ("sinusoids", Box::new(|m| m.position_embedding = None)),
    ];
    assert_each_option_matters(&model, variants, logits, &want);
}

/// The import refuses what memzoo's stack cannot express, naming it.
#[test]
fn lucidrains_rmt_refuses_what_it_cannot_express() {
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    let cfg: memzoo_import::RmtPeerConfig = serde_json::from_str(&text).unwrap();
    assert!(cfg.xl_config().is_ok());
    type Edit = fn(&mut memzoo_import::RmtPeerConfig);
    let edits: [(&str, Edit); 5] = [
        ("use_xl_memories", |c| c.use_xl_memories = true),
        ("num_residual_streams", |c| c.num_residual_streams = 0),
        ("rotary_pos_emb", |c| c.rotary_pos_emb = true),
        ("memory_not_causal", |c| c.memory_not_causal = false),
        ("add_write_to_next_write_mem", |c| {
            c.add_write_to_next_write_mem = true
        }),
    ];
    for (name, edit) in edits {
        let mut c: memzoo_import::RmtPeerConfig = cfg.clone();
        edit(&mut c);
        let err = c.xl_config().unwrap_err().to_string();
        assert!(err.contains(name), "{name}: {err}");
    }
    // The package's default XL memories are refused too.
    let defaults: memzoo_import::RmtPeerConfig = serde_json::from_str(
        r#"{"dim": 16, "num_tokens": 20, "depth": 2, "num_memory_tokens": 2, "seq_len": 4}"#,
    )
    .unwrap();
    let err = defaults.xl_config().unwrap_err().to_string();
    assert!(err.contains("use_xl_memories"), "{err}");
}

/// Export writes what the import reads: the package's config and every tensor, unchanged; a
/// stack the package cannot express is refused naming the field; the other formats refuse
/// the RMT's layer options.
#[test]
fn lucidrains_rmt_export_round_trips() {
    let dev = flex();
    let (model, cfg) = lucidrains_rmt::load(&fixture(), &dev).unwrap();
    let stack = cfg.xl_config().unwrap();
    let format = memzoo_import::format("lucidrains-rmt").unwrap();
    let dir = crate::import::scratch("rmt-export");
    format.export(&model, &stack, &dir).unwrap();
    let (_, back) = lucidrains_rmt::load(&dir, &dev).unwrap();
    assert_eq!(back, cfg);
    assert_same_tensors(
        &fixture().join("model.safetensors"),
        &dir.join("model.safetensors"),
    );
    // The hyper-connections' fixture (0-d scales) round-trips too.
    let hyper = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-rmt-hyper");
    let (hmodel, hcfg) = lucidrains_rmt::load(&hyper, &dev).unwrap();
    let hdir = crate::import::scratch("rmt-hyper-export");
    format
        .export(&hmodel, &hcfg.xl_config().unwrap(), &hdir)
        .unwrap();
    assert_same_tensors(
        &hyper.join("model.safetensors"),
        &hdir.join("model.safetensors"),
    );
    let err = format
        .export(&model, &stack.clone().with_norm(NormKind::Layer), &dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("norm other than rms"), "{err}");
    let hf = memzoo_import::format("hf-transfo-xl").unwrap();
    let err = hf.export(&model, &stack, &dir).unwrap_err().to_string();
    assert!(err.contains("norm = \"rms\""), "{err}");
}

// ---------------------------------------------------------------------------------------
// Each option alone against a naive formula.

/// RMSNorm: `x / sqrt(mean(x²) + eps) γ`, no bias; LayerNorm unchanged.
#[test]
fn rms_norm_matches_naive() {
    let dev = flex();
    let x = randn([2, 3, 8], 1, &dev);
    let mut norm = Norm::new(NormKind::Rms, 8, 1e-6, burn::nn::Initializer::Ones, &dev);
    norm.gamma = Param::from_tensor(randn([8], 2, &dev));
    assert!(norm.beta.is_none());
    let got = host(norm.forward(x.clone()));
    let (xs, g) = (host(x), host(norm.gamma.val()));
    let mut want = Vec::new();
    for row in xs.chunks(8) {
        let ms: f64 = row.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / 8.0;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        want.extend(
            row.iter()
                .zip(&g)
                .map(|(v, g)| (f64::from(*v) * inv) as f32 * g),
        );
    }
    assert_close(&got, &want, 1e-5, "RMSNorm");
}

/// `erf` by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    y.copysign(x)
}

/// A GEGLU feed-forward without biases: `W_2 (a · gelu(g))`, `[a, g] = W_1 x`, `d_inner` wide
/// halves.
#[test]
fn geglu_feed_forward_matches_naive() {
    let dev = flex();
    let cfg = XlConfig::new()
        .with_d_model(8)
        .with_d_inner(6)
        .with_n_heads(2)
        .with_dropout(0.0)
        .with_ff_activation(Activation::Geglu)
        .with_compat(PeerCompat::new().with_ff_bias(false));
    let block = cfg.init_block(&dev);
    assert_eq!(block.ff_in.weight.dims(), [8, 12]);
    assert_eq!(block.ff_out.weight.dims(), [6, 8]);
    assert!(block.ff_in.bias.is_none() && block.ff_out.bias.is_none());
    let x = randn([1, 3, 8], 3, &dev);
    let got = host(block.feed_forward(x.clone()));
    let w1 = Mat::from_tensor(block.ff_in.weight.val());
    let w2 = Mat::from_tensor(block.ff_out.weight.val());
    let xm = Mat::from_tensor(x.reshape([3, 8]));
    let h = xm.matmul(&w1);
    let mut want = Vec::new();
    for i in 0..3 {
        let act: Vec<f64> = (0..6)
            .map(|j| {
                let (a, g) = (h.at(i, j), h.at(i, 6 + j));
                a * g * 0.5 * (1.0 + erf(g / 2f64.sqrt()))
            })
            .collect();
        for o in 0..8 {
            let v: f64 = (0..6).map(|j| act[j] * w2.at(j, o)).sum();
            want.push(v as f32);
        }
    }
    assert_close(&got, &want, 1e-5, "GEGLU");
}

/// Absolute attention with a null key/value, and a second layer mixing in the first layer's
/// values by its gate: `softmax(s q·[k_0, k_j]) [v_0, v_j]` with
/// `v_j ← v_j + σ(W_g x_j)_h (v1_j − v_j)`, against loops over the heads.
#[test]
fn null_key_value_and_value_residual_match_naive() {
    let dev = flex();
    let (d, h, dh, n) = (8, 2, 4, 5);
    let base = RelativeAttentionConfig::new(d, h, dh)
        .with_positions(PositionConfig::new().with_kind(PositionKind::Absolute))
        .with_null_key_value(true)
        .with_initializer(burn::nn::Initializer::Normal {
            mean: 0.0,
            std: 0.5,
        });
    let first = base.init(&dev).unwrap();
    let second = base.clone().with_value_gate(true).init(&dev).unwrap();
    // A mask that hides some keys (the RMT's is explicit).
    let hidden: Vec<bool> = (0..n * n).map(|ij| ij % n > ij / n).collect();
    let mask = AttentionMask::Explicit(Tensor::from_data(
        TensorData::new(hidden.clone(), [1, n, n]),
        &dev,
    ));
    let ctx = RelativeContext::new(
        &PositionConfig::new().with_kind(PositionKind::Absolute),
        d,
        n,
        0,
        &mask,
        &dev,
    )
    .with_value_residual();
    let x1 = randn([1, n, d], 4, &dev);
    let x2 = randn([1, n, d], 5, &dev);
    let out1 = host(first.forward(x1.clone(), None, &ctx, None).unwrap());
    let out2 = host(second.forward(x2.clone(), None, &ctx, None).unwrap());
    // Without a value residual in the context a gated layer is refused.
    let plain = RelativeContext::new(
        &PositionConfig::new().with_kind(PositionKind::Absolute),
        d,
        n,
        0,
        &mask,
        &dev,
    );
    assert!(second.forward(x2.clone(), None, &plain, None).is_err());

    let naive = |a: &memzoo_relative::RelativeMultiHeadAttention,
                 x: &Tensor<3>,
                 v1: Option<&Mat>|
     -> (Vec<f32>, Mat, Vec<f32>) {
        let xm = Mat::from_tensor(x.clone().reshape([n, d]));
        let q = xm.matmul(&Mat::from_tensor(a.query.weight.val()));
        let kv = xm.matmul(&Mat::from_tensor(a.key_value.weight.val()));
        let peer = a.peer.as_ref().unwrap();
        let null = host(peer.null_kv.as_ref().unwrap().val());
        let gate = peer
            .value_gate
            .as_ref()
            .map(|g| xm.matmul(&Mat::from_tensor(g.weight.val())));
        // v (own), then mixed.
        let v: Vec<Vec<f64>> = (0..n)
            .map(|j| {
                (0..h * dh)
                    .map(|c| {
                        let own = kv.at(j, h * dh + c);
                        match (&gate, v1) {
                            (Some(g), Some(v1)) => {
                                let s = 1.0 / (1.0 + (-g.at(j, c / dh)).exp());
                                own + s * (v1.at(j, c) - own)
                            }
                            _ => own,
                        }
                    })
                    .collect()
            })
            .collect();
        let own_v = rows(
            (0..n)
                .map(|j| (0..h * dh).map(|c| kv.at(j, h * dh + c)).collect())
                .collect(),
        );
        let mut ctxv = vec![0.0f64; n * h * dh];
        // The mass on the real keys, per head and query.
        let mut real = vec![0.0f32; h * n];
        for head in 0..h {
            let cols = head * dh..(head + 1) * dh;
            let nk: Vec<f64> = (0..dh).map(|e| f64::from(null[head * dh + e])).collect();
            let nv: Vec<f64> = (0..dh)
                .map(|e| f64::from(null[h * dh + head * dh + e]))
                .collect();
            for i in 0..n {
                let qi: Vec<f64> = cols.clone().map(|c| q.at(i, c)).collect();
                let mut scores = vec![Some(dot(&qi, &nk) / (dh as f64).sqrt())];
                for j in 0..n {
                    let kj: Vec<f64> = cols.clone().map(|c| kv.at(j, c)).collect();
                    scores.push((!hidden[i * n + j]).then(|| dot(&qi, &kj) / (dh as f64).sqrt()));
                }
                let p = masked_softmax(&scores);
                real[head * n + i] = (1.0 - p[0]) as f32;
                for e in 0..dh {
                    let mut acc = p[0] * nv[e];
                    for j in 0..n {
                        acc += p[1 + j] * v[j][head * dh + e];
                    }
                    ctxv[i * h * dh + head * dh + e] = acc;
                }
            }
        }
        let c = rows(ctxv.chunks(h * dh).map(|r| r.to_vec()).collect());
        let out = c.matmul(&Mat::from_tensor(a.output.weight.val()));
        let out: Vec<f32> = (0..n)
            .flat_map(|i| (0..d).map(move |o| (i, o)))
            .map(|(i, o)| out.at(i, o) as f32)
            .collect();
        (out, own_v, real)
    };
    let (want1, v1, real) = naive(&first, &x1, None);
    // `memzoo inspect`'s probabilities: the real keys' share, the rest on the null key.
    let probs = first.probabilities(x1.clone(), None, &plain, None).unwrap();
    assert_close(
        &host(probs.sum_dim(3)),
        &real,
        1e-5,
        "probabilities beside the null key",
    );
    assert_close(&out1, &want1, 1e-5, "null key/value");
    let (want2, _, _) = naive(&second, &x2, Some(&v1));
    assert_close(&out2, &want2, 1e-5, "value residual");
}

/// Learned absolute positions add rows `0..len` of their table; the embedding's gradient is
/// scaled by `embedding_gradient_scale`, the forward pass unchanged.
#[test]
fn learned_positions_and_embedding_gradient_scale() {
    let dev = flex().autodiff();
    let cfg = XlConfig::new()
        .with_vocab_size(12)
        .with_d_model(8)
        .with_n_layers(2)
        .with_n_heads(2)
        .with_d_inner(16)
        .with_mem_len(0)
        .with_dropout(0.0)
        .with_pre_ln(true)
        .with_layers(vec![LayerKind::Absolute; 2])
        .with_positions(PositionConfig::new().with_kind(PositionKind::Absolute))
        .with_scale_embedding(false)
        .with_learned_positions(Some(6));
    let model = cfg.init(&dev).unwrap();
    let tokens = Tensor::<2, burn::tensor::Int>::from_data(
        TensorData::new(vec![1i64, 4, 7, 2], [1, 4]),
        &dev,
    );
    let hidden = |m: &memzoo_stack::TransformerXl| {
        m.forward_state(tokens.clone(), &mut XlState::new(), &[false])
            .unwrap()
    };
    // The embedding: token rows plus position rows 0..4 (read through a one-layer-free probe:
    // the same model with the positions zeroed differs by exactly the positions' effect).
    let table = model.position_embedding.as_ref().unwrap().weight.val();
    assert_eq!(table.dims(), [6, 8]);
    let scaled = {
        let mut c = cfg.clone();
        c.compat = c.compat.clone().with_embedding_gradient_scale(0.1);
        same_weights(&model, c.init(&dev).unwrap())
    };
    let (h1, h2) = (hidden(&model), hidden(&scaled));
    assert_close(
        &host(h1.clone()),
        &host(h2.clone()),
        1e-6,
        "forward unchanged",
    );
    let g1 = h1.sum().backward();
    let g2 = h2.sum().backward();
    let e1 = model.embedding.plain().unwrap().weight.grad(&g1).unwrap();
    let e2 = scaled.embedding.plain().unwrap().weight.grad(&g2).unwrap();
    let p2 = scaled
        .position_embedding
        .as_ref()
        .unwrap()
        .weight
        .grad(&g2)
        .unwrap();
    let p1 = model
        .position_embedding
        .as_ref()
        .unwrap()
        .weight
        .grad(&g1)
        .unwrap();
    let tenth = |v: Vec<f32>| v.into_iter().map(|x| x * 0.1).collect::<Vec<_>>();
    // (`check`: within 1e-4 of the largest; the two passes round differently.)
    check(&host(e2), &tenth(host(e1)), "token table gradient x 0.1");
    let (p1, p2) = (host(p1), host(p2));
    check(&p2, &tenth(p1.clone()), "position table gradient x 0.1");
    // Rows 4 and 5 are not read by a segment of 4.
    assert!(p1[4 * 8..].iter().all(|v| *v == 0.0));
    assert!(p1[..4 * 8].iter().any(|v| *v != 0.0));
    // A longer segment than the table is an error naming it.
    let long = Tensor::<2, burn::tensor::Int>::zeros([1, 7], &dev);
    let err = model
        .forward_state(long, &mut XlState::new(), &[false])
        .unwrap_err()
        .to_string();
    assert!(err.contains("learned_positions"), "{err}");
}

/// The fixture's `config.json`.
fn cfg_of_fixture() -> memzoo_import::RmtPeerConfig {
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A host matrix of `rows`.
fn rows(rows: Vec<Vec<f64>>) -> Mat {
    Mat {
        rows: rows.len(),
        cols: rows.first().map_or(0, Vec::len),
        data: rows.concat(),
    }
}

/// `other` with `from`'s parameters (the same architecture).
pub(crate) fn same_weights(
    from: &memzoo_stack::TransformerXl,
    other: memzoo_stack::TransformerXl,
) -> memzoo_stack::TransformerXl {
    use burn::module::Module;
    other.load_record(from.clone().into_record())
}

/// Invalid combinations are refused in validation, naming the field.
#[test]
fn rmt_layer_options_refuse_invalid_combinations() {
    let stack = |compat: PeerCompat| {
        XlConfig::new()
            .with_n_layers(2)
            .with_d_model(16)
            .with_n_heads(2)
            .with_mem_len(0)
            .with_pre_ln(true)
            .with_layers(vec![LayerKind::Absolute; 2])
            .with_positions(PositionConfig::new().with_kind(PositionKind::Absolute))
            .with_compat(compat)
    };
    assert!(
        stack(
            PeerCompat::new()
                .with_null_key_value(true)
                .with_value_residual(true)
        )
        .validate()
        .is_ok()
    );
    let cases: Vec<(XlConfig, &str)> = vec![
        (
            stack(PeerCompat::new().with_null_key_value(true))
                .with_layers(vec![LayerKind::Xl; 2])
                .with_positions(PositionConfig::new()),
            "compat.null_key_value",
        ),
        (
            stack(PeerCompat::new().with_value_residual(true)).with_mem_len(4),
            "mem_len must be 0",
        ),
        (
            stack(PeerCompat::new().with_value_residual(true)).with_kv_heads(Some(1)),
            "kv_heads",
        ),
        (
            stack(PeerCompat::new().with_embedding_gradient_scale(1.5)),
            "embedding_gradient_scale",
        ),
        (
            stack(PeerCompat::new())
                .with_layers(vec![LayerKind::Xl; 2])
                .with_positions(PositionConfig::new())
                .with_learned_positions(Some(8)),
            "learned_positions",
        ),
        (
            stack(PeerCompat::new()).with_learned_positions(Some(0)),
            "learned_positions must be positive",
        ),
        (
            stack(PeerCompat::new()).with_residual_streams(0),
            "residual_streams must be positive",
        ),
        (
            stack(PeerCompat::new())
                .with_residual_streams(4)
                .with_mem_len(8)
                .with_layers(vec![LayerKind::Xl; 2])
                .with_positions(PositionConfig::new()),
            "mem_len = 8",
        ),
        (
            stack(PeerCompat::new())
                .with_residual_streams(4)
                .with_pre_ln(false),
            "pre_ln = false",
        ),
        (
            stack(PeerCompat::new())
                .with_ff_activation(Activation::Geglu)
                .with_block_recurrent(Some(
                    memzoo_stack::BlockRecurrentConfig::new().with_state_ff(true),
                )),
            "geglu",
        ),
    ];
    for (cfg, needle) in cases {
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // Defaults are unchanged: a plain stack has none of these.
    let plain = XlConfig::new();
    assert_eq!(plain.norm, NormKind::Layer);
    assert_eq!(plain.ff_activation, Activation::Relu);
    assert!(plain.learned_positions.is_none() && plain.residual_streams == 1);
    let c = &plain.compat;
    assert!(c.ff_bias && !c.null_key_value && !c.value_residual);
    assert_eq!(c.embedding_gradient_scale, 1.0);
    let _ = RmtConfig::new();
}

/// `memzoo import --from lucidrains-rmt` writes a run directory whose model (read back as
/// `memzoo eval` and `generate` read it) gives the package's logits over the fixture's
/// segments, with segments as long as its learned positions; `train --resume` fine-tunes it.
#[test]
fn lucidrains_rmt_imports_into_a_run_dir() {
    let tmp = crate::import::scratch("rmt-run");
    // Bytes below the fixture's vocabulary of 20.
    let text: String = (0..4000u32)
        .map(|i| char::from(1 + (i * 7 % 19) as u8))
        .collect();
    let run = import_with_data("lucidrains-rmt", &fixture(), &tmp, text);
    let dev = flex();
    let (config, model) = memzoo::commands::load_xl(&run, &dev).unwrap();
    assert_eq!(config.family(), "rmt");
    assert_eq!(config.train.tgt_len, 4, "the package's seq_len");
    let r = Reference::at(&fixture());
    let batch = r.data("input_ids.0").shape()[0];
    let mut state = XlState::new();
    for s in 0..SEGMENTS {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        let h = model
            .forward_state(x, &mut state, &vec![false; batch])
            .unwrap();
        check(
            &host(model.logits(h)),
            &r.floats(&format!("logits.{s}")),
            &format!("run dir: logits {s}"),
        );
    }
    // `memzoo eval` and `generate` read it (memory tokens carried, segments of 4).
    memzoo::commands::eval(&run, "flex", "test", None, None, Some(5), true).unwrap();
    let mut sampling = generate_options("\u{1}\u{2}\u{3}", 10);
    sampling.compare_recompute = true;
    memzoo::commands::generate(&run, "flex", &sampling, true).unwrap();
    fine_tune_two_steps(&run, &["train.batch=2"]);
    // The fine-tuned run exports and imports back.
    let out = tmp.join("export");
    memzoo::import::export("lucidrains-rmt", &run, &out, &dev, true).unwrap();
    let (_, back) = lucidrains_rmt::load(&out, &dev).unwrap();
    assert_eq!(back, cfg_of_fixture());
    // A longer segment than the learned positions is refused by name.
    let long = memzoo::config::RunConfig::resolve(
        Some(&run.join("config.toml")),
        &["train.tgt_len=8".into()],
    )
    .unwrap()
    .validate()
    .unwrap_err()
    .to_string();
    assert!(long.contains("learned_positions"), "{long}");
    // With hyper-connections: the run's config.toml keeps the 4 streams.
    std::fs::create_dir_all(tmp.join("hyper")).unwrap();
    let hyper = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-rmt-hyper");
    let run = import_with_data(
        "lucidrains-rmt",
        &hyper,
        &tmp.join("hyper"),
        "\u{1}\u{2}".repeat(2000),
    );
    let (config, model) = memzoo::commands::load_xl(&run, &dev).unwrap();
    assert_eq!(config.model.residual_streams, 4);
    let r = Reference::at(&hyper);
    let x = r.tokens::<2>("input_ids.0", &dev);
    let h = model
        .forward_state(x, &mut XlState::new(), &vec![false; batch])
        .unwrap();
    check(
        &host(model.logits(h)),
        &r.floats("logits.0"),
        "hyper run dir: logits 0",
    );
    std::fs::remove_dir_all(&tmp).ok();
}

/// Hyper-connections around a branch `f`, against loops: `H̄ = normalize(H) sqrt(d) (γ + 1)`,
/// `A = tanh(H̄ W_α) a + A_0`, `B = tanh(H̄ w_β) b + B_0`, `[x ; H'] = Aᵀ H`,
/// `H ← B f(x) + H'`; expanding to `s` streams and summing them back.
#[test]
fn hyper_connections_match_naive() {
    let dev = flex();
    let (s, d, n) = (3, 4, 2);
    let scalar =
        |v: f32| Param::from_tensor(Tensor::from_data(TensorData::new(vec![v], [1]), &dev));
    let mut hc = memzoo_stack::HyperConnection::new(s, d, 1, &dev);
    hc.gamma = Param::from_tensor(randn([d], 1, &dev).mul_scalar(0.3));
    let noise = randn([s, 1 + s], 2, &dev).mul_scalar(0.3);
    hc.static_alpha = Param::from_tensor(hc.static_alpha.val() + noise);
    hc.dynamic_alpha = Param::from_tensor(randn([d, 1 + s], 3, &dev).mul_scalar(0.5));
    hc.dynamic_alpha_scale = scalar(0.7);
    hc.static_beta = Param::from_tensor(randn([s], 4, &dev).add_scalar(1.0));
    hc.dynamic_beta = Param::from_tensor(randn([d], 5, &dev).mul_scalar(0.5));
    hc.dynamic_beta_scale = scalar(0.4);
    let h = randn([1, n, s * d], 6, &dev);
    let (x, state) = hc.width(h.clone());
    // f(x) = 2x + 1, a stand-in branch.
    let got = host(hc.depth(x.clone().mul_scalar(2.0).add_scalar(1.0), state));
    let got_x = host(x);

    let hv = host(h);
    let gamma = host(hc.gamma.val());
    let (sa, da) = (host(hc.static_alpha.val()), host(hc.dynamic_alpha.val()));
    let (sb, db) = (host(hc.static_beta.val()), host(hc.dynamic_beta.val()));
    let (a_scale, b_scale) = (0.7f32, 0.4f32);
    let (mut want, mut want_x) = (Vec::new(), Vec::new());
    for i in 0..n {
        let stream = |k: usize| &hv[i * s * d + k * d..i * s * d + (k + 1) * d];
        let mut alpha = vec![vec![0.0f32; 1 + s]; s];
        let mut beta = vec![0.0f32; s];
        for k in 0..s {
            let v = stream(k);
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            let normed: Vec<f32> = v
                .iter()
                .zip(&gamma)
                .map(|(x, g)| x / norm * (d as f32).sqrt() * (g + 1.0))
                .collect();
            for (t, a) in alpha[k].iter_mut().enumerate() {
                let z: f32 = (0..d).map(|e| normed[e] * da[e * (1 + s) + t]).sum();
                *a = z.tanh() * a_scale + sa[k * (1 + s) + t];
            }
            let z: f32 = normed.iter().zip(&db).map(|(a, b)| a * b).sum();
            beta[k] = z.tanh() * b_scale + sb[k];
        }
        let mixed = |t: usize, e: usize| (0..s).map(|k| alpha[k][t] * stream(k)[e]).sum::<f32>();
        let x: Vec<f32> = (0..d).map(|e| mixed(0, e)).collect();
        want_x.extend(&x);
        for (k, b) in beta.iter().enumerate() {
            for (e, xe) in x.iter().enumerate() {
                want.push(b * (2.0 * xe + 1.0) + mixed(1 + k, e));
            }
        }
    }
    assert_close(&got_x, &want_x, 1e-5, "branch input");
    assert_close(&got, &want, 1e-5, "streams after the branch");
    let e = randn([1, n, d], 7, &dev);
    let round = memzoo_stack::reduce_streams(memzoo_stack::expand_streams(e.clone(), s), s);
    let want = host(e.mul_scalar(s as f32));
    assert_close(&host(round), &want, 1e-6, "expand, reduce");
}
