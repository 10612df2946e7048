//! Attention alone, forward + backward, batch 1, 8 heads x 64, causal, across sequence
//! lengths. Each point runs in its own process so that its peak memory is its own.
//!
//! - `full`: softmax(QK^T) V with explicit `[len, len]` scores (on q, k, v: no projections);
//! - `lsh`: Reformer LSH attention, shared QK, bucket 64, 4 rounds (on q, v): the fused CPU
//!   kernel on flex (`LshKernel::Auto`); `lsh_tensor` (not in the suite): the same with Burn
//!   tensor ops (`LshKernel::Tensor`);
//! - `xl`: a whole Transformer-XL relative attention layer (`memzoo_relative`, d_model 512:
//!   projections W_q, W_kv, W_R, W_o, the u/v biases and the relative shift), the segment
//!   attending to itself (no memory), so the same `len x len` scores as `full`;
//! - `knn`: a whole kNN-augmented attention layer (`memzoo_knn::KnnAttention`, d_model 512,
//!   T5-biased local attention over the segment, gated with top-32 attention over an exact
//!   memory of 16,384 pairs per head, filled before timing). Its time includes the search;
//!   its peak memory includes the memory (2 x 8 x 16,384 x 64 floats = 64 MiB).

use std::time::Instant;

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Tensor, TensorData};
use memzoo_reformer::attention::MASKED;
use memzoo_reformer::rng::random_rotations;
use memzoo_reformer::{ChunkParams, LshKernel, LshScores, lsh_attention};

use crate::BenchArgs;
use crate::measure::{Measurement, peak_rss_kib};

/// The kinds of the suite, in order.
pub const KINDS: [&str; 4] = ["full", "lsh", "xl", "knn"];

/// kNN memory of the `knn` points: pairs per head, retrieved per query.
const KNN_STORED: usize = 16_384;
const KNN_TOP_K: usize = 32;

/// The lengths of the suite.
pub fn lengths(quick: bool) -> Vec<usize> {
    if quick {
        vec![1024, 2048]
    } else {
        vec![1024, 2048, 4096, 8192, 16384]
    }
}

/// One point, in this process: `attention-full-1024`, `attention-lsh-4096`, ...
pub fn one(target: &str, args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    let mut parts = target.split('-').skip(1);
    let kind = parts.next().unwrap_or_default();
    let len: usize = parts
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| format!("bad attention target `{target}`"))?;
    let reps = args.steps.unwrap_or(if args.quick { 1 } else { 3 });
    let device = device.clone().autodiff();
    let (seconds, peak_kib, config) = match kind {
        "full" | "lsh" | "lsh_tensor" => {
            let attention = if kind == "full" {
                BenchAttention::Full
            } else {
                BenchAttention::Lsh {
                    bucket_size: 64,
                    n_rounds: 4,
                    kernel: if kind == "lsh" {
                        LshKernel::Auto
                    } else {
                        LshKernel::Tensor
                    },
                }
            };
            let t = attention_fwd_bwd(attention, len, 8, 64, reps, &device);
            let config = if kind == "full" {
                serde_json::json!({})
            } else {
                serde_json::json!({"bucket_size": 64, "n_rounds": 4, "kernel": kind})
            };
            (t.seconds, t.peak_rss_kib, config)
        }
        "xl" => {
            let seconds = xl_fwd_bwd(len, reps, &device)?;
            (
                seconds,
                peak_rss_kib(),
                serde_json::json!({"d_model": 512, "mem_len": 0}),
            )
        }
        "knn" => {
            let seconds = knn_fwd_bwd(len, reps, &device)?;
            (
                seconds,
                peak_rss_kib(),
                serde_json::json!({"d_model": 512, "stored_per_head": KNN_STORED,
                    "top_k": KNN_TOP_K, "index": "exact"}),
            )
        }
        other => {
            return Err(format!(
                "unknown attention `{other}`: expected one of {}",
                KINDS.join(", ")
            ));
        }
    };
    let mut config_all = serde_json::json!({"attention": kind, "len": len, "batch": 1,
        "heads": 8, "d_head": 64, "causal": true});
    if let (Some(all), Some(extra)) = (config_all.as_object_mut(), config.as_object()) {
        all.extend(extra.clone());
    }
    Ok(Measurement {
        name: format!("attention-{kind}-{len}"),
        implementation: "memzoo".into(),
        backend: args.device.clone(),
        threads: args.threads,
        config: config_all,
        steps: reps,
        step_s_median: seconds,
        step_s_min: seconds,
        step_s_max: seconds,
        tokens_per_s: len as f64 / seconds,
        params: 0,
        peak_rss_mb: peak_kib as f64 / 1024.0,
        ..Default::default()
    })
}

/// Random `[1, len, width]` input drawn from `seed`, requiring gradients.
fn random_input(len: usize, width: usize, seed: u64, device: &Device) -> Tensor<3> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let data: Vec<f32> = (0..len * width)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    Tensor::<3>::from_data(TensorData::new(data, [1, len, width]), device).require_grad()
}

/// The context of a causal self-attention over `len` positions with no memory.
fn causal_context(
    positions: &memzoo_relative::PositionConfig,
    d_model: usize,
    len: usize,
    device: &Device,
) -> memzoo_relative::RelativeContext {
    use memzoo_relative::{AttentionMask, RelativeContext};
    RelativeContext::new(positions, d_model, len, 0, &AttentionMask::causal(), device)
}

/// Mean seconds of `reps` runs of `run` after one warm-up run.
fn timed(reps: usize, mut run: impl FnMut(u64) -> Result<f32, String>) -> Result<f64, String> {
    run(0)?;
    let reps = reps.max(1);
    let start = Instant::now();
    for r in 0..reps {
        run(r as u64 + 1)?;
    }
    Ok(start.elapsed().as_secs_f64() / reps as f64)
}

/// Forward + backward of a Transformer-XL relative attention layer (8 heads x 64) over a
/// segment of `len` tokens with no memory; `device` is an autodiff device.
fn xl_fwd_bwd(len: usize, reps: usize, device: &Device) -> Result<f64, String> {
    use memzoo_relative::{PositionConfig, RelativeAttentionConfig};
    let d_model = 512;
    let layer = RelativeAttentionConfig::new(d_model, 8, 64)
        .init(device)
        .map_err(|e| e.to_string())?;
    let positions = PositionConfig::new();
    timed(reps, |seed| {
        let x = random_input(len, d_model, seed, device);
        let ctx = causal_context(&positions, d_model, len, device);
        let out = layer
            .forward(x.clone(), None, &ctx, None)
            .map_err(|e| e.to_string())?;
        let grads = out.sum().backward();
        Ok(x.grad(&grads).map(|g| g.sum().into_scalar()).unwrap_or(0.0))
    })
}

/// Forward + backward of a kNN-augmented attention layer (8 heads x 64, top-32) over `len`
/// tokens, searching an exact memory of [`KNN_STORED`] pairs per head (filled first, not
/// updated while timing); `device` is an autodiff device.
fn knn_fwd_bwd(len: usize, reps: usize, device: &Device) -> Result<f64, String> {
    use memzoo_knn::KnnAttentionConfig;
    use memzoo_memory::keys::{clustered_keys, fill};
    use memzoo_memory::{IndexKind, KnnMemoryConfig};
    use memzoo_relative::{PositionConfig, PositionKind};
    let (d_model, heads, d_head) = (512, 8, 64);
    let layer = KnnAttentionConfig::new(d_model, heads, d_head)
        .init(device)
        .map_err(|e| e.to_string())?;
    let mut memory = KnnMemoryConfig::new(heads, d_head)
        .with_max_memories(KNN_STORED)
        .with_kind(IndexKind::Exact)
        .init(1, device)
        .map_err(|e| e.to_string())?;
    let keys = clustered_keys(KNN_STORED, d_head, 256, 0.6, 20);
    fill(memory.as_mut(), &keys, KNN_STORED, 2048, device).map_err(|e| e.to_string())?;
    let positions = PositionConfig::new().with_kind(PositionKind::T5);
    timed(reps, |seed| {
        let x = random_input(len, d_model, seed, device);
        let ctx = causal_context(&positions, d_model, len, device);
        let out = layer
            .forward(x.clone(), None, &ctx, memory.as_ref(), KNN_TOP_K)
            .map_err(|e| e.to_string())?;
        let grads = out.output.sum().backward();
        Ok(x.grad(&grads).map(|g| g.sum().into_scalar()).unwrap_or(0.0))
    })
}

/// The suite: every (kind, length) in a child process; a kind stops at the first length
/// that takes more than 120 s or fails (out of memory).
pub fn suite(args: &BenchArgs) -> Result<Vec<Measurement>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for kind in KINDS {
        for len in args.lengths.clone().unwrap_or_else(|| lengths(args.quick)) {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([
                "bench",
                &format!("attention-{kind}-{len}"),
                "--device",
                &args.device,
            ])
            .args(["--threads", &args.threads.to_string()]);
            if args.quick {
                cmd.arg("--quick");
            }
            if let Some(steps) = args.steps {
                cmd.args(["--steps", &steps.to_string()]);
            }
            let output = cmd.output().map_err(|e| e.to_string())?;
            let line = String::from_utf8_lossy(&output.stdout)
                .lines()
                .find(|l| l.starts_with('{'))
                .map(str::to_string);
            match line.and_then(|l| serde_json::from_str::<Measurement>(&l).ok()) {
                Some(m) if output.status.success() => {
                    let slow = m.step_s_median > 120.0;
                    out.push(m);
                    if slow {
                        break;
                    }
                }
                _ => {
                    eprintln!("attention-{kind}-{len}: failed (out of memory?), series stopped");
                    break;
                }
            }
        }
    }
    Ok(out)
}

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
                    memzoo_reformer::rng::normal_vec(shape.iter().product(), s),
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
