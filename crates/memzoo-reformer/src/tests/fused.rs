//! The fused LSH kernel (`memzoo_fused`) against the tensor-op path: values and the gradients
//! of every input, on the autodiff flex device.

use burn::tensor::{Bool, Int, Tensor, TensorData};

use super::{dev, rand_tensor, to_vec};
use crate::attention::{
    ChunkParams, ForwardOptions, LshKernel, LshScores, hash_buckets, lsh_attention_fused,
    lsh_attention_with_buckets,
};
use crate::config::{LshConfig, ReformerAttentionConfig};
use crate::layer::AttentionKind;
use crate::rng::random_rotations;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert!(x.is_finite() && y.is_finite(), "non-finite value");
            (x - y).abs()
        })
        .fold(0.0, f32::max)
}

/// Values and gradients of `qk` and `v` under `loss = Σ out * g` (a random `g`, so every
/// output element weighs differently), fused vs tensor ops, over chunk geometries, masks,
/// de-duplication, score conventions and rounds.
#[test]
fn fused_lsh_matches_tensor_ops_in_values_and_gradients() {
    let device = dev().autodiff();
    let (b, h, dh) = (2, 3, 8);
    let cases = [
        // (len, chunk, rounds, buckets, before, after, causal, dedup, pad)
        (24, 4, 3, 4, 1, 0, true, true, true),
        (24, 4, 3, 6, 1, 1, false, true, false),
        (24, 4, 2, 4, 2, 1, true, false, true),
        (32, 8, 4, 4, 1, 0, true, true, false),
        (32, 8, 4, 4, 1, 0, false, false, false),
        (16, 4, 1, 4, 1, 0, true, true, true), // one round: nothing to de-duplicate
        (8, 4, 1, 2, 1, 1, false, true, false), // 2 chunks: the window is clamped
        (12, 12, 2, 2, 1, 0, true, true, true), // one chunk per round
    ];
    for (n, &(l, c, r, nb, before, after, causal, dedup_rounds, with_pad)) in
        cases.iter().enumerate()
    {
        let lsh_scores = if n % 2 == 0 {
            LshScores::UnitKeys
        } else {
            LshScores::ScaledUnitKeys
        };
        let params = |kernel| ChunkParams {
            chunk_len: c,
            before,
            after,
            causal,
            dedup_rounds,
            lsh_scores,
            kernel,
            key_eps: 0.0,
        };
        let seed = 300 + 10 * n as u64;
        let qk0 = rand_tensor([b, h, l, dh], seed, &device).mul_scalar(1.5);
        let v0 = rand_tensor([b, h, l, dh], seed + 1, &device);
        let g = rand_tensor([b, h, l, dh], seed + 2, &device);
        let rot = random_rotations(dh, r, nb, seed + 3, &device);
        let buckets = hash_buckets(qk0.clone(), rot);
        let pad_v: Vec<bool> = (0..b * l)
            .map(|i| with_pad && i / l == 1 && i % l >= l - 3)
            .collect();
        let pad = with_pad
            .then(|| Tensor::<2, Bool>::from_data(TensorData::new(pad_v.clone(), [b, l]), &device));
        let run = |fused: bool| {
            let qk = qk0.clone().require_grad();
            let v = v0.clone().require_grad();
            let out = if fused {
                lsh_attention_fused(
                    qk.clone(),
                    v.clone(),
                    buckets.clone(),
                    nb,
                    pad.clone(),
                    params(LshKernel::Auto),
                )
                .expect("the fused kernel runs on flex")
            } else {
                lsh_attention_with_buckets(
                    qk.clone(),
                    v.clone(),
                    buckets.clone(),
                    nb,
                    pad.clone(),
                    params(LshKernel::Tensor),
                    None,
                )
            };
            let grads = (out.clone() * g.clone()).sum().backward();
            let dqk = qk.grad(&grads).expect("qk gradient");
            let dv = v.grad(&grads).expect("v gradient");
            (to_vec(out.inner()), to_vec(dqk), to_vec(dv))
        };
        let (out_f, dqk_f, dv_f) = run(true);
        let (out_t, dqk_t, dv_t) = run(false);
        for (what, a, b) in [
            ("output", &out_f, &out_t),
            ("d qk", &dqk_f, &dqk_t),
            ("d v", &dv_f, &dv_t),
        ] {
            let d = max_diff(a, b);
            assert!(d < 1e-5, "case {n}: {what}: max |fused - tensor| = {d:e}");
        }
        // The gradients are not trivially zero, and the two paths really ran (they round
        // differently).
        assert!(
            dqk_t.iter().any(|x| x.abs() > 1e-3),
            "case {n}: d qk vanishes"
        );
        assert!(
            dqk_f.iter().zip(&dqk_t).any(|(a, b)| a != b),
            "case {n}: bit-identical gradients: did one implementation run twice?"
        );
    }
}

/// A whole LSH layer: a length that is not a multiple of the chunk (the layer pads with zero
/// rows, whose queries sit on the norm's floor), a user padding mask, several rounds; the
/// output and the gradients of the input and of every weight, fused vs tensor ops.
#[test]
fn fused_lsh_layer_matches_tensor_ops_with_padding_and_odd_lengths() {
    let device = dev().autodiff();
    let (b, d) = (2, 16);
    for (l, causal, dedup_rounds) in [(22, true, true), (13, false, true), (19, true, false)] {
        let layer = |kernel| {
            ReformerAttentionConfig::new(d, 2, 8)
                .with_kind(AttentionKind::Lsh)
                .with_lsh(
                    LshConfig::new()
                        .with_chunk_len(4)
                        .with_n_rounds(3)
                        .with_causal(causal)
                        .with_dedup_rounds(dedup_rounds),
                )
                .with_lsh_kernel(kernel)
                .init(&device)
                .expect("valid config")
        };
        let fused = layer(LshKernel::Auto);
        // The same weights on the tensor path.
        let mut tensor = fused.clone();
        tensor.lsh_kernel = LshKernel::Tensor;
        let x0 = rand_tensor([b, l, d], 900 + l as u64, &device);
        let g = rand_tensor([b, l, d], 950 + l as u64, &device);
        let mask: Vec<bool> = (0..b * l).map(|i| i / l == 0 && i % l < 2).collect();
        let mask = Tensor::<2, Bool>::from_data(TensorData::new(mask, [b, l]), &device);
        let opts = ForwardOptions::eval(7);
        let run = |layer: &crate::layer::ReformerAttention| {
            let x = x0.clone().require_grad();
            let out = layer.forward(x.clone(), Some(mask.clone()), &opts);
            let grads = (out.clone() * g.clone()).sum().backward();
            let mut all = vec![to_vec(out.inner()), to_vec(x.grad(&grads).expect("dx"))];
            for w in [&layer.query, &layer.value, &layer.output] {
                all.push(to_vec(
                    w.weight.val().grad(&grads).expect("weight gradient"),
                ));
            }
            all
        };
        let (a, t) = (run(&fused), run(&tensor));
        assert!(
            a[1].iter().zip(&t[1]).any(|(x, y)| x != y),
            "bit-identical input gradients: does `lsh_kernel` select the implementation?"
        );
        for (i, (x, y)) in a.iter().zip(&t).enumerate() {
            let diff = max_diff(x, y);
            assert!(
                diff < 1e-5,
                "len {l}, causal {causal}, dedup {dedup_rounds}: tensor {i} (0 output, 1 dx, \
                 2.. weights): max |fused - tensor| = {diff:e}"
            );
        }
    }
}

/// Bad shapes are errors that name them, not panics.
#[test]
fn fused_lsh_rejects_bad_shapes() {
    let device = dev();
    let params = ChunkParams {
        chunk_len: 4,
        before: 1,
        after: 0,
        causal: true,
        dedup_rounds: true,
        lsh_scores: LshScores::UnitKeys,
        kernel: LshKernel::Auto,
        key_eps: 0.0,
    };
    let qk = rand_tensor([1, 1, 10, 4], 1, &device);
    let buckets = Tensor::<4, Int>::zeros([1, 1, 2, 10], &device);
    let err = lsh_attention_fused(qk.clone(), qk, buckets, 2, None, params)
        .expect_err("10 is not a multiple of 4");
    assert!(err.to_string().contains("10"), "{err}");
}
