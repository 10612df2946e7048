//! The relative shift.
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
//! It is the pad-and-reshape trick of Dai et al. (2019, appendix B), without the pad: `x`
//! arrives with one column more than the distances the output reads (`S` columns), the last
//! two dims are flattened, the first `qlen - 1` entries dropped and the rest read as rows of
//! `S - 1`. Entry `x[i, c]` sits at flat position `i S + c`; with `c = qlen - 1 - i + j` that
//! is `(qlen - 1) + i (S - 1) + j`, i.e. row `i`, column `j` of the re-read matrix. The one
//! copy is the re-read; the extra column (a real distance, computed by the same matmul) only
//! gives rows their stride and no output entry reads it.
//!
//! Two widths (see [`n_columns`]):
//! - **all distances**, `S = klen + qlen`: distances `klen - 1` down to `-qlen`; every output
//!   entry is exact, the upper (future) triangle included;
//! - **causal**, `S = klen + 1`: distances `klen - 1` down to `-1`. Every entry a causal mask
//!   leaves visible (`j <= i + mlen`, distance >= 0) is exact; the hidden ones hold other
//!   entries of `x` (finite), which the mask then replaces. Half the work of the full width
//!   when `mlen = qlen`.

use burn::tensor::Tensor;

/// Number of distances between `qlen` queries and `klen` keys: `klen + qlen - 1`.
pub fn n_distances(qlen: usize, klen: usize) -> usize {
    klen + qlen - 1
}

/// Columns [`relative_shift`] takes: `klen + 1` under a causal mask (the distances it leaves
/// visible, plus one), else `klen + qlen` (every distance, plus one).
pub fn n_columns(qlen: usize, klen: usize, causal: bool) -> usize {
    if causal {
        klen + 1
    } else {
        n_distances(qlen, klen) + 1
    }
}

/// The distance of column `c` of a distance-major score matrix: `klen - 1 - c`.
pub fn distance_of_column(c: usize, klen: usize) -> i64 {
    klen as i64 - 1 - c as i64
}

/// Re-indexes scores by distance into scores by key.
///
/// `x` holds [`n_columns`] columns, column `c` = distance `klen - 1 - c`: with the full width
/// every output entry is exact; with the causal width (`klen + 1`) the entries of negative
/// distance (future keys, `j > i + mlen`) are unspecified (see the module docs).
///
/// # Shapes
/// - `x`: `[batch, heads, qlen, S]`, `S = klen + qlen` or `klen + 1`
/// - output: `[batch, heads, qlen, klen]`, `out[.., i, j] = x[.., i, qlen - 1 - i + j]`
pub fn relative_shift(x: Tensor<4>, klen: usize) -> Tensor<4> {
    let [b, h, qlen, s] = x.dims();
    debug_assert!(
        s == n_columns(qlen, klen, false) || s == n_columns(qlen, klen, true),
        "relative_shift: {s} columns for klen {klen}, qlen {qlen}"
    );
    if qlen == 1 {
        return x.narrow(3, 0, klen); // one row: out[0, j] = x[0, j]
    }
    x.reshape([b, h, qlen * s])
        .narrow(2, qlen - 1, qlen * (s - 1))
        .reshape([b, h, qlen, s - 1])
        .narrow(3, 0, klen)
}
