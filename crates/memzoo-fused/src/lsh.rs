//! LSH chunked attention (Kitaev et al. 2020, sec. 2) as one CPU kernel: sort by bucket, gather,
//! chunk with look-around (wrapping over the sorted sequence), scores, masks, round
//! de-duplication, softmax with log-partition, unsort and the mixture of rounds; and its
//! hand-written backward; and the hashing ([`hash`]). Plain slices in, plain slices out; one rayon
//! task per (batch, head) row, the products per chunk by `gemm` (single-threaded inside a task),
//! the element-wise loops branch-free (compiled for AVX2 too, picked at run time).
//!
//! The maths, per row, with `R = rounds * len` sorted elements and `nc = R / c` chunks of `c`:
//! - sorted order: ascending `(bucket + round * n_buckets, position)`; `pos_t` is the original
//!   position of sorted element `t`, `undo` the inverse permutation;
//! - `q_t = x_{pos_t}`, `k_t = q_t / max(|q_t|, 1e-6)` (shared QK), `v_t = v_{pos_t}`;
//! - query chunk `i` sees key chunks `i-before, .., i, .., i+after` (mod `nc`); the sorted rows
//!   are stored with the last `before` chunks copied in front and the first `after` behind, so a
//!   window is `w` consecutive rows and each product one `gemm` call;
//! - `s_tu = scale * q_t · k_u`; `SELF_SCORE` where `pos_t = pos_u`; then `- log count_tu`
//!   (de-duplication: the number of rounds whose chunk windows hold the pair, at least 1); then
//!   `MASKED` where `pos_u > pos_t` (causal) or `pos_u` is padding;
//! - `P_tu = exp(s_tu - lse_t)`, `lse_t = log Σ_u exp s_tu`, `o_t = Σ_u P_tu v_u`;
//! - output `y_p = Σ_r w_rp o_{undo(r, p)}` with `w_rp = softmax_r(lse_{undo(r, p)})`.
//!
//! Backward, from `g_p = dL/dy_p`:
//! - `do_t = w_rp g_p`, `dlse_t = w_rp g_p · (o_t - y_p)` for `t = undo(r, p)`;
//! - `dP_tu = do_t · v_u`, `ds_tu = P_tu (dP_tu - do_t · o_t + dlse_t)` (zero where the score
//!   was filled: self, causal, padding), `dv_u += Σ_t P_tu do_t`;
//! - `dq_t += scale Σ_u ds_tu k_u`, `dk_u += scale Σ_t ds_tu q_t`;
//! - `dq_t += (dk_t - k_t (k_t · dk_t)) / |q_t|` (or `dk_t / 1e-6` under the floor);
//! - scatter `dq_t`, `dv_t` to position `pos_t`, summed over the rounds.

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

/// Settings of the kernel: the chunk geometry, masks and the score convention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LshKernelParams {
    /// Chunk length (bucket size) `c`; divides the sequence length.
    pub chunk_len: usize,
    /// Buckets per round (bucket ids lie in `0..n_buckets`).
    pub n_buckets: usize,
    /// Chunks before its own that a chunk attends to (capped at `nc - 1`).
    pub before: usize,
    /// Chunks after its own (capped so that no chunk is seen twice).
    pub after: usize,
    /// Hide keys whose original position is after the query's.
    pub causal: bool,
    /// Lower a pair's score by the log of the number of rounds whose windows hold it.
    pub dedup_rounds: bool,
    /// Multiplies `q · k̂` (1 or `1/sqrt(d_head)`).
    pub scale: f32,
    /// Score of a query's own key.
    pub self_score: f32,
    /// Score of a hidden key.
    pub masked: f32,
}

/// Sizes of one call: `n` rows of `len` positions, `rounds` hash rounds, `d_head` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LshDims {
    /// Rows (batch x heads).
    pub n: usize,
    /// Sequence length (a multiple of the chunk length).
    pub len: usize,
    /// Hash rounds.
    pub rounds: usize,
    /// Head width.
    pub d_head: usize,
}

/// What the forward pass keeps for the backward: the sorted outputs and log-partitions.
#[derive(Clone, Debug)]
pub struct LshSaved {
    /// `o_t` per row, in sorted order: `[n, rounds * len, d_head]`.
    pub out_sorted: Vec<f32>,
    /// `lse_t` per row, in sorted order: `[n, rounds * len]`.
    pub lse_sorted: Vec<f32>,
}

/// The floor of `|q|^2` under the square root (as the unfused path: a zero query stays finite).
const NORM_FLOOR: f32 = 1e-12;

/// Geometry shared by every row: chunk count and the window's chunk offsets.
#[derive(Clone, Debug)]
struct Geometry {
    c: usize,
    nc: usize,
    /// Chunks before a chunk in its window (capped).
    before: usize,
    /// `before + after` (capped).
    span: usize,
    /// Window parts: offsets of the key chunks from the query chunk, `-before..=after`.
    offsets: Vec<isize>,
    /// `log(k)` for `k = 0..=rounds` (`log 0` is never used: counts are clamped to 1).
    log_count: Vec<f32>,
}

impl Geometry {
    fn new(d: LshDims, p: &LshKernelParams) -> Self {
        let c = p.chunk_len;
        let nc = d.rounds * d.len / c;
        let before = p.before.min(nc - 1);
        let after = p.after.min(nc - 1 - before);
        let offsets = (-(before as isize)..=after as isize).collect();
        let log_count = (0..=d.rounds).map(|k| (k.max(1) as f32).ln()).collect();
        Self {
            c,
            nc,
            before,
            span: before + after,
            offsets,
            log_count,
        }
    }

    fn width(&self) -> usize {
        self.c * self.offsets.len()
    }

    /// Rows of the extended sorted layout: the last `before` chunks, the `nc` chunks, the
    /// first `after` chunks, so that every window is `w` consecutive rows (chunk `i`'s starts
    /// at row `i * c`) and its products are single matrix products.
    fn ext_rows(&self) -> usize {
        self.c * (self.nc + self.span)
    }

    /// Row of sorted element 0 in the extended layout.
    fn ext0(&self) -> usize {
        self.c * self.before
    }

    /// Copies the wrapped chunks of an extended `[ext_rows, dh]` buffer from its sorted rows.
    fn fill_wrap(&self, x: &mut [f32], dh: usize) {
        let (c, nc, e0) = (self.c, self.nc, self.ext0());
        x.copy_within(nc * c * dh..(nc * c + e0) * dh, 0);
        let after = self.span - self.before;
        x.copy_within(e0 * dh..(e0 + after * c) * dh, (e0 + nc * c) * dh);
    }

    /// Adds the wrapped chunks' rows of an extended gradient buffer into their sorted rows.
    fn fold_wrap(&self, x: &mut [f32], dh: usize) {
        let (c, nc, e0) = (self.c, self.nc, self.ext0());
        for k in 0..e0 * dh {
            x[nc * c * dh + k] += x[k];
        }
        let after = self.span - self.before;
        for k in 0..after * c * dh {
            x[e0 * dh + k] += x[(e0 + nc * c) * dh + k];
        }
    }

    fn key_chunk(&self, i: usize, off: isize) -> usize {
        (i as isize + off).rem_euclid(self.nc as isize) as usize
    }
}

/// One row's sorted copies and bookkeeping.
struct Row {
    /// Sorted element -> original position.
    pos: Vec<u32>,
    /// `(round * len + position)` -> sorted element.
    undo: Vec<u32>,
    /// De-duplication: for sorted element `t` and round `r`, the chunk holding `pos_t` in round
    /// `r`, at `t * rounds + r` (empty without de-duplication).
    locs: Vec<u32>,
    /// Sorted queries, keys and values in the extended layout ([`Geometry::ext_rows`]).
    q: Vec<f32>,
    k: Vec<f32>,
    /// `max(|q_t|, 1e-6)`.
    norm: Vec<f32>,
    /// Whether `|q_t|` is under the floor (then the norm is a constant).
    floored: Vec<bool>,
    v: Vec<f32>,
}

impl Row {
    fn new(
        d: LshDims,
        p: &LshKernelParams,
        g: &Geometry,
        qk: &[f32],
        v: &[f32],
        buckets: &[i64],
    ) -> Self {
        let (l, dh, r) = (d.len, d.d_head, d.rounds);
        let rl = r * l;
        // Counting sort by bucket-with-round-offset; stable, so ties keep position order.
        let nb = p.n_buckets * r;
        let key = |idx: usize| {
            let b = buckets[idx].clamp(0, p.n_buckets as i64 - 1) as usize;
            b + (idx / l) * p.n_buckets
        };
        let mut start = vec![0u32; nb + 1];
        for idx in 0..rl {
            start[key(idx) + 1] += 1;
        }
        for b in 0..nb {
            start[b + 1] += start[b];
        }
        let mut undo = vec![0u32; rl];
        let mut pos = vec![0u32; rl];
        for (idx, u) in undo.iter_mut().enumerate() {
            let kb = key(idx);
            let t = start[kb] as usize;
            start[kb] += 1;
            *u = t as u32;
            pos[t] = (idx % l) as u32;
        }
        let locs = if p.dedup_rounds && r > 1 {
            let mut locs = vec![0u32; rl * r];
            for t in 0..rl {
                let pt = pos[t] as usize;
                for rr in 0..r {
                    locs[t * r + rr] = undo[rr * l + pt] / g.c as u32;
                }
            }
            locs
        } else {
            Vec::new()
        };
        let (ext, e0) = (g.ext_rows(), g.ext0());
        let mut sq = vec![0f32; ext * dh];
        let mut sk = vec![0f32; ext * dh];
        let mut sv = vec![0f32; ext * dh];
        let mut norm = vec![0f32; rl];
        let mut floored = vec![false; rl];
        for t in 0..rl {
            let src = pos[t] as usize * dh;
            let x = &qk[src..src + dh];
            let te = t + e0;
            sq[te * dh..(te + 1) * dh].copy_from_slice(x);
            sv[te * dh..(te + 1) * dh].copy_from_slice(&v[src..src + dh]);
            let ss: f32 = x.iter().map(|a| a * a).sum();
            let nrm = ss.max(NORM_FLOOR).sqrt();
            norm[t] = nrm;
            floored[t] = ss <= NORM_FLOOR;
            for (kk, a) in sk[te * dh..(te + 1) * dh].iter_mut().zip(x) {
                *kk = a / nrm;
            }
        }
        for x in [&mut sq, &mut sk, &mut sv] {
            g.fill_wrap(x, dh);
        }
        Self {
            pos,
            undo,
            locs,
            q: sq,
            k: sk,
            norm,
            floored,
            v: sv,
        }
    }

    /// Scores of query chunk `i` against its window, masks applied, into `s` (`[c, w]`);
    /// `live` (when given) marks the entries that came from `q · k` (their gradient flows).
    #[allow(clippy::too_many_arguments)]
    fn scores(
        &self,
        d: LshDims,
        p: &LshKernelParams,
        g: &Geometry,
        pad: &[bool],
        i: usize,
        s: &mut [f32],
        mut live: Option<&mut [bool]>,
    ) {
        let (c, dh, w, r) = (g.c, d.d_head, g.width(), d.rounds);
        // S = scale Q_i K_win^T
        let (q0, k0) = ((i * c + g.ext0()) * dh, i * c * dh);
        matmul(
            (c, w, dh),
            s,
            w,
            false,
            &self.q[q0..],
            (1, dh),
            &self.k[k0..],
            (dh, 1),
            p.scale,
        );
        // The window's keys: position, padding, and (de-duplication) chunk per round
        // (round-major, `+ nc` so that differences with a query's chunk are not negative).
        let dedup = !self.locs.is_empty();
        let mut kpos = Vec::with_capacity(w);
        let mut khid = Vec::with_capacity(w);
        let mut klocs = vec![0u32; if dedup { w * r } else { 0 }];
        for (m, &off) in g.offsets.iter().enumerate() {
            let j = g.key_chunk(i, off);
            for (b, u) in (j * c..(j + 1) * c).enumerate() {
                let pu = self.pos[u];
                kpos.push(pu);
                khid.push(pad.get(pu as usize).copied().unwrap_or(false) as u32);
                if dedup {
                    for rr in 0..r {
                        klocs[rr * w + m * c + b] = self.locs[u * r + rr] + g.nc as u32;
                    }
                }
            }
        }
        let mut log_count = vec![0f32; w];
        let mut count = vec![0u32; w];
        let keys = WindowKeys {
            pos: &kpos,
            hidden: &khid,
            locs: &klocs,
        };
        for a in 0..c {
            let t = i * c + a;
            let lt = if dedup {
                &self.locs[t * r..(t + 1) * r]
            } else {
                &[][..]
            };
            let query = (self.pos[t], lt);
            let scratch = (&mut count[..], &mut log_count[..]);
            let live_row = live.as_deref_mut().map(|l| &mut l[a * w..(a + 1) * w]);
            mask_row(
                p,
                g,
                &keys,
                query,
                &mut s[a * w..(a + 1) * w],
                live_row,
                scratch,
            );
        }
    }
}

/// The keys of one query chunk's window.
struct WindowKeys<'a> {
    /// Original positions, `[w]`.
    pos: &'a [u32],
    /// Padding (1 = hidden), `[w]`.
    hidden: &'a [u32],
    /// De-duplication: each key's chunk in each round plus `nc`, `[rounds, w]` (or empty).
    locs: &'a [u32],
}

/// Masks and de-duplication of one query's scores `row` (`[w]`), in place: hidden (causal,
/// padding) -> `masked`; else own key -> `self_score`; then `- log count` (the tensor path
/// fills, subtracts and fills in this order: the same values). `live` marks the entries whose
/// gradient flows to `q · k`.
#[inline(always)]
fn mask_row_impl(
    p: &LshKernelParams,
    g: &Geometry,
    keys: &WindowKeys,
    (pt, lt): (u32, &[u32]),
    row: &mut [f32],
    live: Option<&mut [bool]>,
    (count, log_count): (&mut [u32], &mut [f32]),
) {
    // Branch-free loops over the window, so that they vectorise.
    let w = row.len();
    let dedup = !keys.locs.is_empty();
    if dedup {
        // in window <=> (kc - qc + before) mod nc <= before + after; with the `+ nc` stored in
        // the key's chunk, e = kc + nc - qc + before lies in [0, 3 nc)
        let (nc, before, span) = (g.nc as u32, g.before as u32, g.span as u32);
        count.fill(0);
        for (rr, &qc) in lt.iter().enumerate() {
            let kl = &keys.locs[rr * w..(rr + 1) * w];
            for (cnt, &kc) in count.iter_mut().zip(kl) {
                let e = kc - qc + before;
                let e = if e >= nc { e - nc } else { e };
                let e = if e >= nc { e - nc } else { e };
                *cnt += (e <= span) as u32;
            }
        }
        // log count, counts clamped to 1 (log 1 = 0): selects over a fixed table of 9 for up
        // to 8 rounds (they vectorise), a look-up beyond
        if g.log_count.len() <= 9 {
            let mut table = [0f32; 9];
            table[..g.log_count.len()].copy_from_slice(&g.log_count);
            for (lc, &cnt) in log_count.iter_mut().zip(count.iter()) {
                let mut v = 0.0;
                // An index loop: `enumerate().skip(2)` stayed a scalar iterator here.
                #[allow(clippy::needless_range_loop)]
                for k in 2..9 {
                    v = select(cnt == k as u32, table[k], v);
                }
                *lc = v;
            }
        } else {
            for (lc, &cnt) in log_count.iter_mut().zip(count.iter()) {
                *lc = g.log_count[cnt as usize];
            }
        }
    } else {
        log_count.fill(0.0);
    }
    let causal = p.causal as u32;
    let (pos, hid, log_count) = (&keys.pos[..w], &keys.hidden[..w], &log_count[..w]);
    for (((x, &pu), &h), &lc) in row.iter_mut().zip(pos).zip(hid).zip(log_count) {
        let hidden = (causal & (pu > pt) as u32) | h;
        let v = select(pu == pt, p.self_score, *x) - lc;
        *x = select(hidden != 0, p.masked, v);
    }
    if let Some(live) = live {
        for ((l, &pu), &h) in live[..w].iter_mut().zip(pos).zip(hid) {
            let dead = (causal & (pu > pt) as u32) | h | (pu == pt) as u32;
            *l = dead == 0;
        }
    }
}

/// The scores' gradient in place of `dp` (rows of `w`): `dS = P (dP + shift)`, with
/// `shift = dlse - do · o` per row, zero where the score was filled (not `live`).
#[inline(always)]
fn score_grads_impl(p: &[f32], dp: &mut [f32], live: &[bool], shift: &[f32]) {
    let w = p.len() / shift.len();
    for (((dp, p), live), &sh) in dp
        .chunks_exact_mut(w)
        .zip(p.chunks_exact(w))
        .zip(live.chunks_exact(w))
        .zip(shift)
    {
        for ((d, &pv), &l) in dp.iter_mut().zip(p).zip(live) {
            *d = select(l, pv * (*d + sh), 0.0);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn score_grads_avx2(p: &[f32], dp: &mut [f32], live: &[bool], shift: &[f32]) {
    score_grads_impl(p, dp, live, shift)
}

/// [`score_grads_impl`], compiled for AVX2 where the CPU has it.
fn score_grads(p: &[f32], dp: &mut [f32], live: &[bool], shift: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { score_grads_avx2(p, dp, live, shift) };
    }
    score_grads_impl(p, dp, live, shift)
}

/// `if cond { a } else { b }` on the bits, so that loops over it vectorise.
#[inline(always)]
fn select(cond: bool, a: f32, b: f32) -> f32 {
    let m = 0u32.wrapping_sub(cond as u32);
    f32::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn mask_row_avx2(
    p: &LshKernelParams,
    g: &Geometry,
    keys: &WindowKeys,
    query: (u32, &[u32]),
    row: &mut [f32],
    live: Option<&mut [bool]>,
    scratch: (&mut [u32], &mut [f32]),
) {
    mask_row_impl(p, g, keys, query, row, live, scratch)
}

/// [`mask_row_impl`], compiled for AVX2 where the CPU has it.
fn mask_row(
    p: &LshKernelParams,
    g: &Geometry,
    keys: &WindowKeys,
    query: (u32, &[u32]),
    row: &mut [f32],
    live: Option<&mut [bool]>,
    scratch: (&mut [u32], &mut [f32]),
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { mask_row_avx2(p, g, keys, query, row, live, scratch) };
    }
    mask_row_impl(p, g, keys, query, row, live, scratch)
}

/// `e^x` to about 2 ulp, branch-free so that loops over it vectorise (Cephes' `expf`
/// polynomial); 0 below -87 (where `e^x` is under `f32`'s smallest normal, 1.2e-38).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 88.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut q = 1.987_569_1e-4_f32;
    q = q * r + 1.398_199_9e-3;
    q = q * r + 8.333_452e-3;
    q = q * r + 4.166_579_6e-2;
    q = q * r + 1.666_666_5e-1;
    q = q * r + 0.5;
    let e = q * r * r + r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32);
    if x < -87.0 { 0.0 } else { e * scale }
}

/// `dst[m, n] (+)= alpha · lhs[m, k] · rhs[k, n]` on row-major buffers with the given
/// (column, row) strides; one thread.
#[allow(clippy::too_many_arguments)]
fn matmul(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    lhs: &[f32],
    (lhs_cs, lhs_rs): (usize, usize),
    rhs: &[f32],
    (rhs_cs, rhs_rs): (usize, usize),
    alpha: f32,
) {
    // The last element each operand touches lies inside its slice.
    debug_assert!((m - 1) * dst_rs + n <= dst.len());
    debug_assert!((m - 1) * lhs_rs + (k - 1) * lhs_cs < lhs.len());
    debug_assert!((k - 1) * rhs_rs + (n - 1) * rhs_cs < rhs.len());
    // SAFETY: the strides keep every access inside the slices (checked above in debug builds;
    // the callers' shapes guarantee it).
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// Softmax of each row of `s` (rows of `w`) in place: `p = exp(s - max) / Σ`; writes the
/// rows' `lse = log Σ + max`. The backward recomputes `p` this way, not as `exp(s - lse)`:
/// with every key hidden, `s = lse = MASKED` to f32 precision and `exp(s - lse)` would be 1.
#[inline(always)]
fn softmax_rows_impl(s: &mut [f32], w: usize, lse: &mut [f32]) {
    for (sa, lse) in s.chunks_exact_mut(w).zip(lse) {
        let m = max_f32(sa);
        for x in sa.iter_mut() {
            *x = exp_f32(*x - m);
        }
        let z = sum_f32(sa);
        let inv = 1.0 / z;
        for x in sa.iter_mut() {
            *x *= inv;
        }
        *lse = z.ln() + m;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn softmax_rows_avx2(s: &mut [f32], w: usize, lse: &mut [f32]) {
    softmax_rows_impl(s, w, lse)
}

/// [`softmax_rows_impl`], compiled for AVX2 where the CPU has it.
fn softmax_rows(s: &mut [f32], w: usize, lse: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { softmax_rows_avx2(s, w, lse) };
    }
    softmax_rows_impl(s, w, lse)
}

/// `max x` in 8 interleaved partial maxima (vectorises; no NaN handling: scores are finite).
#[inline(always)]
pub(crate) fn max_f32(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for ch in &mut chunks {
        for k in 0..8 {
            acc[k] = if ch[k] > acc[k] { ch[k] } else { acc[k] };
        }
    }
    let mut m = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for a in acc {
        m = m.max(a);
    }
    m
}

/// `Σ x` in 8 interleaved partial sums (vectorises; the order differs from a serial sum by
/// rounding only).
#[inline(always)]
pub(crate) fn sum_f32(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for ch in &mut chunks {
        for k in 0..8 {
            acc[k] += ch[k];
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Round weights `w_r = softmax_r(lse)` of position `p` and the sorted indices `undo(r, p)`.
fn round_weights(row: &Row, lse: &[f32], l: usize, p: usize, ts: &mut [usize], w: &mut [f32]) {
    let r = ts.len();
    let mut m = f32::NEG_INFINITY;
    for rr in 0..r {
        ts[rr] = row.undo[rr * l + p] as usize;
        m = m.max(lse[ts[rr]]);
    }
    let mut z = 0.0;
    for rr in 0..r {
        w[rr] = (lse[ts[rr]] - m).exp();
        z += w[rr];
    }
    for x in w.iter_mut() {
        *x /= z;
    }
}

/// Forward pass. Inputs `qk`, `v`: `[n, len, d_head]`; `buckets`: `[n, rounds, len]`;
/// `pad`: `[n, len]` (`true` = hidden key) or empty. Returns the output `[n, len, d_head]`
/// and what the backward needs.
pub fn forward(
    d: LshDims,
    p: &LshKernelParams,
    qk: &[f32],
    v: &[f32],
    buckets: &[i64],
    pad: &[bool],
) -> (Vec<f32>, LshSaved) {
    let (n, l, dh, r) = (d.n, d.len, d.d_head, d.rounds);
    let rl = r * l;
    let g = Geometry::new(d, p);
    let mut y = vec![0f32; n * l * dh];
    let mut out_sorted = vec![0f32; n * rl * dh];
    let mut lse_sorted = vec![0f32; n * rl];
    y.par_chunks_mut(l * dh)
        .zip(out_sorted.par_chunks_mut(rl * dh))
        .zip(lse_sorted.par_chunks_mut(rl))
        .enumerate()
        .for_each(|(ni, ((y, out), lse))| {
            let row = Row::new(
                d,
                p,
                &g,
                &qk[ni * l * dh..(ni + 1) * l * dh],
                &v[ni * l * dh..(ni + 1) * l * dh],
                &buckets[ni * rl..(ni + 1) * rl],
            );
            let pad = if pad.is_empty() {
                pad
            } else {
                &pad[ni * l..(ni + 1) * l]
            };
            let (c, w) = (g.c, g.width());
            let mut s = vec![0f32; c * w];
            for i in 0..g.nc {
                row.scores(d, p, &g, pad, i, &mut s, None);
                softmax_rows(&mut s, w, &mut lse[i * c..(i + 1) * c]);
                // O_i = P V_win
                matmul(
                    (c, dh, w),
                    &mut out[i * c * dh..],
                    dh,
                    false,
                    &s,
                    (1, w),
                    &row.v[i * c * dh..],
                    (1, dh),
                    1.0,
                );
            }
            let mut ts = vec![0usize; r];
            let mut wr = vec![0f32; r];
            for pp in 0..l {
                round_weights(&row, lse, l, pp, &mut ts, &mut wr);
                let yp = &mut y[pp * dh..(pp + 1) * dh];
                for rr in 0..r {
                    let o = &out[ts[rr] * dh..(ts[rr] + 1) * dh];
                    for (a, b) in yp.iter_mut().zip(o) {
                        *a += wr[rr] * b;
                    }
                }
            }
        });
    (
        y,
        LshSaved {
            out_sorted,
            lse_sorted,
        },
    )
}

/// Backward pass: gradients of `qk` and `v` (`[n, len, d_head]` each) from the output's
/// gradient `dy` (`[n, len, d_head]`), with the inputs and [`LshSaved`] of the forward pass.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    d: LshDims,
    p: &LshKernelParams,
    qk: &[f32],
    v: &[f32],
    buckets: &[i64],
    pad: &[bool],
    saved: &LshSaved,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (n, l, dh, r) = (d.n, d.len, d.d_head, d.rounds);
    let rl = r * l;
    let g = Geometry::new(d, p);
    let mut dqk = vec![0f32; n * l * dh];
    let mut dv = vec![0f32; n * l * dh];
    dqk.par_chunks_mut(l * dh)
        .zip(dv.par_chunks_mut(l * dh))
        .enumerate()
        .for_each(|(ni, (dqk, dvo))| {
            let row = Row::new(
                d,
                p,
                &g,
                &qk[ni * l * dh..(ni + 1) * l * dh],
                &v[ni * l * dh..(ni + 1) * l * dh],
                &buckets[ni * rl..(ni + 1) * rl],
            );
            let pad = if pad.is_empty() {
                pad
            } else {
                &pad[ni * l..(ni + 1) * l]
            };
            let out = &saved.out_sorted[ni * rl * dh..(ni + 1) * rl * dh];
            let lse = &saved.lse_sorted[ni * rl..(ni + 1) * rl];
            let dy = &dy[ni * l * dh..(ni + 1) * l * dh];
            // Through the mixture of rounds: do_t, dlse_t, and D_t = do_t · o_t.
            let mut gout = vec![0f32; rl * dh];
            let mut glse = vec![0f32; rl];
            let mut dot_o = vec![0f32; rl];
            let mut ts = vec![0usize; r];
            let mut wr = vec![0f32; r];
            let mut yp = vec![0f32; dh];
            for pp in 0..l {
                round_weights(&row, lse, l, pp, &mut ts, &mut wr);
                yp.fill(0.0);
                for rr in 0..r {
                    let o = &out[ts[rr] * dh..(ts[rr] + 1) * dh];
                    for (a, b) in yp.iter_mut().zip(o) {
                        *a += wr[rr] * b;
                    }
                }
                let gp = &dy[pp * dh..(pp + 1) * dh];
                for rr in 0..r {
                    let t = ts[rr];
                    let o = &out[t * dh..(t + 1) * dh];
                    let mut go = 0.0;
                    let mut gd = 0.0;
                    for k in 0..dh {
                        gout[t * dh + k] = wr[rr] * gp[k];
                        go += gp[k] * o[k];
                        gd += gp[k] * (o[k] - yp[k]);
                    }
                    dot_o[t] = wr[rr] * go;
                    glse[t] = wr[rr] * gd;
                }
            }
            let (c, w) = (g.c, g.width());
            let mut s = vec![0f32; c * w];
            let mut live = vec![false; c * w];
            let mut dp = vec![0f32; c * w];
            let mut lse_scratch = vec![0f32; c];
            let mut shift = vec![0f32; c];
            let mut dq = vec![0f32; rl * dh];
            let mut dk = vec![0f32; g.ext_rows() * dh];
            let mut dvs = vec![0f32; g.ext_rows() * dh];
            for i in 0..g.nc {
                row.scores(d, p, &g, pad, i, &mut s, Some(&mut live));
                softmax_rows(&mut s, w, &mut lse_scratch);
                let win = i * c * dh;
                // dP = dO_i V_win^T
                matmul(
                    (c, w, dh),
                    &mut dp,
                    w,
                    false,
                    &gout[i * c * dh..],
                    (1, dh),
                    &row.v[win..],
                    (dh, 1),
                    1.0,
                );
                // dV_win += P^T dO_i
                matmul(
                    (w, dh, c),
                    &mut dvs[win..],
                    dh,
                    true,
                    &s,
                    (w, 1),
                    &gout[i * c * dh..],
                    (1, dh),
                    1.0,
                );
                for a in 0..c {
                    shift[a] = glse[i * c + a] - dot_o[i * c + a];
                }
                score_grads(&s, &mut dp, &live, &shift);
                // dQ_i += scale dS K_win, dK_win += scale dS^T Q_i
                matmul(
                    (c, dh, w),
                    &mut dq[i * c * dh..],
                    dh,
                    true,
                    &dp,
                    (1, w),
                    &row.k[win..],
                    (1, dh),
                    p.scale,
                );
                matmul(
                    (w, dh, c),
                    &mut dk[win..],
                    dh,
                    true,
                    &dp,
                    (w, 1),
                    &row.q[(i * c + g.ext0()) * dh..],
                    (1, dh),
                    p.scale,
                );
            }
            for x in [&mut dk, &mut dvs] {
                g.fold_wrap(x, dh);
            }
            // k = q / |q|: dq += (dk - k (k · dk)) / |q| (dk / |q| under the floor), then
            // scatter the sorted gradients to their positions.
            for t in 0..rl {
                let te = (t + g.ext0()) * dh;
                let (kt, dkt) = (&row.k[te..te + dh], &dk[te..te + dh]);
                let inv = 1.0 / row.norm[t];
                let kd: f32 = if row.floored[t] {
                    0.0
                } else {
                    kt.iter().zip(dkt).map(|(a, b)| a * b).sum()
                };
                let dst = row.pos[t] as usize * dh;
                for k in 0..dh {
                    dqk[dst + k] += dq[t * dh + k] + (dkt[k] - kt[k] * kd) * inv;
                    dvo[dst + k] += dvs[te + k];
                }
            }
        });
    (dqk, dv)
}

/// Bucket ids `h(x) = argmax([xR; -xR])` per round (sec. 2), without materialising `xR`:
/// positions in blocks, one product per block, the first maximum as Burn's `argmax` takes it.
/// `x`: `[n, len, d_head]`; `rotations`: `[d_head, rounds, half]`; returns `[n, rounds, len]`.
pub fn hash(
    x: &[f32],
    (n, len, dh): (usize, usize, usize),
    rotations: &[f32],
    rounds: usize,
) -> Vec<i64> {
    let half = rotations.len() / (dh * rounds);
    let cols = rounds * half;
    let mut out = vec![0i64; n * rounds * len];
    const BLOCK: usize = 256;
    out.par_chunks_mut(rounds * len)
        .enumerate()
        .for_each(|(ni, out)| {
            let xr = &x[ni * len * dh..(ni + 1) * len * dh];
            let mut prod = vec![0f32; BLOCK * cols];
            for start in (0..len).step_by(BLOCK) {
                let rows = BLOCK.min(len - start);
                // xR for the block: [rows, rounds * half]
                matmul(
                    (rows, cols, dh),
                    &mut prod,
                    cols,
                    false,
                    &xr[start * dh..],
                    (1, dh),
                    rotations,
                    (1, cols),
                    1.0,
                );
                for a in 0..rows {
                    for rr in 0..rounds {
                        let v = &prod[a * cols + rr * half..a * cols + (rr + 1) * half];
                        // first maximum of [v, -v]
                        let (mut best, mut arg) = (v[0], 0usize);
                        for (j, &x) in v.iter().enumerate().skip(1) {
                            if x > best {
                                (best, arg) = (x, j);
                            }
                        }
                        for (j, &x) in v.iter().enumerate() {
                            if -x > best {
                                (best, arg) = (-x, half + j);
                            }
                        }
                        out[rr * len + start + a] = arg as i64;
                    }
                }
            }
        });
    out
}
