//! The element-wise loops of the LSH kernel, written branch-free and compiled twice (plain and
//! AVX2, picked at run time): one query's masks and de-duplication, the softmax of a chunk's
//! scores with its log-partitions, the scores' gradients; the `gemm` call of every product; and
//! the `exp`, max and sum that the relative and kNN kernels share.

use gemm::{Parallelism, gemm};

use super::{Geometry, LshKernelParams};

/// The keys of one query chunk's window.
pub(super) struct WindowKeys<'a> {
    /// Original positions, `[w]`.
    pub(super) pos: &'a [u32],
    /// Padding (1 = hidden), `[w]`.
    pub(super) hidden: &'a [u32],
    /// De-duplication: each key's chunk in each round plus `nc`, `[rounds, w]` (or empty).
    pub(super) locs: &'a [u32],
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
pub(super) fn score_grads(p: &[f32], dp: &mut [f32], live: &[bool], shift: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
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
pub(super) fn mask_row(
    p: &LshKernelParams,
    g: &Geometry,
    keys: &WindowKeys,
    query: (u32, &[u32]),
    row: &mut [f32],
    live: Option<&mut [bool]>,
    scratch: (&mut [u32], &mut [f32]),
) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { mask_row_avx2(p, g, keys, query, row, live, scratch) };
    }
    mask_row_impl(p, g, keys, query, row, live, scratch)
}

/// `(n, 2^n)` for `n = round(v)`, `|v| < 126` (so that `2^n` is a normal float): the range
/// reduction of the vectorised `exp`s here and in [`crate::gelu`]. `t = 1.5·2^23 + v` lies in
/// `[2^23, 2^24)`, where a float's ulp is 1, so adding the constant rounds `v`, and `t`'s bits
/// minus the constant's are `n` as an integer: an integer subtraction that vectorises, unlike
/// `n as i32`, whose saturating conversion compiles to one scalar instruction per lane.
#[inline(always)]
pub(crate) fn round_and_pow2(v: f32) -> (f32, f32) {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let t = v + ROUND;
    let n = t.to_bits() as i32 - ROUND.to_bits() as i32;
    (t - ROUND, f32::from_bits(((n + 127) << 23) as u32))
}

/// `e^x` to about 2 ulp, branch-free so that loops over it vectorise (Cephes' `expf`
/// polynomial); 0 below -87 (where `e^x` is under `f32`'s smallest normal, 1.2e-38).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-87.0, 88.0);
    let (n, scale) = round_and_pow2(xc * LOG2E);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut q = 1.987_569_1e-4_f32;
    q = q * r + 1.398_199_9e-3;
    q = q * r + 8.333_452e-3;
    q = q * r + 4.166_579_6e-2;
    q = q * r + 1.666_666_5e-1;
    q = q * r + 0.5;
    let e = q * r * r + r + 1.0;
    if x < -87.0 { 0.0 } else { e * scale }
}

/// `dst[m, n] (+)= alpha · lhs[m, k] · rhs[k, n]` on row-major buffers with the given
/// (column, row) strides; one thread.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
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
    // The last element each operand touches lies inside its slice (an operand with a zero
    // dimension is not read).
    assert!(m == 0 || n == 0 || (m - 1) * dst_rs + n <= dst.len());
    assert!(m == 0 || k == 0 || (m - 1) * lhs_rs + (k - 1) * lhs_cs < lhs.len());
    assert!(k == 0 || n == 0 || (k - 1) * rhs_rs + (n - 1) * rhs_cs < rhs.len());
    // SAFETY: the strides keep every access inside the slices (checked above).
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
pub(super) fn softmax_rows(s: &mut [f32], w: usize, lse: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
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
