//! Timing helpers for `cargo xtask bench`: attention alone, forward + backward.

use std::time::Instant;

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Tensor};

use crate::attention::{ChunkParams, LshKernel, LshScores, MASKED, lsh_attention};
use crate::rng::random_rotations;

/// Which attention [`attention_fwd_bwd`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum BenchAttention {
    /// Full causal attention with an explicit `QK^T` (`[len, len]` scores per head).
    Full,
    /// LSH attention (shared QK) with this bucket size and number of rounds.
    Lsh {
        /// Chunk length = bucket size.
        bucket_size: usize,
        /// Hash rounds.
        n_rounds: usize,
        /// Fused kernel (on flex) or tensor ops.
        kernel: LshKernel,
    },
}

/// One measurement of [`attention_fwd_bwd`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AttentionTiming {
    /// The attention timed.
    pub attention: BenchAttention,
    /// Sequence length.
    pub len: usize,
    /// Heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
    /// Seconds of one forward + backward (mean of the timed repetitions).
    pub seconds: f64,
    /// Peak resident set size of the process after the run (KiB, Linux `VmHWM`; 0 elsewhere).
    pub peak_rss_kib: u64,
}

/// Full causal attention with explicit scores: `softmax(QK^T / sqrt(d) + mask) V`.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, len, d_head]`; output likewise
pub fn full_causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let [b, h, l, dh] = q.dims();
    let scores = q
        .matmul(k.swap_dims(2, 3))
        .mul_scalar((dh as f64).powf(-0.5));
    let future = Tensor::<2, Bool>::triu_mask([l, l], 1, &scores.device())
        .reshape([1, 1, l, l])
        .expand([b, h, l, l]);
    softmax(scores.mask_fill(future, MASKED), 3).matmul(v)
}

/// Peak RSS of this process in KiB (Linux), 0 when unknown.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Times forward + backward of causal self-attention alone: batch 1, `n_heads x d_head`,
/// length `len`, inputs drawn at random on `device` (an autodiff device) before the clock
/// starts (as the peer's benchmark draws them). One warm-up run, then the mean of `reps` runs.
/// Peak memory is the process's `VmHWM`: run one configuration
/// per process to attribute it.
pub fn attention_fwd_bwd(
    attention: BenchAttention,
    len: usize,
    n_heads: usize,
    d_head: usize,
    reps: usize,
    device: &Device,
) -> AttentionTiming {
    let shape = [1, n_heads, len, d_head];
    let inputs = |seed: u64| {
        let rand = |s: u64| {
            Tensor::<4>::from_data(
                burn::tensor::TensorData::new(
                    crate::rng::normal_vec(shape.iter().product(), s),
                    shape,
                ),
                device,
            )
            .require_grad()
        };
        (rand(seed), rand(seed + 1), rand(seed + 2), seed)
    };
    let run = |(q, k, v, seed): (Tensor<4>, Tensor<4>, Tensor<4>, u64)| {
        let out = match attention {
            BenchAttention::Full => full_causal_attention(q.clone(), k, v.clone()),
            BenchAttention::Lsh {
                bucket_size,
                n_rounds,
                kernel,
            } => {
                let n_buckets = (len / bucket_size).max(2);
                let n_buckets = n_buckets + n_buckets % 2;
                let rot = random_rotations(d_head, n_rounds, n_buckets, seed + 3, device);
                let params = ChunkParams {
                    chunk_len: bucket_size,
                    before: 1,
                    after: 0,
                    causal: true,
                    dedup_rounds: true,
                    lsh_scores: LshScores::UnitKeys,
                    kernel,
                    key_eps: 0.0,
                };
                lsh_attention(q.clone(), v.clone(), rot, None, params, None)
            }
        };
        let grads = out.sum().backward();
        // force the gradients to be computed and read back
        let g: f32 = q.grad(&grads).map(|g| g.sum().into_scalar()).unwrap_or(0.0);
        let g2: f32 = v.grad(&grads).map(|g| g.sum().into_scalar()).unwrap_or(0.0);
        g + g2
    };
    let _ = run(inputs(0));
    let reps = reps.max(1);
    let all: Vec<_> = (0..reps).map(|r| inputs(10 * (r as u64 + 1))).collect();
    let start = Instant::now();
    for x in all {
        let _ = run(x);
    }
    AttentionTiming {
        attention,
        len,
        n_heads,
        d_head,
        seconds: start.elapsed().as_secs_f64() / reps as f64,
        peak_rss_kib: peak_rss_kib(),
    }
}
