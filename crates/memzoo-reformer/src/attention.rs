//! LSH self-attention and local (chunked) self-attention (Kitaev et al. 2020, sec. 2 and 3).

use burn::tensor::activation::softmax;
use burn::tensor::kind::Basic;
use burn::tensor::{Bool, IndexingUpdateOp, Int, Tensor};

use crate::rng::{dropout_mask, mix};

/// Score of a hidden key (causal, padding, outside the window).
pub const MASKED: f32 = -1.0e9;
/// Score of a query's own key under shared QK: lower than any real score, higher than
/// [`MASKED`], so a token attends to itself only when nothing else is available.
pub const SELF_SCORE: f32 = -5.0e4;

/// Mode and randomness of one forward pass.
///
/// Hash rotations and dropout masks are drawn from `seed` (mixed with the layer index), so the
/// same options replay the same pass exactly — the reversible backward relies on it.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOptions {
    /// Seed of this pass.
    pub seed: u64,
    /// Training mode: dropout is active.
    pub train: bool,
    /// Overrides every LSH layer's number of hash rounds (e.g. evaluate with 1, 2, 4, 8).
    pub n_rounds: Option<usize>,
}

impl ForwardOptions {
    /// Evaluation: no dropout, rotations fixed by `seed`.
    pub fn eval(seed: u64) -> Self {
        Self {
            seed,
            train: false,
            n_rounds: None,
        }
    }

    /// Training: dropout on, rotations and masks drawn from `seed`.
    pub fn train(seed: u64) -> Self {
        Self {
            seed,
            train: true,
            n_rounds: None,
        }
    }

    /// The same options with `n_rounds` hash rounds in every LSH layer.
    pub fn with_rounds(mut self, n_rounds: usize) -> Self {
        self.n_rounds = Some(n_rounds);
        self
    }

    /// The options of sub-component `tag` (a layer, a dropout site): a derived seed.
    pub fn child(&self, tag: u64) -> Self {
        Self {
            seed: mix(self.seed, tag),
            ..self.clone()
        }
    }
}

/// How LSH attention scores a query against its shared-QK keys `k̂_j = q_j / |q_j|`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LshScores {
    /// `s_ij = q_i · k̂_j`: keys of unit length and no further scale, as trax (the Reformer
    /// authors' code) and HF's `ReformerModel` score them (HF's `_len_and_dim_norm` divides
    /// the key by its RMS and then by `sqrt(d_head)`, which is unit length). The default.
    #[default]
    UnitKeys,
    /// `s_ij = q_i · k̂_j / sqrt(d_head)`, as reformer-pytorch (lucidrains) scores them.
    ScaledUnitKeys,
}

/// Which implementation runs LSH attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LshKernel {
    /// Chosen by device: the fused CPU kernel ([`memzoo_fused::lsh_attention_fused`], one
    /// multi-threaded op with a hand-written backward) on the `flex` backend when attention
    /// dropout is off; Burn tensor ops otherwise (every other backend, or dropout on). The
    /// default.
    #[default]
    Auto,
    /// Burn tensor ops on every backend (the reference the fused kernel is tested against).
    Tensor,
}

/// How queries see neighbouring chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkParams {
    /// Length of a chunk (the LSH bucket size).
    pub chunk_len: usize,
    /// Chunks before its own that a chunk attends to.
    pub before: usize,
    /// Chunks after its own that a chunk attends to.
    pub after: usize,
    /// Hide keys whose original position is after the query's.
    pub causal: bool,
    /// LSH: count a (query, key) pair found in several hash rounds once: its score is lowered
    /// by `log(number of rounds whose windows hold the pair)`, the count taken per round from
    /// the chunks the two positions fall in. The mixture of rounds is then close to attention
    /// over the union of candidates, not exactly it: a window at the edge of a round's block of
    /// the sorted sequence reaches into the neighbouring round's block (the chunk window wraps
    /// across rounds), so a key can appear twice in one round's window, and such repeats are not
    /// counted. Ignored by local attention.
    pub dedup_rounds: bool,
    /// LSH: the score convention (local attention always scales `q · k` by `1/sqrt(d_head)`).
    pub lsh_scores: LshScores,
    /// LSH: fused kernel or tensor ops (ignored by local attention).
    pub kernel: LshKernel,
    /// LSH: epsilon of the key normalisation, `k̂_j = q_j / sqrt(|q_j|² + d_head·ε)`, i.e.
    /// `q_j · rsqrt(mean(q_j²) + ε) / sqrt(d_head)` as trax's `length_normalized` and HF's
    /// `_len_and_dim_norm` compute it (both `ε = 1e-6`); 0: `q_j / |q_j|` (floored at 1e-6).
    /// The fused kernel runs only with 0 (else tensor ops).
    pub key_eps: f64,
}

/// Bucket ids of `x` under random rotations: `h(x) = argmax([xR; -xR])` per round (eq. in sec. 2).
///
/// # Shapes
/// - `x`: `[batch, heads, len, d_head]`
/// - `rotations`: `[d_head, n_rounds, n_buckets / 2]`
/// - output: `[batch, heads, n_rounds, len]`, ids in `0..n_buckets` (no round offsets)
pub fn hash_buckets(x: Tensor<4>, rotations: Tensor<3>) -> Tensor<4, Int> {
    let [b, h, l, dh] = x.dims();
    let [_, r, half] = rotations.dims();
    let rot = rotations
        .reshape([1, 1, dh, r * half])
        .expand([b, h, dh, r * half]);
    // xR: [b, h, l, r, n_buckets / 2]
    let rotated = x.matmul(rot).reshape([b, h, l, r, half]);
    let both = Tensor::cat(vec![rotated.clone(), rotated.neg()], 4);
    both.argmax(4).reshape([b, h, l, r]).swap_dims(2, 3)
}

/// Bucket ids under per-head rotations and a factorised bucket count, as HF's
/// `LSHSelfAttention._hash_vectors` computes them: with factors `[f_1, .., f_k]` (one factor:
/// a plain count) the rotated vector `xR` is cut into `k` parts of `f_i / 2` columns,
/// `h_i(x) = argmax([xR_i; -xR_i])` in `0..f_i`, and the bucket is
/// `h_1 + f_1 h_2 + f_1 f_2 h_3 + ...` in `0..Π f_i`. With one head of rotations and one
/// factor this is [`hash_buckets`].
///
/// # Shapes
/// - `x`: `[batch, heads, len, d_head]`
/// - `rotations`: `[heads or 1, d_head, n_rounds, Σ f_i / 2]` (HF's layout)
/// - output: `[batch, heads, n_rounds, len]`
pub fn hash_buckets_factored(
    x: Tensor<4>,
    rotations: Tensor<4>,
    factors: &[usize],
) -> Tensor<4, Int> {
    let [b, h, l, dh] = x.dims();
    let [rh, _, r, half] = rotations.dims();
    let rot = rotations
        .reshape([1, rh, dh, r * half])
        .expand([b, h, dh, r * half]);
    let rotated = x.matmul(rot).reshape([b, h, l, r, half]);
    let argmax = |part: Tensor<5>| Tensor::cat(vec![part.clone(), part.neg()], 4).argmax(4);
    let ids = if factors.len() <= 1 {
        argmax(rotated)
    } else {
        let (mut ids, mut offset, mut product) = (None, 0, 1i64);
        for &f in factors {
            let part = rotated.clone().narrow(4, offset, f / 2);
            let id = argmax(part).mul_scalar(product);
            ids = Some(match ids {
                Some(acc) => acc + id,
                None => id,
            });
            offset += f / 2;
            product *= f as i64;
        }
        ids.expect("at least two factors")
    };
    ids.reshape([b, h, l, r]).swap_dims(2, 3)
}

/// [`hash_buckets`] by the fused kernel ([`memzoo_fused::lsh_hash_fused`], which never holds
/// the `[.., n_rounds, n_buckets]` scores) where `kernel` is [`LshKernel::Auto`] and the device
/// is `flex`; by tensor ops otherwise.
///
/// # Shapes
/// as [`hash_buckets`]
pub fn hash_buckets_with(x: Tensor<4>, rotations: Tensor<3>, kernel: LshKernel) -> Tensor<4, Int> {
    if kernel == LshKernel::Auto && memzoo_fused::supports(&x.device()) {
        let [b, h, l, dh] = x.dims();
        let r = rotations.dims()[1];
        // The checks of the fused op hold for any input `hash_buckets` takes: an error would be
        // a bug, and the tensor-op path below the fallback.
        if let Ok(ids) =
            memzoo_fused::lsh_hash_fused(x.clone().reshape([b * h, l, dh]), rotations.clone())
        {
            return ids.reshape([b, h, r, l]);
        }
    }
    hash_buckets(x, rotations)
}

/// `x` followed by its chunks `1..=before` back and `1..=after` ahead, along dim 2.
///
/// Rolls along the chunk axis (dim 1), so the first chunk's "previous" chunk is the last one;
/// callers mask by position where that matters.
fn look_around<const D: usize, K: Basic>(
    x: Tensor<D, K>,
    before: usize,
    after: usize,
) -> Tensor<D, K> {
    let mut parts = vec![x.clone()];
    for s in 1..=before {
        parts.push(x.clone().roll_dim(s as i64, 1));
    }
    for s in 1..=after {
        parts.push(x.clone().roll_dim(-(s as i64), 1));
    }
    if parts.len() == 1 {
        return x;
    }
    Tensor::cat(parts, 2)
}

/// Inputs of [`chunked_attention`], already cut into chunks.
struct Chunked {
    /// `[n, n_chunks, chunk_len, d_head]`.
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    /// Original position of every element, `[n, n_chunks, chunk_len]`.
    pos: Tensor<3, Int>,
    /// Padding keys (`true` = hidden), `[n, n_chunks, chunk_len]`.
    pad: Option<Tensor<3, Bool>>,
    /// LSH de-duplication: for every round, the chunk holding each sorted element in that
    /// round (as floats), `[n_rounds]` x `[n, n_chunks, chunk_len]`.
    round_locs: Vec<Tensor<3>>,
}

/// Whether a key `d = k - q` chunks after its query's chunk (sorted order, `|d| < nc`) is in
/// the query's window of `before` chunks back and `after` ahead, which wraps around the `nc`
/// chunks: `(d + before) mod nc <= before + after`.
///
/// With `u = d + before` in `(before - nc, before + nc)` and `B = before + after < nc` that is
/// `0 <= u <= B`, or `u >= nc` (then `u - nc < before <= B`), or `u + nc <= B`. Comparisons
/// only: the chunk indices are small integers held as floats, and flex's float remainder and
/// floor are scalar library calls (they took a quarter of a Reformer step).
pub(crate) fn in_window<const D: usize>(
    d: Tensor<D>,
    nc: usize,
    before: usize,
    after: usize,
) -> Tensor<D, Bool> {
    let u = d.add_scalar(before as f64);
    let b = (before + after) as f64;
    u.clone()
        .greater_equal_elem(-0.5)
        .bool_and(u.clone().lower_equal_elem(b + 0.5))
        .bool_or(u.clone().greater_equal_elem(nc as f64 - 0.5))
        .bool_or(u.lower_equal_elem(b - nc as f64 + 0.5))
}

/// Attention inside chunks, each also seeing `before` / `after` neighbouring chunks.
///
/// `shared_qk`: a query's own key gets [`SELF_SCORE`]; `window`: keys outside the chunk window
/// by original position are hidden (local attention; LSH lets the window wrap around).
/// Returns the outputs `[n, n_chunks, chunk_len, d_head]` and the log-partition `[.., 1]`.
fn chunked_attention(
    input: Chunked,
    params: ChunkParams,
    shared_qk: bool,
    window: bool,
    dropatt: Option<(f64, u64)>,
) -> (Tensor<4>, Tensor<4>) {
    let Chunked {
        q,
        k,
        v,
        pos,
        pad,
        round_locs,
    } = input;
    let [n, nc, c, dh] = q.dims();
    // Distinct neighbour chunks only: with few chunks the roll would repeat a chunk.
    let before = params.before.min(nc - 1);
    let after = params.after.min(nc - 1 - before);
    let k = look_around(k, before, after);
    let v = look_around(v, before, after);
    let kpos = look_around(pos.clone(), before, after);
    let w = c * (1 + before + after);

    // Local: s_ij = q_i · k_j / sqrt(d_head); LSH: s_ij = q_i · k̂_j (trax, HF) or
    // q_i · k̂_j / sqrt(d_head) (reformer-pytorch). The scale goes on q: 1/w of the work.
    let scale = match (shared_qk, params.lsh_scores) {
        (true, LshScores::UnitKeys) => 1.0,
        _ => (dh as f64).powf(-0.5),
    };
    let scores = q.mul_scalar(scale).matmul(k.swap_dims(2, 3));
    let shape = [n, nc, c, w];
    let qp = pos.unsqueeze_dim::<4>(3).expand(shape);
    let kp = kpos.unsqueeze_dim::<4>(2).expand(shape);
    let mut scores = scores;
    if shared_qk {
        scores = scores.mask_fill(qp.clone().equal(kp.clone()), SELF_SCORE);
    }
    if !round_locs.is_empty() {
        // count_ij = #rounds whose chunk windows hold (i, j); s_ij -= log count_ij
        let mut count: Option<Tensor<4>> = None;
        for loc in round_locs {
            let kl = look_around(loc.clone(), before, after).unsqueeze_dim::<4>(2);
            let ql = loc.unsqueeze_dim::<4>(3);
            let inside = in_window(kl - ql, nc, before, after).float();
            count = Some(match count {
                Some(c) => c + inside,
                None => inside,
            });
        }
        if let Some(count) = count {
            scores = scores - count.clamp_min(1.0).log();
        }
    }
    let mut hidden: Option<Tensor<4, Bool>> = None;
    let mut hide = |m: Tensor<4, Bool>| {
        hidden = Some(match hidden.take() {
            Some(h) => h.bool_or(m),
            None => m,
        })
    };
    if params.causal {
        hide(kp.clone().greater(qp.clone()));
    }
    if window {
        let qc = qp.div_scalar(c as i64);
        let kc = kp.div_scalar(c as i64);
        hide(kc.clone().lower(qc.clone().sub_scalar(before as i64)));
        hide(kc.greater(qc.add_scalar(after as i64)));
    }
    if let Some(pad) = pad {
        let kpad = look_around(pad, before, after);
        hide(kpad.unsqueeze_dim::<4>(2).expand(shape));
    }
    if let Some(h) = hidden {
        scores = scores.mask_fill(h, MASKED);
    }
    // e_ij = exp(s_ij - m_i), Z_i = Σ_j e_ij: p_ij = e_ij / Z_i, log Z_i + m_i = logsumexp_j s_ij
    // (one exp over the scores, not two)
    let max = scores.clone().max_dim(3).detach();
    let e = (scores - max.clone()).exp();
    let z = e.clone().sum_dim(3);
    let mut p = e / z.clone();
    let lse = z.log() + max;
    if let Some((rate, seed)) = dropatt
        && let Some(mask) = dropout_mask(shape, rate, seed, &p.device())
    {
        p = p * mask;
    }
    (p.matmul(v), lse)
}

/// LSH attention on projected heads (sec. 2): hash, sort by (bucket, position), attend inside
/// chunks, undo the sort and mix the rounds by their log-partitions.
///
/// The keys are the unit-normalised queries (shared QK). `len` must be a multiple of
/// `params.chunk_len` (the layer pads); `key_pad` marks hidden keys (`true` = padding).
/// With rounds `r`, outputs `o_r` and log-partitions `z_r`, the result is
/// `Σ_r softmax_r(z_r) o_r` — attention over the union of the rounds' candidate sets (nearly
/// so with `params.dedup_rounds`, which counts a pair found in several rounds once; see
/// [`ChunkParams::dedup_rounds`] for the repeats it misses).
/// One set of rotations is shared by every batch row and head.
///
/// Causality: no output depends on the *value* of a later token (keys are masked by original
/// position). As in the paper, *which* earlier keys share a query's chunk can depend on the
/// hashes of later tokens, since they shift the chunk boundaries of the sorted sequence.
///
/// # Shapes
/// - `qk`, `v`: `[batch, heads, len, d_head]`
/// - `rotations`: `[d_head, n_rounds, n_buckets / 2]`
/// - `key_pad`: `[batch, len]`
/// - output: `[batch, heads, len, d_head]`
pub fn lsh_attention(
    qk: Tensor<4>,
    v: Tensor<4>,
    rotations: Tensor<3>,
    key_pad: Option<Tensor<2, Bool>>,
    params: ChunkParams,
    dropatt: Option<(f64, u64)>,
) -> Tensor<4> {
    let n_buckets = 2 * rotations.dims()[2];
    let buckets = hash_buckets_with(qk.clone().detach(), rotations, params.kernel);
    lsh_attention_with_buckets(qk, v, buckets, n_buckets, key_pad, params, dropatt)
}

/// [`lsh_attention`] with the bucket ids given instead of hashed from `qk`: the reversible
/// backward replays the forward pass's buckets, since hashing the rebuilt input (which carries
/// rounding error) can flip an argmax and so differentiate another sparsity pattern.
///
/// # Shapes
/// - `qk`, `v`: `[batch, heads, len, d_head]`
/// - `buckets`: `[batch, heads, n_rounds, len]`, ids in `0..n_buckets` (as [`hash_buckets`])
/// - `key_pad`: `[batch, len]`
/// - output: `[batch, heads, len, d_head]`
pub fn lsh_attention_with_buckets(
    qk: Tensor<4>,
    v: Tensor<4>,
    buckets: Tensor<4, Int>,
    n_buckets: usize,
    key_pad: Option<Tensor<2, Bool>>,
    params: ChunkParams,
    dropatt: Option<(f64, u64)>,
) -> Tensor<4> {
    let [b, h, l, dh] = qk.dims();
    let r = buckets.dims()[2];
    debug_assert_eq!(
        buckets.dims(),
        [b, h, r, l],
        "bucket ids per (row, head, round, position)"
    );
    if params.kernel == LshKernel::Auto
        && dropatt.is_none()
        && params.key_eps == 0.0
        && memzoo_fused::supports(&qk.device())
    {
        // The checks of the fused op hold here (the layer pads to a multiple of the chunk), so
        // an error would be a bug: the tensor-op path below is the fallback.
        if let Ok(out) = lsh_attention_fused(
            qk.clone(),
            v.clone(),
            buckets.clone(),
            n_buckets,
            key_pad.clone(),
            params,
        ) {
            return out;
        }
    }
    let (n, rl, c) = (b * h, r * l, params.chunk_len);
    let device = qk.device();

    // Buckets with round offsets, so that rounds never share a bucket: [n, r*l].
    let offsets = memzoo_backend::index_range(r, &device)
        .mul_scalar(n_buckets as i64)
        .reshape([1, 1, r, 1]);
    let buckets = (buckets + offsets).reshape([n, rl]);
    // Sort by (bucket, position): the keys are unique, so any sort is stable here.
    let ticker = memzoo_backend::index_range(rl, &device)
        .reshape([1, rl])
        .expand([n, rl]);
    let sticker = if memzoo_backend::sorts_on_host(&device) {
        // Burn would sort on the host here: sort by bucket alone, stably, on the device (the
        // rounds' offsets keep their buckets apart, so within a bucket the order is by position).
        crate::order::stable_order(buckets, r * n_buckets)
    } else {
        let key = buckets.mul_scalar(l as i64) + ticker.clone().remainder_scalar(l as i64);
        key.sort_with_indices(1).1
    };
    // The inverse permutation, undo[sticker[j]] = j: a scatter, not a second sort.
    let undo = Tensor::<2, Int>::zeros([n, rl], &device).scatter(
        1,
        sticker.clone(),
        ticker,
        IndexingUpdateOp::Add,
    );
    let spos = sticker.clone().remainder_scalar(l as i64);

    // Gather the sorted copies (each round sees all `l` positions once) as row selections of
    // the flattened `[n * l, dh]` inputs.
    let row = |len: usize| {
        memzoo_backend::index_range(n, &device)
            .mul_scalar(len as i64)
            .reshape([n, 1])
    };
    let flat_pos = (spos.clone() + row(l).cast(spos.dtype())).reshape([n * rl]);
    let sqk = qk.reshape([n * l, dh]).select(0, flat_pos.clone());
    let sv = v.reshape([n * l, dh]).select(0, flat_pos.clone());
    let nc = rl / c;
    let q = sqk.reshape([n, nc, c, dh]);
    // Shared QK: k_j = q_j / ||q_j||. The floor goes under the square root: a zero query (the
    // zero rows padding a length up to a multiple of the chunk) would otherwise backpropagate
    // 0 * d sqrt(0) = 0 * inf = NaN.
    let sq = q.clone().powi_scalar(2).sum_dim(3);
    let norm = if params.key_eps > 0.0 {
        sq.add_scalar(dh as f64 * params.key_eps).sqrt()
    } else {
        sq.clamp_min(1e-12).sqrt()
    };
    let k = q.clone() / norm;
    let pad = key_pad.map(|m| {
        let m = m
            .int()
            .unsqueeze_dim::<3>(1)
            .expand([b, h, l])
            .reshape([n * l])
            .select(0, flat_pos.clone());
        m.reshape([n, nc, c]).bool()
    });
    // chunk of (round r', position p) = undo[r' l + p] / c, read at each sorted element's p
    let round_locs = if params.dedup_rounds && r > 1 {
        let locs = undo.clone().div_scalar(c as i64).reshape([n, r, l]);
        (0..r)
            .map(|ri| {
                locs.clone()
                    .slice([0..n, ri..ri + 1])
                    .reshape([n * l])
                    .select(0, flat_pos.clone())
                    .reshape([n, nc, c])
                    .float()
            })
            .collect()
    } else {
        Vec::new()
    };
    let chunks = Chunked {
        q,
        k,
        v: sv.reshape([n, nc, c, dh]),
        pos: spos.reshape([n, nc, c]),
        pad,
        round_locs,
    };
    let (out, lse) = chunked_attention(chunks, params, true, false, dropatt);

    // Undo the sort, then mix the rounds: w_r = exp(z_r - logsumexp_r z_r).
    let flat_undo = (undo.clone() + row(rl).cast(undo.dtype())).reshape([n * rl]);
    let out = out
        .reshape([n * rl, dh])
        .select(0, flat_undo.clone())
        .reshape([n, r, l, dh]);
    let lse = lse
        .reshape([n * rl])
        .select(0, flat_undo)
        .reshape([n, r, l, 1]);
    let weights = softmax(lse, 1);
    (out * weights).sum_dim(1).reshape([b, h, l, dh])
}

/// [`lsh_attention_with_buckets`] as one fused CPU op (`memzoo_fused`, flex backend only):
/// the same maths, no attention dropout.
///
/// # Shapes
/// - `qk`, `v`: `[batch, heads, len, d_head]`
/// - `buckets`: `[batch, heads, n_rounds, len]`, ids in `0..n_buckets`
/// - `key_pad`: `[batch, len]`
/// - output: `[batch, heads, len, d_head]`
pub fn lsh_attention_fused(
    qk: Tensor<4>,
    v: Tensor<4>,
    buckets: Tensor<4, Int>,
    n_buckets: usize,
    key_pad: Option<Tensor<2, Bool>>,
    params: ChunkParams,
) -> Result<Tensor<4>, memzoo_fused::FusedError> {
    let [b, h, l, dh] = qk.dims();
    let r = buckets.dims()[2];
    let n = b * h;
    let scale = match params.lsh_scores {
        LshScores::UnitKeys => 1.0,
        LshScores::ScaledUnitKeys => (dh as f32).powf(-0.5),
    };
    let kernel = memzoo_fused::LshKernelParams {
        chunk_len: params.chunk_len,
        n_buckets,
        before: params.before,
        after: params.after,
        causal: params.causal,
        dedup_rounds: params.dedup_rounds,
        scale,
        self_score: SELF_SCORE,
        masked: MASKED,
    };
    let pad = key_pad.map(|m| m.unsqueeze_dim::<3>(1).expand([b, h, l]).reshape([n, l]));
    let out = memzoo_fused::lsh_attention_fused(
        qk.reshape([n, l, dh]),
        v.reshape([n, l, dh]),
        buckets.reshape([n, r, l]),
        pad,
        kernel,
    )?;
    Ok(out.reshape([b, h, l, dh]))
}

/// Local attention on projected heads: chunks of `chunk_len` in position order, each seeing
/// `before` / `after` neighbouring chunks (no wrap-around).
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, len, d_head]`, `len` a multiple of `chunk_len`
/// - `key_pad`: `[batch, len]`
/// - output: `[batch, heads, len, d_head]`
pub fn local_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_pad: Option<Tensor<2, Bool>>,
    params: ChunkParams,
    dropatt: Option<(f64, u64)>,
) -> Tensor<4> {
    let [b, h, l, dh] = q.dims();
    let (n, c) = (b * h, params.chunk_len);
    let nc = l / c;
    let pos = memzoo_backend::index_range(l, &q.device())
        .reshape([1, nc, c])
        .expand([n, nc, c]);
    let pad = key_pad.map(|m| {
        m.unsqueeze_dim::<3>(1)
            .expand([b, h, l])
            .reshape([n, nc, c])
    });
    let chunks = Chunked {
        q: q.reshape([n, nc, c, dh]),
        k: k.reshape([n, nc, c, dh]),
        v: v.reshape([n, nc, c, dh]),
        pos,
        pad,
        round_locs: Vec::new(),
    };
    let (out, _) = chunked_attention(chunks, params, false, true, dropatt);
    out.reshape([b, h, l, dh])
}
