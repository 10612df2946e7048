//! The exact relative shift.
//!
//! Relative attention scores the pair (query `i`, key `j`) with an embedding of their distance
//! `d = i + mlen - j` (query `i` sits at absolute position `mlen + i` once `mlen` memory keys are
//! prepended). Scoring each query against every *distance* is one matmul, `q · Rᵀ`, whose
//! column `c` belongs to distance `klen - 1 - c`; the shift then moves each row so that column
//! `j` holds distance `i + mlen - j`:
//!
//! ```text
//! out[i, j] = x[i, qlen - 1 - i + j]        0 <= i < qlen, 0 <= j < klen
//! ```
//!
//! `x` has `W = klen + qlen - 1` columns, one per distance from `klen - 1` down to `-(qlen - 1)`,
//! so every output entry is a real score: the upper (future) triangle is filled with the scores
//! of negative distances, not with the neighbouring row's values as in the approximate shifts
//! (which are only correct because the causal mask hides their garbage).
//!
//! It is the pad-and-reshape trick of Dai et al. (2019, appendix B), made exact: pad one zero
//! column on the right (`W + 1` columns), flatten the last two dims, drop the first `qlen - 1`
//! entries, and read the rest as rows of length `W`. Entry `x[i, c]` sits at flat position
//! `i (W + 1) + c`; with `c = qlen - 1 - i + j` that is `(qlen - 1) + i W + j`, i.e. row `i`,
//! column `j` of the re-read matrix.

use burn::tensor::Tensor;

/// Number of distance columns the shift needs: `klen + qlen - 1`.
pub fn n_distances(qlen: usize, klen: usize) -> usize {
    klen + qlen - 1
}

/// The distance of column `c` of a distance-major score matrix: `klen - 1 - c`.
pub fn distance_of_column(c: usize, klen: usize) -> i64 {
    klen as i64 - 1 - c as i64
}

/// Re-indexes scores by distance into scores by key.
///
/// `x` holds either every distance (`klen + qlen - 1` columns) or, for causal attention, only
/// the non-negative ones (`klen` columns, distances `klen - 1 .. 0`): the missing negative
/// distances (future keys, which the causal mask hides) then read as exact zeros.
///
/// # Shapes
/// - `x`: `[batch, heads, qlen, klen + qlen - 1]` or `[batch, heads, qlen, klen]`,
///   column `c` = distance `klen - 1 - c`
/// - output: `[batch, heads, qlen, klen]`, `out[.., i, j] = x[.., i, qlen - 1 - i + j]`
pub fn relative_shift(x: Tensor<4>, klen: usize) -> Tensor<4> {
    let [b, h, qlen, c] = x.dims();
    let w = n_distances(qlen, klen);
    debug_assert!(
        c == w || c == klen,
        "relative_shift: {c} columns for klen {klen}, qlen {qlen}"
    );
    if qlen == 1 {
        return x; // one row: out[0, j] = x[0, j], and W = klen
    }
    let device = x.device();
    // Zero columns up to W + 1: the missing negative distances and the one pad column.
    let zeros = Tensor::<4>::zeros([b, h, qlen, w + 1 - c], &device);
    Tensor::cat(vec![x, zeros], 3)
        .reshape([b, h, qlen * (w + 1)])
        .narrow(2, qlen - 1, qlen * w)
        .reshape([b, h, qlen, w])
        .narrow(3, 0, klen)
}
