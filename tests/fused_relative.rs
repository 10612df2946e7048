//! The fused relative attention kernel (`memzoo-fused`) against the tensor-op path it replaces
//! on `flex`: outputs, and the gradients of every parameter and input, to 1e-5.

use burn::nn::Initializer;
use burn::optim::GradientsParams;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_fused::{FusedError, RelativePosition, relative_attention_fused};
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
    let w = randn(out.dims(), 99, &out.device());
    let grads = (out.clone() * w).sum().backward();
    let mut all = vec![host(out.inner())];
    let mut leaves = vec![x];
    leaves.extend(mem);
    for t in leaves {
        all.push(host(t.grad(&grads).expect("inputs get a gradient")));
    }
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
    let e = err(relative_attention_fused(
        q.clone(),
        k.clone(),
        k.clone(),
        bias([5, 3], 28),
        None,
        -1e9,
    ));
    assert!(e.contains("[28]") && e.contains("expected [24]"), "{e}");
    let e = err(relative_attention_fused(
        q.clone(),
        k.clone(),
        k.clone(),
        bias([4, 3], 24),
        None,
        -1e9,
    ));
    assert!(e.contains("0..=4") && e.contains("4 buckets"), "{e}");
    let e = err(relative_attention_fused(
        q.clone(),
        k.clone(),
        k.clone(),
        bias([5, 2], 24),
        None,
        -1e9,
    ));
    assert!(
        e.contains("[5, 2]") && e.contains("[buckets >= 1, 3]"),
        "{e}"
    );
    let e = err(relative_attention_fused(
        q.clone(),
        k.clone(),
        k.clone(),
        RelativePosition::Shifted {
            qp: q.clone(),
            r: randn([6, 3, 5], 4, &dev),
        },
        None,
        -1e9,
    ));
    assert!(e.contains("[6, 3, 5]") && e.contains("S >= 7"), "{e}");
    let e = err(relative_attention_fused(
        q.clone(),
        k.clone(),
        randn([2, 3, 5, 5], 5, &dev),
        bias([5, 3], 24),
        None,
        -1e9,
    ));
    assert!(e.contains("v has shape [2, 3, 5, 5]"), "{e}");
    let mask = Tensor::<3, Bool>::empty([3, 4, 6], &dev);
    let e = err(relative_attention_fused(
        q,
        k.clone(),
        k,
        bias([5, 3], 24),
        Some(mask),
        -1e9,
    ));
    assert!(e.contains("mask has shape [3, 4, 6]"), "{e}");
}
