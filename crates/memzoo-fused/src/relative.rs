//! Relative multi-head attention from per-head queries, keys, values and a position term to the
//! attention output, as one kernel: scores, relative shift, mask, softmax and `P V`, forward and
//! backward, one task per (batch row, head) on rayon's pool, the products by `gemm`.
//!
//! Per task (row `b`, head `h`), with queries `i < Q` and keys `j < K`:
//!
//! - content scores `A_ij = qc_i · k_j` (Transformer-XL's terms (a) + (c) with `qc = s (q + u)`);
//! - position scores, one of
//!   - **shifted** (Transformer-XL's (b) + (d)): `X = qp Rᵀ`, `[Q, S]`, column `c` a distance,
//!     read through the relative shift `B_ij = X_flat[(Q - 1) + i (S - 1) + j]` (the
//!     pad-and-reshape trick of Dai et al. 2019, appendix B, as `memzoo-relative`'s `shift.rs`
//!     proves; `S >= K + 1`, and distinct `(i, j)` read distinct entries of `X`);
//!   - **bucketed bias** (T5): `B_ij = β[bucket_ij, h]`, one learned scalar per bucket and
//!     head, shared by every row;
//! - `s_ij = A_ij + B_ij`, then `s_ij = mask_value` where the mask hides key `j` from query `i`;
//! - `P_ij = exp(s_ij - max_j s) / Σ_j exp(s_ij - max_j s)`, `o_i = Σ_j P_ij v_j`.
//!
//! Backward, from `g_i = dL/do_i` (the mask's entries get no gradient, as `mask_fill`'s):
//! - `dP_ij = g_i · v_j`, `dv_j = Σ_i P_ij g_i`;
//! - `ds_ij = P_ij (dP_ij - Σ_j' P_ij' dP_ij')`, 0 where hidden;
//! - `dqc_i = Σ_j ds_ij k_j`, `dk_j = Σ_i ds_ij qc_i`;
//! - shifted: `dX` holds `ds` at the shift's positions (0 elsewhere), `dqp = dX R`,
//!   `dR = Σ_b dXᵀ qp`; bucketed bias: `dβ[u, h] = Σ_b Σ_{ij: bucket_ij = u} ds_bhij`.

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::lsh::{exp_f32, max_f32, sum_f32};

/// Sizes of one call: `batch` rows, `heads`, `qlen` queries, `klen` keys, `d_head`, and the
/// position term's width (`S` columns for the shifted term; 0 for a bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelDims {
    /// Batch rows.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Queries.
    pub qlen: usize,
    /// Keys.
    pub klen: usize,
    /// Width of each head.
    pub d_head: usize,
    /// Columns of the shifted position scores (`S`); 0 with a bias.
    pub columns: usize,
}

/// A read-only strided view of a 3- or 4-dim `f32` tensor's storage.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// The whole storage buffer.
    pub data: &'a [f32],
    /// Offset of element 0.
    pub offset: usize,
    /// Strides (elements) of each dim; unused trailing dims are 0.
    pub strides: [isize; 4],
}

impl View<'_> {
    /// The offset of `index` (the first `n` dims).
    #[inline]
    fn at(&self, index: [usize; 4]) -> isize {
        self.offset as isize
            + (0..4)
                .map(|d| index[d] as isize * self.strides[d])
                .sum::<isize>()
    }

    /// Pointer to element `index`.
    #[inline]
    fn ptr(&self, index: [usize; 4]) -> *const f32 {
        // SAFETY (of the arithmetic): callers index inside the tensor's shape, whose elements
        // all lie in `data`.
        unsafe { self.data.as_ptr().offset(self.at(index)) }
    }
}

/// The position term of the scores.
#[derive(Clone, Copy, Debug)]
pub enum Position<'a> {
    /// Transformer-XL's (b) + (d): queries `qp` `[batch, heads, qlen, d_head]` scored against
    /// `R` `[S, heads, d_head]` and relatively shifted.
    Shifted {
        /// `s (q + v)`.
        qp: View<'a>,
        /// `W_R R`, one row per distance column.
        r: View<'a>,
    },
    /// An additive bias `β[bucket_ij, h]` shared by the rows (T5): `table` `[buckets, heads]`,
    /// `bucket` the bucket of every pair `(i, j)` at `i * klen + j`.
    Buckets {
        /// `β`, `[buckets, heads]`.
        table: View<'a>,
        /// Rows of `table`.
        n_buckets: usize,
        /// `bucket_ij`, `[qlen * klen]`, each below `n_buckets`.
        bucket: &'a [u32],
    },
    /// None.
    None,
}

/// The hidden keys: `mask[m, i, j]` (`true` = hidden), `m` the row (or 0 for all rows).
#[derive(Clone, Copy, Debug)]
pub struct Mask<'a> {
    /// `[rows (1 or batch), qlen, klen]` flags, row-major; empty: nothing hidden.
    pub hidden: &'a [bool],
    /// Rows of the mask: 1 (shared) or `batch`.
    pub rows: usize,
    /// The score a hidden key gets.
    pub value: f32,
}

impl Mask<'_> {
    fn row(&self, b: usize, qlen: usize, klen: usize) -> Option<&[bool]> {
        if self.hidden.is_empty() {
            return None;
        }
        let m = if self.rows == 1 { 0 } else { b };
        Some(&self.hidden[m * qlen * klen..(m + 1) * qlen * klen])
    }
}

/// A raw pointer that rayon tasks may share: each task writes a disjoint set of its elements.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: the tasks write disjoint elements (one (row, head) pair each) and nothing reads them
// until every task has finished.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not the field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `dst[m, n] (+)= alpha · lhs[m, k] · rhs[k, n]` through raw strides `(row, col)`; one thread.
///
/// # Safety
/// Every element the shapes and strides address must be valid (`dst` writable, not aliased).
#[allow(clippy::too_many_arguments)]
unsafe fn mm(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    (dst_rs, dst_cs): (isize, isize),
    accumulate: bool,
    lhs: *const f32,
    (lhs_rs, lhs_cs): (isize, isize),
    rhs: *const f32,
    (rhs_rs, rhs_cs): (isize, isize),
) {
    if m == 0 || n == 0 {
        return;
    }
    // One query (a generated token): the scores and the output without `gemm`'s
    // matrix-vector loops (see `row`).
    // SAFETY: forwarded to the caller.
    if m == 1
        && unsafe {
            crate::row::product(
                (n, k),
                dst,
                dst_cs,
                accumulate,
                lhs,
                lhs_cs,
                rhs,
                (rhs_rs, rhs_cs),
            )
        }
    {
        return;
    }
    // SAFETY: forwarded to the caller.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            accumulate,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// The shift's flat index of `(i, j)` in the `[Q, S]` position scores.
#[inline(always)]
fn shifted(qlen: usize, columns: usize, i: usize, j: usize) -> usize {
    (qlen - 1) + i * (columns - 1) + j
}

/// Rows of queries computed together: a block reads the keys up to the last one any of its
/// rows sees (see [`row_blocks`]).
const BLOCK_ROWS: usize = 64;

/// What a block's products spend packing their `width x d_head` operands (`gemm` packs them
/// again for every block), in rows of products of the same width: about 16 (a profile of
/// XL-small's training at memory 4,096 put 9.5% of the step in the packing of the kernel's
/// two 64-row blocks per head, against about 40% in their products).
const PACKING_ROWS: usize = 16;

/// One task's query rows in blocks `(first row, end row, width)`: the block's rows see no key
/// at or after `width` (1 + the last key any of them sees), so their scores, probabilities and
/// products stop there — under a causal mask about half of the `Q x Q` part is skipped. The
/// skipped entries are exact zeros of `P` (their scores are `mask_value`, `-inf` or `-1e9`,
/// whose `exp` against a visible maximum is 0 in `f32`); a row that sees no key at all
/// attends uniformly to every key (as the unfused softmax does), so its block keeps `K`.
/// Blocks of [`BLOCK_ROWS`] rows, then neighbours merged where one block over the wider width
/// costs less than two ([`PACKING_ROWS`]): behind a long memory the widths differ little, and
/// each block would pack the keys and values again.
fn row_blocks(hidden: Option<&[bool]>, q: usize, kl: usize) -> Vec<(usize, usize, usize)> {
    let mut merged: Vec<(usize, usize, usize)> = Vec::new();
    for (r0, r1, w) in fixed_blocks(hidden, q, kl) {
        if let Some(last) = merged.last_mut() {
            let (g0, g1, gw) = *last;
            let wide = gw.max(w);
            let apart = (g1 - g0) * gw + (r1 - r0) * w + PACKING_ROWS * (gw + w);
            if (r1 - g0 + PACKING_ROWS) * wide <= apart {
                *last = (g0, r1, wide);
                continue;
            }
        }
        merged.push((r0, r1, w));
    }
    merged
}

/// [`row_blocks`] before merging: [`BLOCK_ROWS`] rows each (the last fewer).
fn fixed_blocks(hidden: Option<&[bool]>, q: usize, kl: usize) -> Vec<(usize, usize, usize)> {
    (0..q)
        .step_by(BLOCK_ROWS)
        .map(|r0| {
            let r1 = (r0 + BLOCK_ROWS).min(q);
            let width = match hidden {
                None => kl,
                Some(hidden) => (r0..r1)
                    .map(|i| {
                        hidden[i * kl..(i + 1) * kl]
                            .iter()
                            .rposition(|&m| !m)
                            .map_or(kl, |j| j + 1)
                    })
                    .max()
                    .unwrap_or(kl),
            };
            (r0, r1, width)
        })
        .collect()
}

/// [`row_blocks`] for each row of the mask (1 or `batch`).
fn mask_blocks(mask: Mask, q: usize, kl: usize) -> Vec<Vec<(usize, usize, usize)>> {
    if mask.hidden.is_empty() {
        return vec![row_blocks(None, q, kl)];
    }
    (0..mask.rows)
        .map(|m| row_blocks(Some(&mask.hidden[m * q * kl..(m + 1) * q * kl]), q, kl))
        .collect()
}

/// One task's probabilities `P = softmax(mask(scores))` into `s` (`[Q, K]`, row-major, every
/// entry written: each row's scores over its block's width, then their softmax, 0 after it);
/// `x` is scratch `[Q, S]`. The forward pass and a backward without kept probabilities run
/// this one function, so both get the same floats.
#[allow(clippy::too_many_arguments)]
fn probabilities(
    d: RelDims,
    (b, h): (usize, usize),
    qc: View,
    k: View,
    pos: Position,
    mask: Mask,
    blocks: &[(usize, usize, usize)],
    s: &mut [f32],
    x: &mut [f32],
) {
    let (kl, dh) = (d.klen, d.d_head);
    let q = d.qlen;
    for &(r0, r1, w) in blocks {
        // SAFETY: the views cover [batch, heads, len, d_head] (checked by the caller), `s` is
        // Q x K and the block's rows and first `w` columns lie inside it.
        unsafe {
            mm(
                (r1 - r0, w, dh),
                s.as_mut_ptr().add(r0 * kl),
                (kl as isize, 1),
                false,
                qc.ptr([b, h, r0, 0]),
                (qc.strides[2], qc.strides[3]),
                k.ptr([b, h, 0, 0]),
                (k.strides[3], k.strides[2]),
            );
        }
    }
    let widths: Vec<usize> = blocks
        .iter()
        .flat_map(|&(r0, r1, w)| std::iter::repeat_n(w, r1 - r0))
        .collect();
    let width = |i: usize| widths[i];
    match pos {
        Position::Shifted { qp, r } => {
            let sc = d.columns;
            // SAFETY: `x` is Q x S; `r` covers [S, heads, d_head].
            unsafe {
                mm(
                    (q, sc, dh),
                    x.as_mut_ptr(),
                    (sc as isize, 1),
                    false,
                    qp.ptr([b, h, 0, 0]),
                    (qp.strides[2], qp.strides[3]),
                    r.ptr([0, h, 0, 0]),
                    (r.strides[2], r.strides[0]),
                );
            }
            for (i, row) in s.chunks_exact_mut(kl).enumerate() {
                let base = shifted(q, sc, i, 0);
                let w = width(i);
                for (sv, xv) in row[..w].iter_mut().zip(&x[base..base + w]) {
                    *sv += xv;
                }
            }
        }
        Position::Buckets {
            table,
            n_buckets,
            bucket,
        } => {
            // This head's column of β.
            let beta: Vec<f32> = (0..n_buckets)
                // SAFETY: (u, h) lies inside the table's [buckets, heads].
                .map(|u| unsafe { *table.ptr([u, h, 0, 0]) })
                .collect();
            for (i, (row, bucket)) in s
                .chunks_exact_mut(kl)
                .zip(bucket.chunks_exact(kl))
                .enumerate()
            {
                let w = width(i);
                for (sv, &u) in row[..w].iter_mut().zip(&bucket[..w]) {
                    *sv += beta[u as usize];
                }
            }
        }
        Position::None => {}
    }
    if let Some(hidden) = mask.row(b, q, kl) {
        for (i, (row, hidden)) in s
            .chunks_exact_mut(kl)
            .zip(hidden.chunks_exact(kl))
            .enumerate()
        {
            let w = width(i);
            for (sv, &m) in row[..w].iter_mut().zip(&hidden[..w]) {
                if m {
                    *sv = mask.value;
                }
            }
        }
    }
    softmax_blocks(s, kl, blocks);
}

/// Softmax of each row of `s` (`[Q, K]`) over its block's width; the rest of the row is 0.
fn softmax_blocks(s: &mut [f32], kl: usize, blocks: &[(usize, usize, usize)]) {
    for &(r0, r1, w) in blocks {
        for row in s[r0 * kl..r1 * kl].chunks_exact_mut(kl) {
            softmax_rows(&mut row[..w], w);
            row[w..].fill(0.0);
        }
    }
}

/// Softmax of each `w`-wide row of `s` in place.
fn softmax_rows(s: &mut [f32], w: usize) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { softmax_rows_avx2(s, w) };
    }
    softmax_rows_impl(s, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn softmax_rows_avx2(s: &mut [f32], w: usize) {
    softmax_rows_impl(s, w)
}

#[inline(always)]
fn softmax_rows_impl(s: &mut [f32], w: usize) {
    for row in s.chunks_exact_mut(w) {
        let m = max_f32(row);
        for x in row.iter_mut() {
            *x = exp_f32(*x - m);
        }
        let inv = 1.0 / sum_f32(row);
        for x in row.iter_mut() {
            *x *= inv;
        }
    }
}

/// `ds = P (dP - Σ_j P dP)` per row in place of `dp`, 0 where `hidden`.
fn softmax_grad_rows(p: &[f32], dp: &mut [f32], w: usize, hidden: Option<&[bool]>) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { softmax_grad_rows_avx2(p, dp, w, hidden) };
    }
    softmax_grad_rows_impl(p, dp, w, hidden)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn softmax_grad_rows_avx2(p: &[f32], dp: &mut [f32], w: usize, hidden: Option<&[bool]>) {
    softmax_grad_rows_impl(p, dp, w, hidden)
}

#[inline(always)]
fn softmax_grad_rows_impl(p: &[f32], dp: &mut [f32], w: usize, hidden: Option<&[bool]>) {
    for (pr, dr) in p.chunks_exact(w).zip(dp.chunks_exact_mut(w)) {
        let mut acc = [0f32; 8];
        let mut pc = pr.chunks_exact(8);
        let mut dc = dr.chunks_exact(8);
        for (a, b) in (&mut pc).zip(&mut dc) {
            for t in 0..8 {
                acc[t] += a[t] * b[t];
            }
        }
        let mut dot: f32 = acc.iter().sum();
        for (a, b) in pc.remainder().iter().zip(dc.remainder()) {
            dot += a * b;
        }
        for (x, &pv) in dr.iter_mut().zip(pr) {
            *x = pv * (*x - dot);
        }
    }
    if let Some(hidden) = hidden {
        for (x, &m) in dp.iter_mut().zip(hidden) {
            if m {
                *x = 0.0;
            }
        }
    }
}

/// Forward pass: writes `o` (`[batch, qlen, heads, d_head]`, contiguous) and, with `keep`,
/// returns `P` (`[batch, heads, qlen, klen]`, contiguous) for the backward; without it, an
/// empty vector (each task's probabilities live in a scratch buffer of its thread, and
/// [`backward`] computes them again).
pub fn forward(
    d: RelDims,
    qc: View,
    k: View,
    v: View,
    pos: Position,
    mask: Mask,
    keep: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (q, kl, dh, nh) = (d.qlen, d.klen, d.d_head, d.heads);
    let mut out = vec![0f32; d.batch * q * nh * dh];
    let dst = SharedMut(out.as_mut_ptr());
    let blocks = mask_blocks(mask, q, kl);
    // Task t = (b, h): its scores and probabilities into `p` ([Q, K]), then o = P V.
    let task = |t: usize, p: &mut [f32], x: &mut [f32]| {
        let (b, h) = (t / nh, t % nh);
        let blocks = &blocks[if blocks.len() == 1 { 0 } else { b }];
        probabilities(d, (b, h), qc, k, pos, mask, blocks, p, x);
        for &(r0, r1, w) in blocks {
            // SAFETY: task (b, h) writes o[b, r0..r1, h, :] only; `v` covers its shape.
            unsafe {
                mm(
                    (r1 - r0, dh, w),
                    dst.get().add(((b * q + r0) * nh + h) * dh),
                    ((nh * dh) as isize, 1),
                    false,
                    p.as_ptr().add(r0 * kl),
                    (kl as isize, 1),
                    v.ptr([b, h, 0, 0]),
                    (v.strides[2], v.strides[3]),
                );
            }
        }
    };
    let scratch = || vec![0f32; q * d.columns];
    if keep {
        let mut probs = vec![0f32; d.batch * nh * q * kl];
        probs
            .par_chunks_mut(q * kl)
            .enumerate()
            .for_each_init(scratch, |x, (t, p)| task(t, p, x));
        (out, probs)
    } else {
        (0..d.batch * nh).into_par_iter().for_each_init(
            || (vec![0f32; q * kl], scratch()),
            |(p, x), t| task(t, p, x),
        );
        (out, Vec::new())
    }
}

/// Gradients of [`forward`]'s inputs (contiguous): `dqc`, `dk`, `dv` (`[batch, heads, len,
/// d_head]`), and the position term's: shifted `(dqp [batch, heads, qlen, d_head],
/// dR [S, heads, d_head])`, buckets `(empty, dβ [buckets, heads])`, none `(empty, empty)`.
pub struct RelGrads {
    /// `dL/dqc`.
    pub qc: Vec<f32>,
    /// `dL/dk`.
    pub k: Vec<f32>,
    /// `dL/dv`.
    pub v: Vec<f32>,
    /// `dL/dqp` (shifted), else empty.
    pub qp: Vec<f32>,
    /// `dL/dR` (shifted) or `dL/dβ` (buckets), else empty.
    pub table: Vec<f32>,
}

/// Backward pass from `g = dL/do` (`[batch, qlen, heads, d_head]`, any strides) and the
/// probabilities [`forward`] kept (`None`: each task computes its own again, the forward's
/// floats, for the cost of its scores and softmax).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    d: RelDims,
    qc: View,
    k: View,
    v: View,
    pos: Position,
    mask: Mask,
    probs: Option<&[f32]>,
    g: View,
) -> RelGrads {
    let (q, kl, dh, nh, nb) = (d.qlen, d.klen, d.d_head, d.heads, d.batch);
    let sc = d.columns;
    let mut dqc = vec![0f32; nb * nh * q * dh];
    let mut dk = vec![0f32; nb * nh * kl * dh];
    let mut dv = vec![0f32; nb * nh * kl * dh];
    let shifted_pos = matches!(pos, Position::Shifted { .. });
    let n_buckets = match pos {
        Position::Buckets { n_buckets, .. } => n_buckets,
        _ => 0,
    };
    let mut dqp = vec![0f32; if shifted_pos { nb * nh * q * dh } else { 0 }];
    // Per task: dR of its row ([S, d_head]) or dβ of its head ([buckets]), summed over the
    // rows after.
    let per_task = if shifted_pos { sc * dh } else { n_buckets };
    let mut partial = vec![0f32; nb * nh * per_task];
    // The bucket array as runs of one bucket (T5's bucket is constant over long stretches of a
    // row), found once for every task: dβ_u sums each run with a vector sum, where a scalar
    // `dβ[u] += ds_ij` per pair waits on the previous add to the same bucket.
    let runs = match pos {
        Position::Buckets { bucket, .. } => bucket_runs(bucket),
        _ => Vec::new(),
    };
    let blocks = mask_blocks(mask, q, kl);
    let ptrs = (
        SharedMut(dqc.as_mut_ptr()),
        SharedMut(dk.as_mut_ptr()),
        SharedMut(dv.as_mut_ptr()),
        SharedMut(dqp.as_mut_ptr()),
        SharedMut(partial.as_mut_ptr()),
    );
    // Per thread: dS, dX, and without saved probabilities a task's P and its scratch.
    let recompute = usize::from(probs.is_none());
    (0..nb * nh).into_par_iter().for_each_init(
        || {
            let f = |n: usize| vec![0f32; n];
            (
                f(q * kl),
                f(q * sc),
                f(recompute * q * kl),
                f(recompute * q * sc),
            )
        },
        |(ds, dx, own, x), t| {
            let (b, h) = (t / nh, t % nh);
            let blocks = &blocks[if blocks.len() == 1 { 0 } else { b }];
            let p: &[f32] = match probs {
                Some(all) => &all[t * q * kl..(t + 1) * q * kl],
                None => {
                    probabilities(d, (b, h), qc, k, pos, mask, blocks, own, x);
                    own
                }
            };
            // SAFETY: every write below goes to task t's own slices of the outputs; the views
            // cover their tensors' shapes.
            unsafe {
                let gp = g.ptr([b, 0, h, 0]);
                let g_rs = (g.strides[1], g.strides[3]);
                let hidden = mask.row(b, q, kl);
                for &(r0, r1, w) in blocks {
                    let (rows, gr) = (r1 - r0, gp.offset(r0 as isize * g.strides[1]));
                    let (pr, dsr) = (p.as_ptr().add(r0 * kl), ds.as_mut_ptr().add(r0 * kl));
                    // dP = g Vᵀ (the block's rows, its first w keys)
                    mm(
                        (rows, w, dh),
                        dsr,
                        (kl as isize, 1),
                        false,
                        gr,
                        g_rs,
                        v.ptr([b, h, 0, 0]),
                        (v.strides[3], v.strides[2]),
                    );
                    // dv += Pᵀ g
                    mm(
                        (w, dh, rows),
                        ptrs.2.get().add(t * kl * dh),
                        (dh as isize, 1),
                        true,
                        pr,
                        (1, kl as isize),
                        gr,
                        g_rs,
                    );
                    for i in r0..r1 {
                        let row = &mut ds[i * kl..(i + 1) * kl];
                        let hid = hidden.map(|m| &m[i * kl..i * kl + w]);
                        softmax_grad_rows(&p[i * kl..i * kl + w], &mut row[..w], w, hid);
                        row[w..].fill(0.0);
                    }
                    // dqc = ds K, dk += dsᵀ qc
                    mm(
                        (rows, dh, w),
                        ptrs.0.get().add((t * q + r0) * dh),
                        (dh as isize, 1),
                        false,
                        dsr,
                        (kl as isize, 1),
                        k.ptr([b, h, 0, 0]),
                        (k.strides[2], k.strides[3]),
                    );
                    mm(
                        (w, dh, rows),
                        ptrs.1.get().add(t * kl * dh),
                        (dh as isize, 1),
                        true,
                        dsr,
                        (1, kl as isize),
                        qc.ptr([b, h, r0, 0]),
                        (qc.strides[2], qc.strides[3]),
                    );
                }
                match pos {
                    Position::Shifted { qp, r } => {
                        dx.fill(0.0);
                        for (i, row) in ds.chunks_exact(kl).enumerate() {
                            let base = shifted(q, sc, i, 0);
                            dx[base..base + kl].copy_from_slice(row);
                        }
                        // dqp = dX R, dR_b = dXᵀ qp
                        mm(
                            (q, dh, sc),
                            ptrs.3.get().add(t * q * dh),
                            (dh as isize, 1),
                            false,
                            dx.as_ptr(),
                            (sc as isize, 1),
                            r.ptr([0, h, 0, 0]),
                            (r.strides[0], r.strides[2]),
                        );
                        mm(
                            (sc, dh, q),
                            ptrs.4.get().add(t * sc * dh),
                            (dh as isize, 1),
                            false,
                            dx.as_ptr(),
                            (1, sc as isize),
                            qp.ptr([b, h, 0, 0]),
                            (qp.strides[2], qp.strides[3]),
                        );
                    }
                    Position::Buckets { bucket, .. } => {
                        let db = std::slice::from_raw_parts_mut(
                            ptrs.4.get().add(t * n_buckets),
                            n_buckets,
                        );
                        assert_eq!(runs.last().map_or(0, |r| r.1), bucket.len());
                        for &(start, end, u) in &runs {
                            db[u as usize] += sum_lanes(&ds[start..end]);
                        }
                    }
                    Position::None => {}
                }
            }
        },
    );
    // Σ over the rows: dR as [S, heads, d_head], dβ as [buckets, heads].
    let table = if shifted_pos {
        let mut dr = vec![0f32; sc * nh * dh];
        dr.par_chunks_mut(nh * dh).enumerate().for_each(|(c, out)| {
            for b in 0..nb {
                for h in 0..nh {
                    let src = &partial[((b * nh + h) * sc + c) * dh..][..dh];
                    for (o, s) in out[h * dh..(h + 1) * dh].iter_mut().zip(src) {
                        *o += s;
                    }
                }
            }
        });
        dr
    } else if n_buckets > 0 {
        let mut db = vec![0f32; n_buckets * nh];
        for b in 0..nb {
            for h in 0..nh {
                let src = &partial[(b * nh + h) * n_buckets..][..n_buckets];
                for (u, s) in src.iter().enumerate() {
                    db[u * nh + h] += s;
                }
            }
        }
        db
    } else {
        Vec::new()
    };
    RelGrads {
        qc: dqc,
        k: dk,
        v: dv,
        qp: dqp,
        table,
    }
}

/// `bucket` as maximal runs `(start, end, bucket)` of one bucket, in order.
fn bucket_runs(bucket: &[u32]) -> Vec<(usize, usize, u32)> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=bucket.len() {
        if i == bucket.len() || bucket[i] != bucket[start] {
            runs.push((start, i, bucket[start]));
            start = i;
        }
    }
    runs
}

/// `Σ x` over 16 independent lanes (vectorised; no chain of dependent adds).
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}
