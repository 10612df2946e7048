//! The Block-Recurrent Transformer in the stack: its invalid combinations refused by name, one
//! recurrent step against a naive host implementation of the paper's equations (both gates,
//! with and without the state's feed-forward), its state carried over segments against a naive
//! host replay, reset and checkpointed, and its backpropagation through `k` blocks checked
//! against finite differences.

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::tensor::{Int, Tensor, TensorData};
use memzoo_stack::{
    Activation, BlockRecurrent, BlockRecurrentConfig, GateKind, LayerKind, Residual, RmtConfig,
    StateGate, TransformerXl, UnrollSegment, XlConfig, XlState,
};
use memzoo_tests::*;
use memzoo_train::SegmentModel;

const D: usize = 16;
const HEADS: usize = 2;
const S: usize = 3;

fn recurrent(gate: GateKind, state_ff: bool, layer: usize) -> BlockRecurrentConfig {
    BlockRecurrentConfig::new()
        .with_state_len(S)
        .with_layer(layer)
        .with_gate(gate)
        .with_state_ff(state_ff)
}

fn tiny() -> XlConfig {
    tiny_stack()
        .with_mem_len(4)
        .with_document_resets(true)
        .with_block_recurrent(Some(recurrent(GateKind::Fixed, true, 1)))
}

fn tokens(batch: usize, len: usize, seed: usize) -> Tensor<2, Int> {
    let data: Vec<i64> = (0..batch * len)
        .map(|i| ((i * 37 + seed * 101 + 11) % 256) as i64)
        .collect();
    Tensor::from_data(TensorData::new(data, [batch, len]), &flex())
}

/// A model of `cfg` with every weight drawn from a seeded host generator at scale 0.3 (so the
/// attention is not uniform), and every bias and the fixed gates' `b_g` too (they start at 0).
fn model_of(cfg: &XlConfig, seed: u64, dev: &burn::tensor::Device) -> TransformerXl {
    let dev = dev.clone();
    let model = seeded_weights(cfg.init(&dev).unwrap(), seed, |p: &str| {
        if p.ends_with("gamma") { 0.1 } else { 0.3 }
    });
    let mut model = model;
    let rec = model.block_recurrent.as_mut().unwrap();
    let mut k = 0;
    let mut shift = |g: &mut StateGate| {
        k += 1;
        if let Some(b) = g.bias.as_mut() {
            *b = Param::from_tensor(randn([D], seed + k, &dev).mul_scalar(0.5));
        }
        for l in [Some(&mut g.candidate), g.input.as_mut(), g.forget.as_mut()]
            .into_iter()
            .flatten()
        {
            l.bias = Some(Param::from_tensor(
                randn([D], seed + 10 + k, &dev).mul_scalar(0.3),
            ));
        }
    };
    shift(&mut rec.attention_gate);
    if let Some(ff) = rec.ff.as_mut() {
        shift(&mut ff.gate);
    }
    model
}

#[test]
fn block_recurrent_refuses_invalid_combinations_by_name() {
    let dev = flex();
    let err = |c: XlConfig| c.init(&dev).unwrap_err().to_string();
    let with = |r: BlockRecurrentConfig| tiny().with_block_recurrent(Some(r));
    assert!(err(with(recurrent(GateKind::Fixed, true, 2))).contains("block_recurrent.layer (2)"));
    assert!(err(with(recurrent(GateKind::Lstm, true, 0).with_state_len(0))).contains("state_len"));
    assert!(
        err(with(
            recurrent(GateKind::Fixed, false, 0).with_bptt_segments(0)
        ))
        .contains("block_recurrent.bptt_segments")
    );
    assert!(err(tiny().with_residual(Residual::Reversible)).contains("Reversible"));
    assert!(err(tiny().with_layers(vec![LayerKind::Xl, LayerKind::Local])).contains("Local"));
    assert!(err(tiny().with_layers(vec![LayerKind::Lsh, LayerKind::Xl])).contains("Lsh"));
    assert!(err(tiny().with_mem_len(0).with_rmt(Some(RmtConfig::new()))).contains("rmt"));
    let m = tiny().init(&dev).unwrap();
    assert_eq!(m.stack_family(), "block-recurrent");
    assert_eq!(tiny().family(), "block-recurrent");
    // The plain forward has no place for the state.
    let e = m
        .forward(tokens(1, 4, 0), &memzoo_stack::XlMemory::empty())
        .unwrap_err();
    assert!(e.to_string().contains("block-recurrent"), "{e}");
}

// ---- A naive host implementation of one recurrent step (one row). ----

fn v(t: Tensor<1>) -> Vec<f32> {
    host(t)
}

/// `x W + b`, `x` of `rows` rows.
fn lin(l: &Linear, x: &[f32], rows: usize) -> Vec<f32> {
    let [i, o] = l.weight.dims();
    let w = host(l.weight.val());
    let b = l.bias.as_ref().map(|b| v(b.val()));
    let mut y = vec![0f32; rows * o];
    for r in 0..rows {
        for c in 0..o {
            let mut s = b.as_ref().map_or(0.0, |b| b[c]);
            for k in 0..i {
                s += x[r * i + k] * w[k * o + c];
            }
            y[r * o + c] = s;
        }
    }
    y
}

fn norm(n: &LayerNorm, x: &[f32], rows: usize) -> Vec<f32> {
    let (g, b) = (v(n.gamma.val()), v(n.beta.as_ref().unwrap().val()));
    let d = g.len();
    let mut y = vec![0f32; x.len()];
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / d as f32;
        for c in 0..d {
            y[r * d + c] = (row[c] - mean) / (var + 1e-5).sqrt() * g[c] + b[c];
        }
    }
    y
}

/// Per head, `softmax(q kᵀ / sqrt(dh)) v`; `q` `[n, H dh]`, `k`, `v` `[m, H dh]`.
fn mha(q: &[f32], k: &[f32], val: &[f32], n: usize, m: usize) -> Vec<f32> {
    let dh = D / HEADS;
    let w = HEADS * dh;
    let mut out = vec![0f32; n * w];
    for h in 0..HEADS {
        for i in 0..n {
            let s: Vec<f32> = (0..m)
                .map(|j| {
                    (0..dh)
                        .map(|c| q[i * w + h * dh + c] * k[j * w + h * dh + c])
                        .sum::<f32>()
                        / (dh as f32).sqrt()
                })
                .collect();
            let max = s.iter().cloned().fold(f32::MIN, f32::max);
            let e: Vec<f32> = s.iter().map(|a| (a - max).exp()).collect();
            let z: f32 = e.iter().sum();
            for j in 0..m {
                for c in 0..dh {
                    out[i * w + h * dh + c] += e[j] / z * val[j * w + h * dh + c];
                }
            }
        }
    }
    out
}

fn sigmoid(a: f32) -> f32 {
    1.0 / (1.0 + (-a).exp())
}

/// Hutchins et al. sec. 3.2: fixed `c g + z (1 - g)`, LSTM `c f + tanh(z) i`.
fn gate(g: &StateGate, c: &[f32], h: &[f32]) -> Vec<f32> {
    let z = lin(&g.candidate, h, S);
    match (&g.bias, &g.input, &g.forget) {
        (_, Some(wi), Some(wf)) => {
            let (i, f) = (lin(wi, h, S), lin(wf, h, S));
            (0..c.len())
                .map(|e| c[e] * sigmoid(f[e] + 1.0) + z[e].tanh() * sigmoid(i[e] - 1.0))
                .collect()
        }
        (Some(b), _, _) => {
            let b = v(b.val());
            (0..c.len())
                .map(|e| {
                    let g = sigmoid(b[e % D]);
                    c[e] * g + z[e] * (1.0 - g)
                })
                .collect()
        }
        _ => unreachable!(),
    }
}

/// One recurrent step of one row: `x` `[n, D]`, `kx`, `vx` `[n, H dh]`, `c` `[S, D]` → (what
/// the tokens read, `[n, D]`; the next state, `[S, D]`).
fn naive_step(
    r: &BlockRecurrent,
    x: &[f32],
    kx: &[f32],
    vx: &[f32],
    c: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let n = x.len() / D;
    let ids = host(r.state_ids.val());
    let hat: Vec<f32> = norm(&r.state_norm, c, S)
        .iter()
        .zip(&ids)
        .map(|(a, b)| a + b)
        .collect();
    let kv = lin(&r.state_key_value, &hat, S);
    let w = D; // heads x d_head
    let kc: Vec<f32> = (0..S)
        .flat_map(|j| kv[j * 2 * w..j * 2 * w + w].to_vec())
        .collect();
    let vc: Vec<f32> = (0..S)
        .flat_map(|j| kv[j * 2 * w + w..(j + 1) * 2 * w].to_vec())
        .collect();
    let q = lin(&r.to_state_query, x, n);
    let read = lin(&r.to_state_output, &mha(&q, &kc, &vc, n, S), n);
    let own = mha(&lin(&r.state_query, &hat, S), &kc, &vc, S, S);
    let cross = mha(&lin(&r.from_state_query, &hat, S), kx, vx, S, n);
    let cat: Vec<f32> = (0..S)
        .flat_map(|j| [&own[j * w..(j + 1) * w], &cross[j * w..(j + 1) * w]].concat())
        .collect();
    let h = lin(&r.state_output, &cat, S);
    let mut next = gate(&r.attention_gate, c, &h);
    if let Some(ff) = &r.ff {
        let inner = lin(&ff.ff_in, &norm(&ff.norm, &next, S), S);
        let inner: Vec<f32> = inner.iter().map(|a| a.max(0.0)).collect();
        let out = lin(&ff.ff_out, &inner, S);
        next = gate(&ff.gate, &next, &out);
    }
    (read, next)
}

fn rows(t: &[f32], batch: usize) -> Vec<&[f32]> {
    let per = t.len() / batch;
    (0..batch).map(|b| &t[b * per..(b + 1) * per]).collect()
}

/// One recurrent step ([`BlockRecurrent::step`]) equals the naive host implementation of the
/// paper's equations, for both gates, with and without the state's feed-forward.
#[test]
fn block_recurrent_step_matches_naive_equations() {
    let dev = flex();
    for (gate, state_ff) in [
        (GateKind::Fixed, true),
        (GateKind::Lstm, true),
        (GateKind::Fixed, false),
        (GateKind::Lstm, false),
    ] {
        let cfg = tiny().with_block_recurrent(Some(recurrent(gate, state_ff, 1)));
        let model = model_of(&cfg, 3, &dev);
        let rec = model.block_recurrent.as_ref().unwrap();
        let (b, n) = (2, 5);
        let x = randn([b, n, D], 1, &dev);
        let kx = randn([b, n, HEADS, D / HEADS], 2, &dev);
        let vx = randn([b, n, HEADS, D / HEADS], 4, &dev);
        let c = randn([b, S, D], 5, &dev);
        let (read, next) = rec.step(x.clone(), kx.clone(), vx.clone(), c.clone());
        assert_eq!(read.dims(), [b, n, D]);
        assert_eq!(next.dims(), [b, S, D]);
        let (read, next) = (host(read), host(next));
        let (x, kx, vx, c) = (host(x), host(kx), host(vx), host(c));
        for r in 0..b {
            let (want_read, want_next) = naive_step(
                rec,
                rows(&x, b)[r],
                rows(&kx, b)[r],
                rows(&vx, b)[r],
                rows(&c, b)[r],
            );
            let what = format!("{gate:?}, state_ff {state_ff}, row {r}");
            assert_close(
                rows(&read, b)[r],
                &want_read,
                1e-5,
                &format!("read ({what})"),
            );
            assert_close(
                rows(&next, b)[r],
                &want_next,
                1e-5,
                &format!("state ({what})"),
            );
        }
    }
}

/// Over 4 segments of a one-layer post-LN stack (the recurrent layer reads the scaled
/// embeddings), the carried state equals a naive host replay of the recurrence from `c_0`; with
/// the state's read projection at zero the tokens' outputs are those of the plain XL stack with
/// the same weights (its memory carried alike), and with it they are not.
#[test]
fn block_recurrent_state_over_segments_matches_naive_replay() {
    let dev = flex();
    let cfg =
        tiny()
            .with_n_layers(1)
            .with_block_recurrent(Some(recurrent(GateKind::Lstm, true, 0)));
    let model = model_of(&cfg, 7, &dev);
    let rec = model.block_recurrent.as_ref().unwrap();
    let a = model.layers[0].attention.local();
    let wkv = host(a.key_value.weight.val()); // [D, 2 D]: keys, then values
    let table = host(model.embedding.plain().unwrap().weight.val());
    let (b, n) = (2, 4);
    let mut state = XlState::new();
    let mut c: Vec<f32> = (0..b).flat_map(|_| host(rec.initial.val())).collect();
    for s in 0..4 {
        let t = tokens(b, n, s);
        model
            .forward_state(t.clone(), &mut state, &[false; 2])
            .unwrap();
        let ids: Vec<i64> = t.into_data().convert::<i64>().try_to_vec().unwrap();
        let scale = (D as f32).sqrt();
        let mut next = Vec::new();
        for r in 0..b {
            let x: Vec<f32> = ids[r * n..(r + 1) * n]
                .iter()
                .flat_map(|&id| {
                    table[id as usize * D..(id as usize + 1) * D]
                        .iter()
                        .map(|e| e * scale)
                })
                .collect();
            let mut kx = vec![0f32; n * D];
            let mut vx = vec![0f32; n * D];
            for i in 0..n {
                for o in 0..D {
                    for k in 0..D {
                        kx[i * D + o] += x[i * D + k] * wkv[k * 2 * D + o];
                        vx[i * D + o] += x[i * D + k] * wkv[k * 2 * D + D + o];
                    }
                }
            }
            next.extend(naive_step(rec, &x, &kx, &vx, rows(&c, b)[r]).1);
        }
        c = next;
        let got = host(state.block_recurrent.value.clone().unwrap());
        assert_close(&got, &c, 1e-4, &format!("state after segment {s}"));
        assert!(
            !state
                .block_recurrent
                .value
                .as_ref()
                .unwrap()
                .is_require_grad()
        );
    }

    // The read projection at zero: the plain XL stack's outputs.
    let mut silent = model.clone();
    let r = silent.block_recurrent.as_mut().unwrap();
    r.to_state_output.weight = Param::from_tensor(r.to_state_output.weight.val().zeros_like());
    let mut plain = silent.clone();
    plain.block_recurrent = None;
    let (mut s1, mut s2, mut s3) = (XlState::new(), XlState::new(), XlState::new());
    let mut differs = 0f32;
    for s in 0..3 {
        let t = tokens(b, n, s);
        let reset = [false; 2];
        let a = host(silent.forward_state(t.clone(), &mut s1, &reset).unwrap());
        let p = host(plain.forward_state(t.clone(), &mut s2, &reset).unwrap());
        let m = host(model.forward_state(t, &mut s3, &reset).unwrap());
        assert_close(&a, &p, 1e-5, &format!("silent state, segment {s}"));
        differs = differs.max(max_abs_diff(&m, &p));
    }
    assert!(differs > 1e-3, "the state read changes the outputs");
}

/// The state is carried (the second segment reads differently than with `c_0`), a reset row
/// reads as a fresh state does, `without_carried_memory` reads every segment from `c_0`, and
/// the state survives a checkpoint.
#[test]
fn block_recurrent_state_is_carried_reset_and_checkpointed() {
    let dev = flex();
    let model = model_of(&tiny(), 11, &dev);
    let mut state = XlState::new();
    model
        .forward_state(tokens(2, 5, 0), &mut state, &[false, false])
        .unwrap();
    let c = state.block_recurrent.value.clone().unwrap();
    assert_eq!(c.dims(), [2, S, D]);
    // The next segment with the carried state only (no XL memory), and with nothing.
    let carried = |s: &XlState| {
        let mut c = XlState::new();
        c.block_recurrent = s.block_recurrent.clone();
        c
    };
    assert_carried_and_reset(&model, &state, carried, tokens(2, 5, 1));

    let dir = std::env::temp_dir().join(format!("memzoo-brt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    TransformerXl::save_state(&state, &dir).unwrap();
    let back = model.load_state(&dir, &dev).unwrap();
    assert_eq!(host(back.block_recurrent.value.unwrap()), host(c));
    assert_eq!(back.xl.len(), 4);
    let _ = std::fs::remove_dir_all(dir);
}

fn segments(k: usize, batch: usize) -> Vec<UnrollSegment> {
    (0..k)
        .map(|s| UnrollSegment {
            inputs: tokens(batch, 4, s).to_device(&flex().autodiff()),
            targets: tokens(batch, 4, s + 7).to_device(&flex().autodiff()),
            reset: vec![false; batch],
            weights: None,
        })
        .collect()
}

/// For both gates: the loss of a 3-block unroll is the mean of the three blocks' losses read
/// one by one with the state carried; its gradient along a random direction of `c_0` (which
/// reaches the second and third blocks only through the recurrence) matches central finite
/// differences; and detaching the state every block gives another gradient.
#[test]
fn block_recurrent_backpropagates_through_blocks() {
    let dev = flex().autodiff();
    for gate in [GateKind::Fixed, GateKind::Lstm] {
        // GELU: no ReLU kinks for the finite differences to straddle.
        let cfg = tiny()
            .with_ff_activation(Activation::Gelu)
            .with_block_recurrent(Some(recurrent(gate, true, 1).with_bptt_segments(3)));
        let mut model = model_of(&cfg, 13, &dev);
        let r = model.block_recurrent.as_mut().unwrap();
        r.initial = Param::from_tensor(randn([S, D], 9, &dev));
        let loss = |m: &TransformerXl| {
            let (l, g) = m.train_unroll(segments(3, 2), &mut XlState::new()).unwrap();
            (l.into_scalar::<f64>(), g)
        };
        let (unrolled, grads) = loss(&model);
        // The same losses read segment by segment.
        let mut state = XlState::new();
        let mut sum = 0.0;
        for s in segments(3, 2) {
            let step = memzoo_stack::Step::reset(&s.reset);
            let nll = model
                .eval_step(s.inputs, s.targets, &mut state, &step)
                .unwrap()
                .nll;
            sum += nll.mean().into_scalar::<f64>() / 3.0;
        }
        assert!(
            (sum - unrolled).abs() < 1e-5,
            "{gate:?}: unrolled loss {unrolled} vs read one by one {sum}"
        );
        let id = model.block_recurrent.as_ref().unwrap().initial.id;
        let g = host(grads.get::<2>(id).unwrap());
        let dir = randn([S, D], 5, &dev);
        let dir = dir
            .clone()
            .div_scalar(dir.powf_scalar(2.0).sum().sqrt().into_scalar::<f32>());
        let v = host(dir.clone());
        let analytic: f64 = g.iter().zip(&v).map(|(a, b)| f64::from(a * b)).sum();
        let shifted = |eps: f32| {
            let mut m = model.clone();
            let r = m.block_recurrent.as_mut().unwrap();
            let w = r.initial.val() + dir.clone().mul_scalar(eps);
            r.initial = Param::from_tensor(w.detach());
            loss(&m).0
        };
        let eps = 1e-2;
        let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * f64::from(eps));
        assert!(
            (analytic - numeric).abs() < 0.01 * numeric.abs().max(1e-3),
            "{gate:?}: d loss / d c_0 along v: backward {analytic:.6}, finite differences \
             {numeric:.6}"
        );
        // With the state detached after every block the gradient is another one.
        let mut state = XlState::new();
        let mut cut = vec![0.0f32; g.len()];
        for s in segments(3, 2) {
            let (_, gs) = model.train_unroll(vec![s], &mut state).unwrap();
            if let Some(gs) = gs.get::<2>(id) {
                for (c, x) in cut.iter_mut().zip(host(gs)) {
                    *c += x / 3.0;
                }
            }
        }
        assert!(
            max_abs_diff(&cut, &g) > 1e-5,
            "{gate:?}: k = 3 reaches past the first block"
        );
        assert!(!state.block_recurrent.value.unwrap().is_require_grad());
    }
}

/// Two replicas, each unrolling its rows of two blocks, give one replica's loss and gradients.
#[test]
fn block_recurrent_sharded_unroll_matches_one_replica() {
    let dev = flex().autodiff();
    let model = model_of(&tiny(), 17, &dev);
    let segs: Vec<memzoo_data::Batch> = (0..2)
        .map(|s| {
            let x: Vec<i64> = (0..20).map(|i| ((i * 13 + s * 29) % 256) as i64).collect();
            let y: Vec<i64> = (0..20)
                .map(|i| ((i * 7 + s * 31 + 1) % 256) as i64)
                .collect();
            memzoo_data::Batch::new(4, 5, x, y).unwrap()
        })
        .collect();
    let run = |r: usize| {
        let mut states: Vec<XlState> = (0..r).map(|_| XlState::new()).collect();
        let placement = vec![dev.clone(); r];
        let (loss, grads) = memzoo_train::unroll::train_unroll_streamed(
            &model,
            &dev,
            &placement,
            &segs,
            &mut states,
            None,
        )
        .unwrap();
        (loss, param_vectors(&model, Some(&grads)))
    };
    let (l1, g1) = run(1);
    let (l2, g2) = run(2);
    assert!((l1 - l2).abs() < 1e-5, "{l1} vs {l2}");
    for (a, b) in g1.iter().zip(&g2) {
        match (a, b) {
            (Some(a), Some(b)) => assert_close(a, b, 1e-5, "gradient"),
            (a, b) => assert_eq!(a.is_some(), b.is_some()),
        }
    }
}

/// `--preset block-recurrent-tiny` trains (on the generated corpus, whose documents reset the
/// state), resumes with its state from the checkpoint, evaluates and generates.
#[test]
fn block_recurrent_preset_trains_resumes_evaluates_and_generates() {
    use memzoo::commands;
    use memzoo::config::RunConfig;
    use memzoo::preset::Preset;

    let dir = std::env::temp_dir().join(format!("memzoo-brt-preset-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = dir.join("run");
    let config = |steps: usize| {
        let sets: Vec<String> = [
            format!("train.steps={steps}"),
            "train.batch=2".into(),
            "train.eval_segments=1".into(),
            "train.replicas=1".into(),
        ]
        .into();
        RunConfig::resolve_preset(Some(Preset::BlockRecurrentTiny), None, &sets).unwrap()
    };
    commands::train(&config(2), "flex", &run, false, false, true, true).unwrap();
    let ckpts = run.join("checkpoints");
    let newest = || memzoo_train::checkpoint::latest(&ckpts).unwrap().unwrap();
    assert!(
        newest()
            .join("state/block_recurrent_state.safetensors")
            .exists()
    );
    let state = memzoo_train::checkpoint::read_trainer_state(&newest()).unwrap();
    assert_eq!(state.family, "block-recurrent");
    commands::train(&config(3), "flex", &run, true, false, true, true).unwrap();
    let state = memzoo_train::checkpoint::read_trainer_state(&newest()).unwrap();
    assert_eq!(state.step, 3);
    commands::eval(&run, "flex", "valid", None, None, Some(2), true).unwrap();
    commands::generate(&run, "flex", &generate_options("ab", 4), true).unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// kNN layers in a block-recurrent stack, the recurrent layer one of them: unrolled training
/// steps run with the state, the XL memory and the kNN memories; every block's pairs reach the
/// kNN memory, a reset row's are cleared, and generation reads the stack without adding any.
#[test]
fn block_recurrent_stack_with_knn_layers_trains_and_generates() {
    use memzoo_stack::RecurrentModel;
    let dev = flex().autodiff();
    for recurrent_layer in [0, 1] {
        let cfg = tiny()
            .with_layers(vec![LayerKind::Knn, LayerKind::Xl])
            .with_knn(tiny_knn())
            .with_block_recurrent(Some(
                recurrent(GateKind::Lstm, false, recurrent_layer).with_bptt_segments(2),
            ));
        let model = cfg.init(&dev).unwrap();
        assert_eq!(model.stack_family(), "block-recurrent");
        assert_eq!(RecurrentModel::bptt_segments(&model), 2);
        let mut state = XlState::new();
        for _ in 0..2 {
            let (loss, grads) =
                RecurrentModel::train_unroll(&model, segments(2, 2), &mut state).unwrap();
            assert!(loss.is_finite());
            let id = model
                .block_recurrent
                .as_ref()
                .unwrap()
                .state_output
                .weight
                .id;
            assert!(
                grads.get::<2>(id).is_some(),
                "the state's update is trained"
            );
        }
        assert_eq!(
            state.knn_len(0, 0),
            16,
            "every block's pairs in the kNN memory"
        );
        assert_eq!(
            state.block_recurrent.value.as_ref().unwrap().dims(),
            [2, S, D]
        );
        // A row that starts a document clears its kNN memory and reads c_0.
        let (_, _) = RecurrentModel::train_unroll(
            &model,
            segments(1, 2)
                .into_iter()
                .map(|mut s| {
                    s.reset = vec![false, true];
                    s
                })
                .collect(),
            &mut state,
        )
        .unwrap();
        assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (20, 4));
        let x = tokens(2, 3, 5).to_device(&dev);
        let logits = model.peek_logits(x, &mut state, &[false, false]).unwrap();
        assert_eq!(logits.dims(), [2, 3, 256]);
        assert_eq!(state.knn_len(0, 0), 20, "peeking adds nothing");
    }
}

/// A device stack's training pass with a dropout seed replays exactly (what the tokens read
/// from the state is dropped from the seed too, not from the device's generator), and another
/// seed draws other masks.
#[test]
fn block_recurrent_dropout_replays_from_its_seed() {
    let dev = flex().autodiff();
    let cfg = tiny().with_dropout(0.5);
    let model = model_of(&cfg, 19, &dev);
    let loss = |seed: u64| {
        let m = model.clone().with_dropout_seed(Some(seed));
        let (l, _) = m.train_unroll(segments(2, 2), &mut XlState::new()).unwrap();
        l.into_scalar::<f64>()
    };
    assert_eq!(loss(3), loss(3));
    assert!((loss(3) - loss(4)).abs() > 1e-6);
}

/// The state of block-recurrent-transformer-pytorch 0.4.4 (its `StateContainer`, fixtures by
/// `xtask/peers/fixtures/lucidrains_block_recurrent.py`) mapped onto [`BlockRecurrent`]: the
/// tokens' reads and the states over 3 blocks (carried in the graph) and every gradient
/// (parameters and inputs) at 1e-4. The package's one key/value head is `kv_heads = 1`, its
/// `[self_h ; cross_h]` per-head layout of `to_state_out` is permuted to memzoo's `[self ;
/// cross]`, and its learned EMA is the fixed gate with `b_g = −learned_ema_beta`.
#[test]
fn block_recurrent_state_matches_the_package() {
    use memzoo_import::TensorMap;
    let dev = flex().autodiff();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/lucidrains-block-recurrent-state");
    let m = TensorMap::read(&dir.join("model.safetensors")).unwrap();
    let r = TensorMap::read(&dir.join("reference.safetensors")).unwrap();
    let f = |map: &TensorMap, name: &str| -> TensorData {
        map.get(name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .clone()
            .convert::<f32>()
    };
    let t1 = |name: &str| Tensor::<1>::from_data(f(&m, name), &dev);
    let t2 = |name: &str| Tensor::<2>::from_data(f(&m, name), &dev);
    let (dh, heads) = (D / HEADS, HEADS);
    let cfg = tiny()
        .with_n_layers(1)
        .with_kv_heads(Some(1))
        .with_block_recurrent(Some(recurrent(GateKind::Fixed, false, 0)));
    let mut model = cfg.init(&dev).unwrap();
    let rec = model.block_recurrent.as_mut().unwrap();
    let p1 = |t: Tensor<1>| Param::from_tensor(t);
    let p2 = |t: Tensor<2>| Param::from_tensor(t);
    // The package's per-head rows `[self_h ; cross_h]` of `to_state_out`'s input, as memzoo's
    // `[self_0 .. self_H ; cross_0 .. cross_H]` (applied to the weight and its gradient).
    let permute = |t: Tensor<2>| {
        let rows: Vec<Tensor<2>> = [0, dh]
            .into_iter()
            .flat_map(|o| (0..heads).map(move |h| h * 2 * dh + o))
            .map(|start| t.clone().narrow(0, start, dh))
            .collect();
        Tensor::cat(rows, 0)
    };
    rec.initial = p2(t2("init_state"));
    rec.state_ids = p2(t2("state_pos_ids"));
    rec.state_norm.gamma = p1(t1("state_norm.gamma"));
    rec.state_norm.beta = Some(p1(t1("state_norm.beta")));
    rec.to_state_query.weight = p2(t2("q_to_state.weight").transpose());
    rec.to_state_output.weight = p2(t2("w_read").transpose());
    rec.state_query.weight = p2(t2("state_to_q.weight").transpose());
    rec.from_state_query.weight = p2(t2("q_from_state.weight").transpose());
    rec.state_key_value.weight = p2(t2("state_to_kv.weight").transpose());
    rec.state_output.weight = p2(permute(t2("to_state_out.weight").transpose()));
    let gate = &mut rec.attention_gate;
    gate.candidate.weight = p2(t2("state_out_to_gate.weight").transpose());
    gate.candidate.bias = Some(p1(t1("state_out_to_gate.bias")));
    gate.bias = Some(p1(t1("learned_ema_beta").neg()));
    let rec = model.block_recurrent.as_ref().unwrap();

    let leaf = |name: String| Tensor::<3>::from_data(f(&r, &name), &dev).require_grad();
    let floats = |name: String| host(Tensor::<3>::from_data(f(&r, &name), &dev));
    let mut c = rec.read_state(None, 2, None).unwrap();
    let mut total: Option<Tensor<1>> = None;
    let mut leaves = Vec::new();
    for s in 0..3 {
        let (x, k, v) = (
            leaf(format!("x.{s}")),
            leaf(format!("k.{s}")),
            leaf(format!("v.{s}")),
        );
        let per_head = |t: Tensor<3>| {
            let [b, n, _] = t.dims();
            t.unsqueeze_dim::<4>(2).expand([b, n, heads, dh])
        };
        let (read, next) = rec.step(x.clone(), per_head(k.clone()), per_head(v.clone()), c);
        assert_close(
            &host(read.clone()),
            &floats(format!("read.{s}")),
            1e-4,
            &format!("read {s}"),
        );
        assert_close(
            &host(next.clone()),
            &floats(format!("state.{s}")),
            1e-4,
            &format!("state {s}"),
        );
        let w = |name: String| Tensor::<3>::from_data(f(&r, &name), &dev);
        let l = (read * w(format!("r_read.{s}"))).sum()
            + (next.clone() * w(format!("r_state.{s}"))).sum();
        total = Some(match total {
            Some(t) => t + l,
            None => l,
        });
        leaves.push((x, k, v));
        c = next;
    }
    let grads = total.unwrap().backward();
    let want = |name: &str| Tensor::<2>::from_data(f(&r, &format!("grad.{name}")), &dev);
    let want1 = |name: &str| host(Tensor::<1>::from_data(f(&r, &format!("grad.{name}")), &dev));
    let got = |p: &Param<Tensor<2>>| host(p.val().grad(&grads).unwrap());
    let got1 = |p: &Param<Tensor<1>>| host(p.val().grad(&grads).unwrap());
    let check = |a: Vec<f32>, b: Vec<f32>, what: &str| assert_close(&a, &b, 1e-4, what);
    check(got(&rec.initial), host(want("init_state")), "grad c_0");
    check(
        got(&rec.state_ids),
        host(want("state_pos_ids")),
        "grad state IDs",
    );
    check(
        got1(&rec.state_norm.gamma),
        want1("state_norm.gamma"),
        "grad LN_s gain",
    );
    let t = |name: &str| host(want(name).transpose());
    // The projections, stored transposed in the peer.
    for (param, name, what) in [
        (&rec.to_state_query.weight, "q_to_state.weight", "grad W_qx"),
        (&rec.to_state_output.weight, "w_read", "grad W_read"),
        (&rec.state_query.weight, "state_to_q.weight", "grad W_qc"),
        (
            &rec.from_state_query.weight,
            "q_from_state.weight",
            "grad W_qcx",
        ),
        (
            &rec.state_key_value.weight,
            "state_to_kv.weight",
            "grad W^c_kv",
        ),
    ] {
        check(got(param), t(name), what);
    }
    check(
        got(&rec.state_output.weight),
        host(permute(want("to_state_out.weight").transpose())),
        "grad W^c_o",
    );
    let gate = &rec.attention_gate;
    check(
        got(&gate.candidate.weight),
        t("state_out_to_gate.weight"),
        "grad W_z",
    );
    check(
        got1(gate.candidate.bias.as_ref().unwrap()),
        want1("state_out_to_gate.bias"),
        "grad b_z",
    );
    let neg: Vec<f32> = want1("learned_ema_beta").iter().map(|g| -g).collect();
    check(got1(gate.bias.as_ref().unwrap()), neg, "grad b_g");
    for (s, (x, k, v)) in leaves.iter().enumerate() {
        for (name, leaf) in [("x", x), ("k", k), ("v", v)] {
            let want = floats(format!("grad.{name}.{s}"));
            check(
                host(leaf.grad(&grads).unwrap()),
                want,
                &format!("grad {name}.{s}"),
            );
        }
    }
}

/// Memory-replay backpropagation through three blocks is the one-graph unroll (both gates,
/// seeded dropout, a row starting a new document in the middle): the same losses, every
/// gradient and the carried state.
#[test]
fn block_recurrent_memory_replay_matches_the_unroll() {
    let dev = flex().autodiff();
    for gate in [GateKind::Fixed, GateKind::Lstm] {
        let cfg = tiny()
            .with_dropout(0.1)
            .with_block_recurrent(Some(recurrent(gate, true, 1).with_bptt_segments(3)));
        let model = model_of(&cfg, 13, &dev).with_dropout_seed(Some(7));
        let mut replayed = model.clone();
        replayed
            .block_recurrent
            .as_mut()
            .unwrap()
            .config
            .memory_replay = true;
        let segs = || {
            let mut s = segments(3, 2);
            s[1].reset[1] = true;
            s
        };
        let compared = assert_replay_matches_unroll(&model, &replayed, segs);
        assert!(compared >= 20, "{compared} gradients compared");
    }
}
