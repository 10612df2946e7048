//! The fused relative attention and kNN attention kernels and the fused GELU (`memzoo-fused`)
//! against the tensor-op paths they replace on `flex`: outputs, and the gradients of every
//! parameter and input, to 1e-5 (the GELU to 2e-7).

use burn::module::Param;
use burn::nn::Initializer;
use burn::optim::GradientsParams;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_fused::{
    FusedError, RelParams, RelativePosition, knn_attention_fused, relative_attention_fused,
};
use memzoo_knn::{KnnAttention, KnnAttentionConfig, KnnMixing};
use memzoo_memory::Retrieved;
use memzoo_relative::{
    AttentionMask, PositionConfig, PositionKind, RelativeAttentionConfig, RelativeContext,
    RelativeMultiHeadAttention, XlBiases,
};
use memzoo_tests::*;

const TOL: f32 = 1e-5;

/// Which path computes `softmax(mask(scores)) V`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Fused,
    TensorOps,
}

/// The output and the gradients of the loss `Σ out ⊙ w` (`w` drawn from `seed`) with respect to
/// `x` and the memory, as host vectors, and the gradients for the parameters.
fn output_and_input_grads(
    out: Tensor<3>,
    seed: u64,
    x: Tensor<3>,
    mem: Option<Tensor<3>>,
) -> (Vec<Vec<f32>>, burn::tensor::Gradients) {
    let w = randn(out.dims(), seed, &out.device());
    let grads = (out.clone() * w).sum().backward();
    let mut all = vec![host(out.inner())];
    for t in std::iter::once(x).chain(mem) {
        all.push(host(t.grad(&grads).expect("inputs get a gradient")));
    }
    (all, grads)
}

/// Output, and gradients (parameters, shared biases, `x`, `memory`) of `Σ w ⊙ Attn(x, memory)`.
fn run(
    att: &RelativeMultiHeadAttention,
    shared: Option<&XlBiases>,
    x: &Tensor<3>,
    mem: Option<&Tensor<3>>,
    ctx: &RelativeContext,
    path: Path,
) -> Vec<Vec<f32>> {
    let x = x.clone().require_grad();
    let mem = mem.map(|m| m.clone().require_grad());
    let [batch, qlen, _] = x.dims();
    let (q, k, v) = att.project(x.clone(), mem.clone(), ctx).unwrap();
    let [q, k, v] = [q, k, v].map(|t| t.swap_dims(1, 2));
    assert!(
        att.fused_applies(&q, ctx),
        "the kernel must apply to the cases under test"
    );
    let heads = match path {
        Path::Fused => att.attend_fused(q, k, v, ctx, shared),
        Path::TensorOps => att.attend_tensor_ops(q, k, v, ctx, shared),
    }
    .unwrap();
    let out =
        att.project_output(
            heads
                .swap_dims(1, 2)
                .reshape([batch, qlen, att.n_heads * att.d_head]),
        );
    let (mut all, grads) = output_and_input_grads(out, 99, x, mem);
    if let Some(s) = shared {
        for p in [&s.content, &s.position] {
            all.push(host(p.grad(&grads).expect("shared biases get a gradient")));
        }
    }
    let params = GradientsParams::from_grads(grads, att);
    for g in param_vectors(att, Some(&params)) {
        all.push(g.expect("every parameter gets a gradient"));
    }
    all
}

fn check(positions: PositionConfig, own: bool, (qlen, mlen): (usize, usize), mask: AttentionMask) {
    let dev = flex().autodiff();
    let (dm, h, dh, batch) = (16, 2, 6, 2);
    let init = Initializer::Normal {
        mean: 0.0,
        std: 0.4,
    };
    let att = RelativeAttentionConfig::new(dm, h, dh)
        .with_positions(positions.clone())
        .with_own_biases(own)
        .with_initializer(init.clone())
        .init(&dev)
        .unwrap();
    let shared = (!own).then(|| XlBiases::init(h, dh, &init, &dev));
    let x = randn([batch, qlen, dm], 21, &dev);
    let mem = (mlen > 0).then(|| randn([batch, mlen, dm], 22, &dev));
    let ctx = RelativeContext::new(&positions, dm, qlen, mlen, &mask, &dev);
    let what = format!(
        "{:?} own {own} qlen {qlen} mlen {mlen} {mask:?}",
        positions.kind
    );
    let fused = run(&att, shared.as_ref(), &x, mem.as_ref(), &ctx, Path::Fused);
    // The probabilities computed again in the backward pass: the same floats, to the bit.
    let recomputing = att.clone().with_recompute_probabilities(true);
    let again = run(
        &recomputing,
        shared.as_ref(),
        &x,
        mem.as_ref(),
        &ctx,
        Path::Fused,
    );
    assert!(
        again == fused,
        "{what}: recomputed probabilities change the gradients"
    );
    let reference = run(
        &att,
        shared.as_ref(),
        &x,
        mem.as_ref(),
        &ctx,
        Path::TensorOps,
    );
    assert_eq!(fused.len(), reference.len());
    for (n, (a, b)) in fused.iter().zip(&reference).enumerate() {
        let name = if n == 0 {
            "output".to_string()
        } else {
            format!("gradient {n}")
        };
        let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
        assert_close(a, b, TOL * scale, &format!("{what}: {name}"));
    }
}

fn masks() -> Vec<AttentionMask> {
    vec![
        AttentionMask::causal(),
        AttentionMask::Causal { window: Some(3) },
        AttentionMask::None,
    ]
}

const SHAPES: [(usize, usize); 5] = [(5, 0), (5, 3), (3, 7), (1, 4), (6, 6)];

#[test]
fn fused_xl_attention_matches_tensor_ops() {
    for shape in SHAPES {
        for mask in masks() {
            check(PositionConfig::new(), true, shape, mask.clone());
            check(PositionConfig::new(), false, shape, mask.clone());
            check(
                PositionConfig::new().with_clamp_len(Some(2)),
                true,
                shape,
                mask,
            );
        }
    }
}

#[test]
fn fused_t5_attention_matches_tensor_ops() {
    for shape in SHAPES {
        for mask in masks() {
            for bidirectional in [false, true] {
                let positions = PositionConfig::new()
                    .with_kind(PositionKind::T5)
                    .with_num_buckets(8)
                    .with_max_distance(6)
                    .with_bidirectional(bidirectional);
                check(positions, true, shape, mask.clone());
            }
        }
    }
}

/// Segments longer than the kernel's block of 64 query rows: under a causal mask a block stops
/// at the last key its rows see, so blocks of different widths, a window, and memory all meet.
#[test]
fn fused_attention_matches_tensor_ops_on_long_segments() {
    for shape in [(150, 0), (131, 20)] {
        for mask in masks() {
            check(PositionConfig::new(), true, shape, mask.clone());
            let t5 = PositionConfig::new()
                .with_kind(PositionKind::T5)
                .with_num_buckets(8)
                .with_max_distance(40);
            check(t5, true, shape, mask);
        }
    }
}

/// An explicit per-row mask with `-1e9` scores, one query hiding every key (it then attends
/// uniformly on both paths).
#[test]
fn fused_attention_matches_tensor_ops_under_explicit_masks() {
    explicit_mask((4, 3));
    // Longer than a block: the fully hidden query's block keeps every key, the others stop
    // at their causal limit.
    explicit_mask((140, 9));
}

fn explicit_mask((qlen, mlen): (usize, usize)) {
    let batch = 2;
    let klen = qlen + mlen;
    let hidden: Vec<bool> = (0..batch * qlen * klen)
        .map(|n| {
            let (b, i, j) = (n / (qlen * klen), n / klen % qlen, n % klen);
            (b == 1 && i == 2) || j > mlen + i || (b == 0 && j < 2)
        })
        .collect();
    let mask = AttentionMask::Explicit(Tensor::<3, Bool>::from_data(
        TensorData::new(hidden, [batch, qlen, klen]),
        &flex().autodiff(),
    ));
    check(PositionConfig::new(), true, (qlen, mlen), mask.clone());
    let t5 = PositionConfig::new()
        .with_kind(PositionKind::T5)
        .with_num_buckets(8)
        .with_max_distance(6);
    check(t5, true, (qlen, mlen), mask);
}

/// Bad shapes are errors that name them.
#[test]
fn fused_attention_rejects_bad_shapes() {
    let dev: Device = flex();
    let q = randn([2, 3, 4, 5], 1, &dev);
    let k = randn([2, 3, 6, 5], 2, &dev);
    let bias = |shape: [usize; 2], len: usize| RelativePosition::Buckets {
        table: randn(shape, 3, &dev),
        bucket: Tensor::<1, Int>::from_data(
            TensorData::new((0..len as i64).map(|u| u % 5).collect::<Vec<_>>(), [len]),
            &dev,
        ),
    };
    let err = |r: Result<Tensor<4>, FusedError>| r.unwrap_err().to_string();
    // The error of attention with values `v` and positions `pos` (no mask).
    let with = |v: Tensor<4>, pos| {
        err(relative_attention_fused(
            q.clone(),
            k.clone(),
            v,
            pos,
            None,
            RelParams::new(-1e9),
        ))
    };
    let e = with(k.clone(), bias([5, 3], 28));
    assert!(e.contains("[28]") && e.contains("expected [24]"), "{e}");
    let e = with(k.clone(), bias([4, 3], 24));
    assert!(e.contains("0..=4") && e.contains("4 buckets"), "{e}");
    let e = with(k.clone(), bias([5, 2], 24));
    assert!(
        e.contains("[5, 2]") && e.contains("[buckets >= 1, 3]"),
        "{e}"
    );
    let shifted = RelativePosition::Shifted {
        qp: q.clone(),
        r: randn([6, 3, 5], 4, &dev),
    };
    let e = with(k.clone(), shifted);
    assert!(e.contains("[6, 3, 5]") && e.contains("S >= 7"), "{e}");
    let e = with(randn([2, 3, 5, 5], 5, &dev), bias([5, 3], 24));
    assert!(e.contains("v has shape [2, 3, 5, 5]"), "{e}");
    let mask = Tensor::<3, Bool>::empty([3, 4, 6], &dev);
    let e = err(relative_attention_fused(
        q,
        k.clone(),
        k,
        bias([5, 3], 24),
        Some(mask),
        RelParams::new(-1e9),
    ));
    assert!(e.contains("mask has shape [3, 4, 6]"), "{e}");
}

/// The fused read of `found` by queries `q` at temperatures `tau` (with `lse`: and the
/// log-partition, `[.., d_head + 1]`).
fn fused_read(q: Tensor<4>, tau: Tensor<1>, found: &Retrieved, lse: bool) -> Tensor<4> {
    knn_attention_fused(
        q,
        tau,
        found.keys.clone(),
        found.values.clone(),
        found.mask.clone(),
        lse,
    )
    .unwrap()
}

/// Retrieved pairs for `[batch, qlen, heads]` queries with `k` slots: unit keys, normal values,
/// and `filled(b, i, h)` leading slots filled (the rest empty).
fn retrieved(
    (batch, qlen, h, k, dh): (usize, usize, usize, usize, usize),
    filled: impl Fn(usize, usize, usize) -> usize,
    seed: u64,
    dev: &Device,
) -> Retrieved {
    let mut keys = host(randn([batch, qlen, h, k, dh], seed, dev));
    for key in keys.chunks_mut(dh) {
        let norm = key.iter().map(|a| a * a).sum::<f32>().sqrt();
        key.iter_mut().for_each(|a| *a /= norm);
    }
    let mask: Vec<bool> = (0..batch * qlen * h * k)
        .map(|n| {
            let (b, i, hh, m) = (n / (qlen * h * k), n / (h * k) % qlen, n / k % h, n % k);
            m >= filled(b, i, hh)
        })
        .collect();
    Retrieved {
        keys: Tensor::from_data(TensorData::new(keys, [batch, qlen, h, k, dh]), dev),
        values: randn([batch, qlen, h, k, dh], seed + 1, dev),
        mask: Tensor::from_data(TensorData::new(mask, [batch, qlen, h, k]), dev),
    }
}

/// Output and gradients (input, memory, every parameter) of `Σ w ⊙ KnnAttention(x, memory)`
/// with the retrieved pairs `found`, the memory read fused or as tensor ops.
fn run_knn(
    layer: &KnnAttention,
    x: &Tensor<3>,
    mem: Option<&Tensor<3>>,
    ctx: &RelativeContext,
    found: &Retrieved,
    path: Path,
) -> Vec<Vec<f32>> {
    let mut layer = layer.clone();
    layer.fused_memory = path == Path::Fused;
    let x = x.clone().require_grad();
    let mem = mem.map(|m| m.clone().require_grad());
    let [b, l, _] = x.dims();
    let probe = Tensor::<4>::zeros([b, l, layer.n_heads, layer.d_head], &x.device());
    assert!(
        layer.fused_memory_applies(&probe),
        "the kernel must apply to the cases under test"
    );
    let out = layer
        .forward_retrieving(x.clone(), mem.clone(), ctx, |_| Ok(found.clone()))
        .unwrap()
        .output;
    let (mut all, grads) = output_and_input_grads(out, 98, x, mem);
    let params = GradientsParams::from_grads(grads, &layer);
    for (n, g) in param_vectors(&layer, Some(&params)).into_iter().enumerate() {
        // The gate is unused with the joint mixing.
        if let Some(g) = g {
            all.push(g);
        } else {
            assert_eq!(
                layer.mixing,
                KnnMixing::Joint,
                "parameter {n} gets a gradient"
            );
        }
    }
    all
}

/// The kNN layer with the fused memory read against tensor ops, over geometries with empty
/// slots (fewer filled than `k`), queries that found nothing, 1-2 rows, XL memory or none,
/// multi-query keys or one per head, both mixings.
#[test]
fn fused_knn_attention_matches_tensor_ops() {
    let dev = flex().autodiff();
    let dm = 16;
    // (batch, qlen, mlen, heads, d_head, k, kv heads)
    let geometries = [
        (2, 5, 0, 2, 6, 4, None),
        (1, 3, 0, 3, 8, 7, Some(1)),
        (2, 4, 3, 2, 13, 3, Some(1)),
        (1, 6, 2, 2, 16, 5, None),
    ];
    for (g, &(batch, qlen, mlen, h, dh, k, kv)) in geometries.iter().enumerate() {
        for mixing in [KnnMixing::Gate, KnnMixing::Joint] {
            let cfg = KnnAttentionConfig::new(dm, h, dh)
                .with_n_kv_heads(kv)
                .with_mixing(mixing);
            let mut layer = seeded_weights(cfg.init(&dev).unwrap(), 7 + g as u64, |_| 0.4);
            // A temperature and a gate of their own per head.
            let tau: Vec<f32> = (0..h).map(|hh| (3.0 + 2.5 * hh as f32).ln()).collect();
            let b_g: Vec<f32> = (0..h).map(|hh| 0.4 - 0.9 * hh as f32).collect();
            layer.log_scale =
                Param::from_tensor(Tensor::from_data(TensorData::new(tau, [h]), &dev));
            layer.gate = Param::from_tensor(Tensor::from_data(TensorData::new(b_g, [h]), &dev));
            // Every fill from none to all k slots, (0, 0, 0) none.
            let found = retrieved(
                (batch, qlen, h, k, dh),
                |b, i, hh| (b * 5 + i * 3 + hh * 2) % (k + 1),
                30 + g as u64,
                &dev,
            );
            let x = randn([batch, qlen, dm], 21 + g as u64, &dev);
            let mem = (mlen > 0).then(|| randn([batch, mlen, dm], 40 + g as u64, &dev));
            let ctx = RelativeContext::new(
                &cfg.positions,
                dm,
                qlen,
                mlen,
                &AttentionMask::causal(),
                &dev,
            );
            let what = format!("geometry {g} {mixing:?}");
            let fused = run_knn(&layer, &x, mem.as_ref(), &ctx, &found, Path::Fused);
            let reference = run_knn(&layer, &x, mem.as_ref(), &ctx, &found, Path::TensorOps);
            assert_eq!(fused.len(), reference.len());
            for (n, (a, b)) in fused.iter().zip(&reference).enumerate() {
                let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
                assert_close(a, b, TOL * scale, &format!("{what}: vector {n}"));
            }
            // Two computations, not one path twice.
            assert!(
                fused.iter().zip(&reference).any(|(a, b)| a != b),
                "{what}: the fused and tensor-op results are bit-identical"
            );
        }
    }
}

/// The kernel's read and log-partition against a naive f64 formula, and its gradients in `q`
/// and `τ` against the tensor-op read (`KnnAttention::memory_read_tensor_ops`).
#[test]
fn fused_knn_read_matches_formula_and_tensor_ops() {
    let dev = flex().autodiff();
    let (batch, qlen, h, k, dh) = (2, 3, 2, 5, 9);
    let filled = |b: usize, i: usize, hh: usize| (b * 2 + i + hh * 3) % (k + 1);
    let found = retrieved((batch, qlen, h, k, dh), filled, 3, &dev);
    let q = randn([batch, qlen, h, dh], 4, &dev);
    let tau = Tensor::<1>::from_data(TensorData::new(vec![2.5f32, 6.0], [h]), &dev);
    let read = host(fused_read(q.clone(), tau.clone(), &found, true));
    // Without autodiff (evaluation) the same kernel runs on plain flex tensors.
    let plain = flex();
    let found_plain = retrieved((batch, qlen, h, k, dh), filled, 3, &plain);
    let read_plain = host(
        knn_attention_fused(
            randn([batch, qlen, h, dh], 4, &plain),
            Tensor::from_data(TensorData::new(vec![2.5f32, 6.0], [h]), &plain),
            found_plain.keys,
            found_plain.values,
            found_plain.mask,
            true,
        )
        .unwrap(),
    );
    assert_eq!(read, read_plain, "the read with and without autodiff");
    let (qv, kv, vv) = (
        host(q.clone()),
        host(found.keys.clone()),
        host(found.values.clone()),
    );
    let taus = [2.5f64, 6.0];
    for u in 0..batch * qlen * h {
        let (b, i, hh) = (u / (qlen * h), u / h % qlen, u % h);
        let n = filled(b, i, hh);
        let qu: Vec<f64> = qv[u * dh..(u + 1) * dh].iter().map(|&a| a as f64).collect();
        let scores: Vec<Option<f64>> = (0..k)
            .map(|m| {
                let key: Vec<f64> = kv[(u * k + m) * dh..(u * k + m + 1) * dh]
                    .iter()
                    .map(|&a| a as f64)
                    .collect();
                (m < n).then(|| taus[hh] * dot(&qu, &key))
            })
            .collect();
        let got = &read[u * (dh + 1)..(u + 1) * (dh + 1)];
        if n == 0 {
            assert!(got[..dh].iter().all(|&a| a == 0.0), "unit {u}: empty read");
            assert!(got[dh] < -1e29, "unit {u}: empty log-partition {}", got[dh]);
            continue;
        }
        let p = masked_softmax(&scores);
        let lse = scores.iter().flatten().map(|s| s.exp()).sum::<f64>().ln();
        assert!(
            (got[dh] as f64 - lse).abs() < 1e-5 * lse.abs().max(1.0),
            "unit {u}: lse"
        );
        for c in 0..dh {
            let want: f64 = (0..k).map(|m| p[m] * vv[(u * k + m) * dh + c] as f64).sum();
            assert!((got[c] as f64 - want).abs() < 1e-5, "unit {u} dim {c}");
        }
    }

    // Gradients: the same loss through the fused read (without the log-partition) and the
    // tensor-op read, with every unit found something's weight.
    let layer = KnnAttentionConfig::new(8, h, dh).init(&dev).unwrap();
    let w = randn([batch, qlen, h, dh], 5, &dev);
    let grads_of = |fused: bool| {
        let (q, tau) = (q.clone().require_grad(), tau.clone().require_grad());
        let out = if fused {
            fused_read(q.clone(), tau.clone(), &found, false)
        } else {
            layer.memory_read_tensor_ops(q.clone(), tau.clone(), &found)
        };
        // Queries that found nothing read differently on the two paths (0 / the slots' mean):
        // weighted out, as the gate does.
        let found_any = found.mask.clone().float().min_dim(3).neg().add_scalar(1.0);
        let g = (out * w.clone() * found_any).sum().backward();
        [
            q.grad(&g).unwrap(),
            tau.grad(&g).unwrap().reshape([1, 1, 1, h]),
        ]
        .map(host)
    };
    let (a, b) = (grads_of(true), grads_of(false));
    for (n, (a, b)) in a.iter().zip(&b).enumerate() {
        let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
        assert_close(a, b, TOL * scale, &format!("gradient {n}"));
    }
}

/// Bad shapes are errors that name them.
#[test]
fn fused_knn_attention_rejects_bad_shapes() {
    let dev: Device = flex();
    let found = retrieved((2, 3, 2, 4, 5), |_, _, _| 2, 1, &dev);
    let q = randn([2, 3, 2, 5], 2, &dev);
    let tau = randn([2], 3, &dev);
    let err = |r: Result<Tensor<4>, FusedError>| r.unwrap_err().to_string();
    let e = err(knn_attention_fused(
        randn([2, 3, 2, 6], 2, &dev),
        tau.clone(),
        found.keys.clone(),
        found.values.clone(),
        found.mask.clone(),
        false,
    ));
    assert!(
        e.contains("keys have shape [2, 3, 2, 4, 5], q [2, 3, 2, 6]"),
        "{e}"
    );
    let e = err(knn_attention_fused(
        q.clone(),
        randn([3], 3, &dev),
        found.keys.clone(),
        found.values.clone(),
        found.mask.clone(),
        false,
    ));
    assert!(e.contains("tau has shape [3], expected [2]"), "{e}");
    let e = err(knn_attention_fused(
        q.clone(),
        tau.clone(),
        found.keys.clone(),
        randn([2, 3, 2, 3, 5], 4, &dev),
        found.mask.clone(),
        false,
    ));
    assert!(e.contains("values have shape [2, 3, 2, 3, 5]"), "{e}");
    let e = err(knn_attention_fused(
        q,
        tau,
        found.keys.clone(),
        found.values.clone(),
        Tensor::<4, Bool>::empty([2, 3, 2, 3], &dev),
        false,
    ));
    assert!(
        e.contains("mask has shape [2, 3, 2, 3], expected [2, 3, 2, 4]"),
        "{e}"
    );
}

/// Absolute and rotary positions (no position term: the content scores of
/// `content_operands`) through the fused kernel against the tensor ops, with and without
/// qk-RMSNorm, xPos and memory, and the null key and value of recurrent-memory-transformer-
/// pytorch: the output and every gradient (parameters, inputs, the null pair) at 1e-5.
#[test]
fn fused_content_attention_matches_tensor_ops() {
    let dev = flex().autodiff();
    let (dm, h, dh, batch) = (16, 2, 6, 2);
    let init = Initializer::Normal {
        mean: 0.0,
        std: 0.4,
    };
    let absolute = PositionConfig::new().with_kind(PositionKind::Absolute);
    let rotary = PositionConfig::new()
        .with_kind(PositionKind::Rotary)
        .with_rotary_width(Some(16));
    let xpos = rotary.clone().with_xpos_scale_base(Some(64.0));
    let cases = [
        (absolute.clone(), None, false),
        (absolute.clone(), Some(0.5), false),
        (absolute, None, true),
        (rotary.clone(), None, false),
        (xpos.clone(), None, false),
        (xpos, Some(1.0 / (dh as f64).sqrt()), false),
    ];
    for (positions, qk_norm, null) in cases {
        for (qlen, mlen) in [(5, 0), (5, 3), (70, 8)] {
            if positions.kind == PositionKind::Absolute && mlen > 0 {
                continue; // absolute layers read no memory
            }
            for mask in masks() {
                let att = RelativeAttentionConfig::new(dm, h, dh)
                    .with_positions(positions.clone())
                    .with_qk_norm(qk_norm)
                    .with_initializer(init.clone())
                    .init(&dev)
                    .unwrap();
                let x = randn([batch, qlen, dm], 21, &dev);
                let mem = (mlen > 0).then(|| randn([batch, mlen, dm], 22, &dev));
                let ctx = RelativeContext::new(&positions, dm, qlen, mlen, &mask, &dev);
                let what = format!(
                    "{:?} xpos {:?} qk_norm {qk_norm:?} null {null} qlen {qlen} mlen {mlen} {mask:?}",
                    positions.kind, positions.xpos_scale_base
                );
                let run = |fused: bool, att: &RelativeMultiHeadAttention| {
                    let x = x.clone().require_grad();
                    let mem = mem.clone().map(|m| m.require_grad());
                    let pair = randn([2, h, dh], 23, &dev).require_grad();
                    let (q, k, v) = att.project(x.clone(), mem.clone(), &ctx).unwrap();
                    let [q, k, v] = [q, k, v].map(|t| t.swap_dims(1, 2));
                    let heads = match (null, fused) {
                        (false, true) => {
                            assert!(att.fused_applies(&q, &ctx), "{what}: the kernel applies");
                            att.attend(q, k, v, &ctx, None)
                        }
                        (false, false) => att.attend_tensor_ops(q, k, v, &ctx, None),
                        (true, true) => {
                            assert!(
                                att.fused_null_applies(&q, &ctx),
                                "{what}: the kernel applies"
                            );
                            att.attend_null(q, k, v, pair.clone(), &ctx, None)
                        }
                        (true, false) => {
                            att.attend_null_tensor_ops(q, k, v, pair.clone(), &ctx, None)
                        }
                    }
                    .unwrap();
                    let out =
                        att.project_output(heads.swap_dims(1, 2).reshape([batch, qlen, h * dh]));
                    let (mut all, grads) = output_and_input_grads(out, 99, x, mem);
                    if null {
                        all.push(host(
                            pair.grad(&grads).expect("the null pair gets a gradient"),
                        ));
                    }
                    let params = GradientsParams::from_grads(grads, att);
                    for g in param_vectors(att, Some(&params)) {
                        all.push(g.expect("every parameter gets a gradient"));
                    }
                    all
                };
                let (fused, reference) = (run(true, &att), run(false, &att));
                let recomputing = att.clone().with_recompute_probabilities(true);
                assert!(
                    run(true, &recomputing) == fused,
                    "{what}: recomputed probabilities change the gradients"
                );
                assert_eq!(fused.len(), reference.len());
                for (n, (a, b)) in fused.iter().zip(&reference).enumerate() {
                    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
                    assert_close(a, b, TOL * scale, &format!("{what}: output/gradient {n}"));
                }
            }
        }
    }
}

/// The fused GELU (`memzoo_fused::gelu`) against Burn's exact GELU on `flex` (the C library's
/// `erff`, one element at a time; its backward `Φ(x) + x φ(x)` with the library's `exp`): the
/// output and the input's gradient on a dense grid over [-12, 12] (both tails and the
/// underflow of `φ`), on normal draws, and on strided views (a transposed tensor, GEGLU's
/// half rows, a narrowed middle dim), within 2e-7 of `1 + |x|`. Without autodiff the output
/// is the same.
#[test]
fn fused_gelu_matches_burns_exact_gelu() {
    let dev = flex().autodiff();
    let grid: Vec<f32> = (0..24_001).map(|i| -12.0 + i as f32 * 0.001).collect();
    let n = grid.len();
    let inputs = [
        Tensor::<3>::from_data(TensorData::new(grid.clone(), [1, 1, n]), &dev),
        randn([8, 64, 96], 31, &dev).mul_scalar(2.0),
        randn([4, 96, 64], 32, &dev).swap_dims(1, 2),
        // GEGLU's gate: half of every row, read in place.
        randn([4, 50, 96], 34, &dev).narrow(2, 48, 48),
        randn([6, 40, 90], 35, &dev)
            .mul_scalar(3.0)
            .narrow(2, 3, 80),
        // Rows that do not step evenly (copied first).
        randn([8, 64, 96], 36, &dev).narrow(1, 5, 40),
    ];
    for (case, x) in inputs.into_iter().enumerate() {
        let w = randn(x.dims(), 33, &dev);
        let run = |fused: bool| {
            let x = x.clone().require_grad();
            let y = match fused {
                true => memzoo_fused::gelu(x.clone()),
                false => burn::tensor::activation::gelu(x.clone()),
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            let dx = host(x.grad(&grads).expect("x gets a gradient"));
            (host(y.inner()), dx)
        };
        let (xs, (y, dx), (y_ref, dx_ref)) = (host(x.clone()), run(true), run(false));
        let ws = host(w.clone());
        for i in 0..xs.len() {
            let tol = 2e-7 * (1.0 + xs[i].abs());
            assert!(
                (y[i] - y_ref[i]).abs() <= tol,
                "case {case}: gelu({}) = {} against {}",
                xs[i],
                y[i],
                y_ref[i]
            );
            assert!(
                (dx[i] - dx_ref[i]).abs() <= tol * (1.0 + ws[i].abs()),
                "case {case}: the gradient at {} is {} against {}",
                xs[i],
                dx[i],
                dx_ref[i]
            );
        }
        let plain = memzoo_fused::gelu(x.inner());
        assert_eq!(host(plain), y, "case {case}: autodiff and plain flex agree");
    }
}

/// The fused linear layer (`memzoo_fused::linear`, its product by `matmul_2d`) against Burn's
/// `linear` on `flex`: the output and the gradients of the input, the weight and the bias,
/// bit for bit (the same `gemm` calls); and against a naive triple loop written here, within
/// 1e-5 of the operands' scale. Cases: small and thread-pooled sizes, a transposed (strided)
/// input, a narrowed (offset) weight, no bias, a constant weight (no gradient kept for it).
#[test]
fn fused_linear_is_burns_linear_to_the_bit() {
    let dev = flex().autodiff();
    let cases: Vec<(Tensor<2>, Tensor<2>, Option<Tensor<1>>, bool)> = vec![
        (
            randn([5, 3], 1, &dev),
            randn([3, 4], 2, &dev),
            Some(randn([4], 3, &dev)),
            true,
        ),
        (
            randn([1024, 128], 4, &dev),
            randn([128, 384], 5, &dev),
            None,
            true,
        ),
        (
            randn([96, 200], 6, &dev).swap_dims(0, 1),
            randn([96, 70], 7, &dev).narrow(1, 3, 64),
            Some(randn([64], 8, &dev)),
            true,
        ),
        (
            randn([300, 256], 9, &dev),
            randn([256, 256], 10, &dev),
            None,
            false,
        ),
    ];
    for (case, (x, w, b, train_w)) in cases.into_iter().enumerate() {
        let [rows, d_in] = x.dims();
        let d_out = w.dims()[1];
        let g = randn([rows, d_out], 11, &dev);
        let run = |fused: bool| {
            let x = x.clone().require_grad();
            let w = match train_w {
                true => w.clone().require_grad(),
                false => w.clone(),
            };
            let b = b.clone().map(|b| b.require_grad());
            let y = match fused {
                true => memzoo_fused::linear(x.clone(), w.clone(), b.clone()),
                false => burn::tensor::module::linear(x.clone(), w.clone(), b.clone()),
            };
            let grads = (y.clone() * g.clone()).sum().backward();
            let dx = host(x.grad(&grads).expect("x gets a gradient"));
            let dw = w.grad(&grads).map(host);
            let db = b.map(|b| host(b.grad(&grads).expect("b gets a gradient")));
            (host(y), dx, dw, db)
        };
        let (got, want) = (run(true), run(false));
        assert_eq!(got.0, want.0, "case {case}: output");
        assert_eq!(got.1, want.1, "case {case}: input gradient");
        assert_eq!(got.2, want.2, "case {case}: weight gradient");
        assert_eq!(got.3, want.3, "case {case}: bias gradient");
        assert_eq!(
            got.2.is_some(),
            train_w,
            "case {case}: a weight gradient only when trained"
        );
        // Against the definition: y_ij = b_j + Σ_k x_ik w_kj, dx = G Wᵀ, dW = Xᵀ G, each
        // within 1e-5 of the sum of its terms' magnitudes (f32 accumulation).
        let (xs, ws, gs) = (host(x.clone()), host(w.clone()), host(g.clone()));
        let bs = b.clone().map(host).unwrap_or_else(|| vec![0.0; d_out]);
        let check = |got: f32, terms: Vec<(f32, f32)>, bias: f32, what: &str| {
            let exact: f64 =
                terms.iter().map(|&(a, b)| a as f64 * b as f64).sum::<f64>() + bias as f64;
            let scale: f64 = terms
                .iter()
                .map(|&(a, b)| (a as f64 * b as f64).abs())
                .sum::<f64>();
            let tol = 1e-5 * (1.0 + scale + bias.abs() as f64);
            assert!(
                (got as f64 - exact).abs() <= tol,
                "case {case}: {what} {got} against {exact}"
            );
        };
        for i in (0..rows).step_by(7) {
            for j in (0..d_out).step_by(5) {
                let terms = (0..d_in)
                    .map(|k| (xs[i * d_in + k], ws[k * d_out + j]))
                    .collect();
                check(got.0[i * d_out + j], terms, bs[j], "y");
            }
            for k in (0..d_in).step_by(5) {
                let terms = (0..d_out)
                    .map(|j| (gs[i * d_out + j], ws[k * d_out + j]))
                    .collect();
                check(got.1[i * d_in + k], terms, 0.0, "dx");
            }
        }
        if let Some(dw) = &got.2 {
            for k in (0..d_in).step_by(11) {
                for j in (0..d_out).step_by(3) {
                    let terms = (0..rows)
                        .map(|i| (xs[i * d_in + k], gs[i * d_out + j]))
                        .collect();
                    check(dw[k * d_out + j], terms, 0.0, "dW");
                }
            }
        }
        let plain = memzoo_fused::linear(x.inner(), w.inner(), b.map(|b| b.inner()));
        assert_eq!(
            host(plain),
            got.0,
            "case {case}: autodiff and plain flex agree"
        );
    }
}

/// The dropout mask drawn in parallel chunks (each from its own position of the ChaCha12
/// stream; with `rand_chacha`, and with memzoo's AVX-512 and AVX2 ChaCha12 where the CPU has
/// them) is the mask of the sequential loop over one `StdRng::seed_from_u64(seed)` (written here), element
/// for element, at sizes below, at and across the chunks' boundaries and the 128-element
/// batches of sixteen blocks, also packed into bits; and about a fraction `p` of it is zero.
#[test]
fn dropout_mask_is_the_sequential_generators() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    for (n, p, seed) in [
        (1, 0.1, 0),
        (1000, 0.5, 7),
        (2000, 0.0, 5),
        (2000, 0.9, 6),
        (1 << 15, 0.1, 42),
        ((1 << 15) + 1, 0.1, 42),
        (3 * (1 << 15) + 17, 0.25, 123_456_789),
        (127, 0.3, 9),
        (129, 0.3, 9),
        (300, 1.0, 3),
    ] {
        let mut rng = StdRng::seed_from_u64(seed);
        let keep = (1.0 / (1.0 - p)) as f32;
        let want: Vec<f32> = (0..n)
            .map(|_| if rng.random::<f64>() < p { 0.0 } else { keep })
            .collect();
        use memzoo_fused::dropout::{mask_values, mask_values_avx2, mask_values_portable};
        let got = mask_values(n, p, seed);
        // The fastest path the CPU has, AVX2's where it has it, and `rand_chacha`'s chunks.
        for (path, got) in [
            ("mask_values", &got),
            ("avx2", &mask_values_avx2(n, p, seed)),
            ("portable", &mask_values_portable(n, p, seed)),
        ] {
            assert_eq!(got.len(), n);
            if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
                panic!(
                    "{path}, n {n}, seed {seed}: element {i} is {}, the sequential draw {}",
                    got[i], want[i]
                );
            }
        }
        // Packed: bit i % 32 of word i / 32 set where element i is kept, the tail's bits 0.
        let words = memzoo_fused::dropout::keep_words(n, p, seed);
        assert_eq!(words.len(), n.div_ceil(32), "n {n}");
        for i in 0..32 * words.len() {
            let bit = (words[i / 32] >> (i % 32)) & 1 == 1;
            assert_eq!(
                bit,
                i < n && want[i] != 0.0,
                "packed, n {n}, seed {seed}: element {i}"
            );
        }
        if n >= 1000 {
            let zeros = got.iter().filter(|&&m| m == 0.0).count() as f64 / n as f64;
            assert!((zeros - p).abs() < 0.05, "n {n}: {zeros} zero, p = {p}");
        }
    }
}

/// `memzoo_fused::softmax::softmax` (whose backward keeps only its output) against Burn's
/// softmax, its gradient included, along the last dim and an inner one, with a hidden key
/// (`-inf`) in some rows: the same values and the same gradient `dS = P (dP - Σ P dP)`.
#[test]
fn softmax_keeping_output_matches_burns() {
    let dev = flex().autodiff();
    for dim in [3usize, 1] {
        let x = randn([2, 3, 4, 5], 5, &dev);
        // A hidden key in every row along `dim`'s first index, as the attention's masks do.
        let hide = Tensor::<4>::zeros([2, 3, 4, 5], &dev)
            .narrow(dim, 0, 1)
            .add_scalar(1.0)
            .bool();
        let mut shape = [2, 3, 4, 5];
        shape[dim] -= 1;
        let visible = Tensor::<4>::zeros(shape, &dev).bool();
        let hidden = Tensor::cat(vec![hide, visible], dim);
        let w = randn([2, 3, 4, 5], 6, &dev);
        let run = |lean: bool| {
            let x = x.clone().require_grad();
            let s = x.clone().mask_fill(hidden.clone(), f32::NEG_INFINITY);
            let p = if lean {
                memzoo_fused::softmax::softmax(s, dim)
            } else {
                burn::tensor::activation::softmax(s, dim)
            };
            let grads = (p.clone() * w.clone()).sum().backward();
            (host(p.inner()), host(x.grad(&grads).unwrap()))
        };
        let (p_lean, g_lean) = run(true);
        let (p_burn, g_burn) = run(false);
        assert_close(&p_lean, &p_burn, 1e-6, &format!("softmax along {dim}"));
        assert_close(
            &g_lean,
            &g_burn,
            1e-5,
            &format!("softmax gradient along {dim}"),
        );
        assert!(
            g_lean.iter().any(|g| g.abs() > 1e-3),
            "a gradient that is not all zero"
        );
    }
    assert!(memzoo_fused::softmax::keeps_output_only(&dev));
}
