//! FLOPs per trained token, counted from a model's configuration, and the backend's own
//! matrix-product rate measured in the same run: the ceiling a model benchmark is held against.
//!
//! [`train_flops_per_token`] counts **model FLOPs** (as MFU counts them): the multiply-adds of
//! the matrix products the architecture needs, two FLOPs each, forward once and backward twice
//! (the gradients of the inputs and of the weights: x3 in all). Not counted: element-wise work
//! (LayerNorm, softmax, GELU, dropout, the optimizer), the embedding lookup, the kNN search
//! (not a trained product: its cost is the memory curve's), and recomputation (a reversible
//! layer's backward recomputes its forward; that is the implementation's cost, not the
//! model's). Attention is counted dense over every key a query may see (the causal half that a
//! kernel can skip is counted too, as the papers' implementations compute it), so the
//! achieved rate of an attention-heavy point is an *effective* rate.
//!
//! Per token, with `d` = `d_model`, `h` query heads and `g` key/value heads of width `e`,
//! `T` = `tgt_len`, `M` = `mem_len`, `L = T + M` keys, `B` rows, `V` the vocabulary, `f` =
//! `d_inner`, the forward pass of a layer costs:
//!
//! | part | FLOPs per token |
//! |---|---|
//! | `Q` (queries of the segment only) | `2 d h e` |
//! | `K`, `V` over `cat(memory, segment)` (the memory's are recomputed every segment) | `2 · 2 d g e · L / T` |
//! | output projection | `2 h e d` |
//! | scores `q·k` and values `Σ p v` over the `L` keys | `2 h e L + 2 h e L` |
//! | XL's position term `(q + v)·W_R r` (learned: `q·r`) | `2 h e L` |
//! | XL's `W_R r` over `L` relative positions, shared by the rows | `2 d h e · L / (T B)` |
//! | T5 (the Memorizing Transformer's local attention) | no product: a bias |
//! | kNN layer: the top-`k` retrieved pairs, scores and values | `+ 2 h e k + 2 h e k` |
//! | LSH (shared `QK`, `V`, output over `L`; `r` rounds of chunks of `c` that see `c (1 + before + after)` keys) | `2 · 2 d h e · L / T + 2 h e d + r · 2 · 2 h e c (1 + before + after)` |
//! | LSH hashing: the rotations of every key, `n_b / 2` per round | `2 h e · r n_b / 2 · L / T` |
//! | local (chunked, its own `Q`, `K`, `V`) | projections as dense, scores and values over `c (1 + before + after)` keys |
//! | feed-forward | `2 d f + 2 f d` |
//!
//! and the head `2 d V` (logits; no adaptive softmax). The train step is 3x the sum.

use std::sync::OnceLock;

use burn::tensor::{Device, Tensor};
use memzoo_stack::LayerKind;
use memzoo_stack::XlConfig;

/// FLOPs per trained token (forward + backward, x3) of `config` read in segments of `tgt_len`
/// tokens over its `mem_len` memory, `batch` rows per step. See the module docs for the
/// formula; `config` is the stack (`MemorizingConfig::stack`, `ReformerConfig::stack`).
pub fn train_flops_per_token(config: &XlConfig, tgt_len: usize, batch: usize) -> f64 {
    3.0 * forward_flops_per_token(config, tgt_len, batch)
}

/// FLOPs per token of the forward pass alone (evaluation): a third of
/// [`train_flops_per_token`].
pub fn forward_flops_per_token(config: &XlConfig, tgt_len: usize, batch: usize) -> f64 {
    let d = config.d_model as f64;
    let h = config.n_heads as f64;
    let e = config.head_width() as f64;
    let g = config.kv_heads.unwrap_or(config.n_heads) as f64;
    let t = tgt_len.max(1) as f64;
    let l = (tgt_len + config.mem_len) as f64;
    let b = batch.max(1) as f64;
    let f = config.d_inner as f64;
    let lsh = &config.lsh;
    let window = |chunk: usize, before: usize, after: usize| (chunk * (1 + before + after)) as f64;
    let mut total = 0.0;
    for kind in config.layer_kinds() {
        let ffn = 2.0 * d * f + 2.0 * f * d;
        let out = 2.0 * h * e * d;
        let dense = 2.0 * d * h * e + 2.0 * 2.0 * d * g * e * l / t + out;
        let scores_values = 2.0 * h * e * l + 2.0 * h * e * l;
        let attention = match kind {
            LayerKind::Xl => {
                dense + scores_values + 2.0 * h * e * l + 2.0 * d * h * e * l / (t * b)
            }
            LayerKind::Learned => dense + scores_values + 2.0 * h * e * l,
            LayerKind::T5 | LayerKind::Absolute | LayerKind::Rotary => dense + scores_values,
            LayerKind::Knn => {
                let k = config.knn.top_k as f64;
                dense + scores_values + 2.0 * h * e * k + 2.0 * h * e * k
            }
            LayerKind::Lsh => {
                let r = lsh.n_rounds as f64;
                let padded = (tgt_len + config.mem_len).div_ceil(lsh.chunk_len) * lsh.chunk_len;
                // The rotations' width (`ReformerAttention::buckets_for`; factored buckets
                // hash once per factor).
                let n_b = if lsh.bucket_factors.is_empty() {
                    lsh.n_buckets.unwrap_or_else(|| {
                        let n = padded.div_ceil(lsh.chunk_len).max(2);
                        n + n % 2
                    })
                } else {
                    lsh.bucket_factors.iter().sum()
                } as f64;
                let w = window(lsh.chunk_len, lsh.n_chunks_before, lsh.n_chunks_after);
                2.0 * 2.0 * d * h * e * l / t
                    + out
                    + r * (2.0 * h * e * w + 2.0 * h * e * w)
                    + 2.0 * h * e * r * (n_b / 2.0) * l / t
            }
            LayerKind::Local => {
                let w = window(
                    lsh.local_chunk_len.unwrap_or(lsh.chunk_len),
                    lsh.local_n_chunks_before.unwrap_or(lsh.n_chunks_before),
                    lsh.local_n_chunks_after.unwrap_or(lsh.n_chunks_after),
                );
                2.0 * d * h * e + 2.0 * 2.0 * d * h * e * l / t + out + 2.0 * h * e * w * 2.0
            }
        };
        total += attention + ffn;
    }
    total + 2.0 * d * config.vocab_size as f64
}

/// FLOPs per generated token (model FLOPs, forward only) of `config` generating `tokens`
/// tokens in segments of `segment_len` after a context of `context` tokens, as
/// `memzoo_train::generate` does:
/// - a stack that carries state (XL memory or kNN memory) keeps the tokens of its unfinished
///   segment as it reads them (`RecurrentModel::peek_continue`): the `i`-th new token, at
///   position `p = (context + i) mod segment_len` of its segment, is one query over the
///   memory's `m = min(context, mem_len)` keys and the segment's `p` earlier ones, and the token
///   that completes a segment reads the segment for good instead (`segment_len` tokens over
///   the memory). Its copy for generation (`TransformerXl::for_generation`) caches the
///   memory's keys and values and XL's `W_R r`, so a pass projects only its own positions: the
///   forward pass of its tokens without memory, plus the scores, the position term (XL) and
///   the values of each query over the cached keys, `(2 + 2 [+ 2 XL]) h e` per key;
/// - a stack without state (the Reformer) reads the window of the last `segment_len` tokens
///   again for every token: `segment_len` tokens' forward pass;
/// - a compressive or Block-Recurrent stack keeps what the tokens of its unfinished segment
///   leave as it reads them: the token at position `p` is one query over the compressed memory, the
///   memory and the segment's `p` earlier tokens (`m + p` keys, the compressed ones counted
///   as memory), whose keys and values are cached (a compressive stack's generator, and the
///   lucidrains Block-Recurrent layout's key/value memory) or, where the memory holds layer
///   inputs (memzoo's Block-Recurrent layout), projected again (a pass of one token over a
///   memory of `m + p` positions); the token that completes a segment reads it for good (the
///   compression and the Block-Recurrent state's attention and gates not counted);
/// - an RMT stack keeps the inputs of its read tokens (read once per segment) and of the
///   segment's tokens: the token at position `p` is one query over the `m` read tokens and the
///   `p` earlier ones, projecting their keys and values again; the token that completes the
///   segment reads it for good with the read and write tokens.
///
/// The mean over the `tokens` new tokens.
pub fn generation_flops_per_token(
    config: &XlConfig,
    context: usize,
    segment_len: usize,
    tokens: usize,
) -> f64 {
    let s = segment_len.max(1);
    let fixed_state =
        config.compressive.is_some() || config.rmt.is_some() || config.block_recurrent.is_some();
    let stateful = config.mem_len > 0 || config.layer_kinds().contains(&LayerKind::Knn);
    if !stateful && !fixed_state {
        return forward_flops_per_token(config, s, 1) * s as f64;
    }
    let h = config.n_heads as f64;
    let e = config.head_width() as f64;
    let local = config.clone().with_mem_len(0);
    let d = config.d_model as f64;
    // Per query over `keys` cached keys: their scores, values and (XL) position term; less
    // XL's `W_R r` of the pass's own positions, which the forward pass counts and the table
    // reads instead.
    let per_query = |keys: f64| -> f64 {
        config
            .layer_kinds()
            .iter()
            .map(|k| match k {
                LayerKind::Xl => 6.0 * h * e * keys - 2.0 * d * h * e,
                LayerKind::Learned => 6.0 * h * e * keys,
                _ => 4.0 * h * e * keys,
            })
            .sum()
    };
    let tokens = tokens.max(1);
    if fixed_state {
        let cmem = config.compressive.as_ref().map_or(0, |c| c.cmem_len);
        let read_tokens = config.rmt.as_ref().map_or(0, |r| r.mem_tokens);
        let memories = context.min(config.mem_len + cmem);
        // The keys before the segment: the memories, an RMT's read tokens.
        let m = memories + read_tokens;
        let over = |memory: usize| config.clone().with_mem_len(memory);
        let cached = config.compat.memory_keys_values || config.compressive.is_some();
        let head = 2.0 * d * config.vocab_size as f64;
        let total: f64 = (0..tokens)
            .map(|i| match (context + i) % s {
                // One query over the memories and the segment's `p` earlier tokens: their keys
                // and values cached, or projected again from their inputs.
                p if p + 1 < s => {
                    let query = match cached {
                        true => forward_flops_per_token(&local, 1, 1) + per_query((m + p) as f64),
                        false => forward_flops_per_token(&over(m + p), 1, 1),
                    };
                    // An RMT's read tokens, read once per segment (they see only its XL
                    // memory and each other; no head).
                    let t = read_tokens as f64;
                    let read = match p == 0 && read_tokens > 0 {
                        true => {
                            t * (forward_flops_per_token(&over(memories), read_tokens, 1) - head)
                        }
                        false => 0.0,
                    };
                    query + read
                }
                // The token that completes the segment reads it for good (with an RMT's read
                // and write tokens).
                p => {
                    let rows = p + 1 + 2 * read_tokens;
                    rows as f64 * forward_flops_per_token(&over(memories), rows, 1)
                }
            })
            .sum();
        return total / tokens as f64;
    }
    let m = context.min(config.mem_len) as f64;
    let total: f64 = (0..tokens)
        .map(|i| match (context + i) % s {
            // The token completes its segment: the segment read for good over the memory.
            p if p + 1 == s => s as f64 * (forward_flops_per_token(&local, s, 1) + per_query(m)),
            // One query over the memory and the segment's `p` earlier tokens.
            p => forward_flops_per_token(&local, 1, 1) + per_query(m + p as f64),
        })
        .sum();
    total / tokens as f64
}

/// The size of the matrix product [`sgemm_gflops`] times: XL-small's feed-forward input
/// (`[8 x 128, 256] x [256, 1024]`), the product that dominates the reference configs.
pub const SGEMM_SHAPE: [usize; 3] = [1024, 256, 1024];

/// The backend's own rate for one float32 matrix product of [`SGEMM_SHAPE`] (`m x k` times
/// `k x n`) on `device`, in GFLOP/s: the median of 20 products after 3 untimed ones, each
/// synchronised. Measured once per process (the first call; later calls return it), with the
/// threads the benchmark runs with.
pub fn sgemm_gflops(device: &Device) -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        let [m, k, n] = SGEMM_SHAPE;
        let a = Tensor::<2>::random([m, k], burn::tensor::Distribution::Normal(0.0, 1.0), device);
        let b = Tensor::<2>::random([k, n], burn::tensor::Distribution::Normal(0.0, 1.0), device);
        let run = || {
            let c = a.clone().matmul(b.clone());
            let _ = c.into_data();
        };
        let times = crate::measure::time_steps(3, 20, run);
        2.0 * (m * k * n) as f64 / crate::measure::median(&times) / 1e9
    })
}

/// The FLOP fields of a model measurement: `flops_per_token` (x3 for training, x1 for an
/// evaluation), the achieved GFLOP/s at the measured tokens/s and its ratio to the backend's
/// matrix-product rate measured in the same process ([`sgemm_gflops`]).
pub fn annotate(m: &mut crate::measure::Measurement, flops_per_token: f64, device: &Device) {
    let sgemm = sgemm_gflops(device);
    let achieved = flops_per_token * m.tokens_per_s / 1e9;
    m.flops_per_token = Some(flops_per_token);
    m.gflops = Some(achieved);
    m.sgemm_gflops = Some(sgemm);
    m.of_sgemm = Some(achieved / sgemm);
}
