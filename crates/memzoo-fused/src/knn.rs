//! Attention over the top-k (key, value) pairs retrieved from a kNN memory (Wu et al. 2022,
//! sec. 3), as one kernel: scores, empty-slot mask, softmax and the read, forward and
//! backward, rows of queries on rayon's pool.
//!
//! Per unit `u` = (row `b`, query `i`, head `h`), with the slots `m < k` that hold a pair
//! (`hidden_m = false`) and `τ_h` the head's temperature:
//!
//! - `d_m = q̂ · k̂_m`, `s_m = τ_h d_m`;
//! - `p_m = exp(s_m - max s) / Σ_m' exp(s_m' - max s)` over the filled slots (an empty slot
//!   takes no weight, as `softmax(mask_fill(s, -1e9))` gives it);
//! - the read `o = Σ_m p_m v_m` (eq. of sec. 3.1: `V_m = softmax(τ q̂ K̂ᵀ) V`), 0 when every slot
//!   is empty;
//! - optionally the log-partition `lse = max s + ln Σ_m exp(s_m - max s)` (a very negative
//!   number, [`EMPTY_LSE`], when every slot is empty), for a caller that shares one softmax
//!   between these scores and others: `softmax([s_r ++ s_l])` mixes the two parts' reads by
//!   `exp(lse_r - lse)` and `exp(lse_l - lse)`.
//!
//! Backward, from `g = dL/do` and `g_lse = dL/dlse` (0 without the log-partition):
//! - `dP_m = g · v_m`, `ds_m = p_m (dP_m - Σ_m' p_m' dP_m' + g_lse)` (`dlse/ds_m = p_m`);
//! - `dq̂ = τ_h Σ_m ds_m k̂_m`, `dτ_h = Σ_(b, i) Σ_m ds_m d_m`.
//!
//! Keys, values and the mask are constants (no gradient reaches the memory).

use rayon::prelude::*;

use crate::lsh::{exp_f32, sum_f32};

/// The log-partition of a unit whose slots are all empty: `exp(EMPTY_LSE - x) = 0` for any
/// finite log-partition `x` of other scores.
pub const EMPTY_LSE: f32 = -1.0e30;

/// Sizes of one call: `units` = batch x qlen query rows, `heads`, `k` slots, `d_head`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnnDims {
    /// Query rows (`batch * qlen`).
    pub rows: usize,
    /// Heads.
    pub heads: usize,
    /// Retrieved slots per (row, head).
    pub k: usize,
    /// Width of each head.
    pub d_head: usize,
    /// Whether the output carries the log-partition after each unit's read (`d_head + 1`
    /// values per unit instead of `d_head`).
    pub with_lse: bool,
}

impl KnnDims {
    /// Values per unit in the output.
    pub fn width(&self) -> usize {
        self.d_head + usize::from(self.with_lse)
    }
}

/// The kernel's inputs, row-major host slices.
#[derive(Clone, Copy, Debug)]
pub struct KnnInputs<'a> {
    /// `q̂`, `[rows, heads, d_head]`.
    pub q: &'a [f32],
    /// `τ`, `[heads]`.
    pub tau: &'a [f32],
    /// `k̂_m`, `[rows, heads, k, d_head]`.
    pub keys: &'a [f32],
    /// `v_m`, `[rows, heads, k, d_head]`.
    pub values: &'a [f32],
    /// `[rows, heads, k]`, `true` = an empty slot.
    pub hidden: &'a [bool],
}

/// Rows per rayon task (a row is `heads * k * d_head * 2` multiply-adds: 16K at 8 x 32 x 32).
const MIN_ROWS: usize = 8;

/// `out[j] = a · rows[j]` for the `out.len()` rows of `rows` (each `a.len()` wide); rows where
/// `skip[j]` get 0.
#[inline(always)]
fn dots_into(a: &[f32], rows: &[f32], skip: &[bool], out: &mut [f32]) {
    assert!(
        skip.len() >= out.len(),
        "dots_into: {} skips for {} rows",
        skip.len(),
        out.len()
    );
    crate::row::dots_into(a, rows, out);
    for (o, &skip) in out.iter_mut().zip(skip) {
        if skip {
            *o = 0.0;
        }
    }
}

/// `y += a x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = a.mul_add(*x, *y);
    }
}

/// Dots `d_m` and probabilities `p_m` of one unit into `dot_out`, `p` (0 for empty slots);
/// returns `(max s, Σ exp(s - max s))`, or `None` when every slot is empty.
#[inline(always)]
fn probs(
    q: &[f32],
    tau: f32,
    keys: &[f32],
    hidden: &[bool],
    dot_out: &mut [f32],
    p: &mut [f32],
) -> Option<(f32, f32)> {
    dots_into(q, keys, hidden, dot_out);
    let mut m = f32::NEG_INFINITY;
    for (&hid, &d) in hidden.iter().zip(dot_out.iter()) {
        if !hid {
            m = m.max(tau * d);
        }
    }
    if m == f32::NEG_INFINITY {
        p.fill(0.0);
        return None;
    }
    // Branch-free so that the loop vectorises: an empty slot's exponent is far below -87,
    // where `exp_f32` gives an exact 0.
    for ((&hid, &d), p) in hidden.iter().zip(dot_out.iter()).zip(p.iter_mut()) {
        let x = tau * d - m;
        *p = exp_f32(if hid { -1.0e4 } else { x });
    }
    let z = sum_f32(p);
    let inv = 1.0 / z;
    for p in p.iter_mut() {
        *p *= inv;
    }
    Some((m, z))
}

/// The forward of one query row (every head) into `out` (`heads * width`).
#[inline(always)]
fn forward_row_impl(d: KnnDims, x: &KnnInputs, r: usize, out: &mut [f32], scratch: &mut [f32]) {
    let (h, k, dh, w) = (d.heads, d.k, d.d_head, d.width());
    let (dots, p) = scratch.split_at_mut(k);
    for hh in 0..h {
        let u = r * h + hh;
        let q = &x.q[u * dh..(u + 1) * dh];
        let keys = &x.keys[u * k * dh..(u + 1) * k * dh];
        let values = &x.values[u * k * dh..(u + 1) * k * dh];
        let hidden = &x.hidden[u * k..(u + 1) * k];
        let o = &mut out[hh * w..(hh + 1) * w];
        o.fill(0.0);
        match probs(q, x.tau[hh], keys, hidden, dots, p) {
            None => {
                if d.with_lse {
                    o[dh] = EMPTY_LSE;
                }
            }
            Some((m, z)) => {
                for (j, &pj) in p.iter().enumerate() {
                    if pj != 0.0 {
                        axpy(&mut o[..dh], pj, &values[j * dh..(j + 1) * dh]);
                    }
                }
                if d.with_lse {
                    o[dh] = m + z.ln();
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_row_avx2(d: KnnDims, x: &KnnInputs, r: usize, out: &mut [f32], scratch: &mut [f32]) {
    forward_row_impl(d, x, r, out, scratch)
}

/// The backward of one query row (every head): `dq` (`heads * d_head`) and this row's
/// share of `dτ` (`heads`).
#[inline(always)]
fn backward_row_impl(
    d: KnnDims,
    x: &KnnInputs,
    g: &[f32],
    r: usize,
    (dq, dtau): (&mut [f32], &mut [f32]),
    scratch: &mut [f32],
) {
    let (h, k, dh, w) = (d.heads, d.k, d.d_head, d.width());
    let (dots, rest) = scratch.split_at_mut(k);
    let (p, ds) = rest.split_at_mut(k);
    for hh in 0..h {
        let u = r * h + hh;
        let q = &x.q[u * dh..(u + 1) * dh];
        let keys = &x.keys[u * k * dh..(u + 1) * k * dh];
        let values = &x.values[u * k * dh..(u + 1) * k * dh];
        let hidden = &x.hidden[u * k..(u + 1) * k];
        let gu = &g[u * w..(u + 1) * w];
        let dq = &mut dq[hh * dh..(hh + 1) * dh];
        dq.fill(0.0);
        dtau[hh] = 0.0;
        let tau = x.tau[hh];
        if probs(q, tau, keys, hidden, dots, p).is_none() {
            continue;
        }
        let g_lse = if d.with_lse { gu[dh] } else { 0.0 };
        // dP_m = g · v_m (empty slots: 0, as their p).
        dots_into(&gu[..dh], values, hidden, ds);
        let c: f32 = p.iter().zip(ds.iter()).map(|(&pj, &dpj)| pj * dpj).sum();
        let mut dt = 0.0;
        for (j, ((&pj, dsj), &dj)) in p.iter().zip(ds.iter_mut()).zip(dots.iter()).enumerate() {
            if pj == 0.0 {
                continue;
            }
            *dsj = pj * (*dsj - c + g_lse);
            dt += *dsj * dj;
            axpy(dq, tau * *dsj, &keys[j * dh..(j + 1) * dh]);
        }
        dtau[hh] = dt;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_row_avx2(
    d: KnnDims,
    x: &KnnInputs,
    g: &[f32],
    r: usize,
    grads: (&mut [f32], &mut [f32]),
    scratch: &mut [f32],
) {
    backward_row_impl(d, x, g, r, grads, scratch)
}

/// The reads (and log-partitions) of every unit, `[rows, heads, width]`.
pub fn forward(d: KnnDims, x: &KnnInputs) -> Vec<f32> {
    let w = d.width();
    let mut out = vec![0f32; d.rows * d.heads * w];
    if out.is_empty() {
        return out;
    }
    let fast = memzoo_backend::simd::avx2();
    out.par_chunks_mut(d.heads * w)
        .enumerate()
        .with_min_len(MIN_ROWS)
        .for_each_init(
            || vec![0f32; 2 * d.k],
            |scratch, (r, o)| {
                #[cfg(target_arch = "x86_64")]
                if fast {
                    // SAFETY: the CPU supports the features the function is compiled for.
                    return unsafe { forward_row_avx2(d, x, r, o, scratch) };
                }
                let _ = fast;
                forward_row_impl(d, x, r, o, scratch)
            },
        );
    out
}

/// `(dq̂ [rows, heads, d_head], dτ [heads])` from `g = dL/dout` (`[rows, heads, width]`).
pub fn backward(d: KnnDims, x: &KnnInputs, g: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (h, dh) = (d.heads, d.d_head);
    let mut dq = vec![0f32; d.rows * h * dh];
    // Per-row shares of dτ, summed in a fixed order below (the result does not depend on
    // how rayon splits the rows).
    let mut dtau_rows = vec![0f32; d.rows * h];
    if !dq.is_empty() {
        let fast = memzoo_backend::simd::avx2();
        dq.par_chunks_mut(h * dh)
            .zip(dtau_rows.par_chunks_mut(h))
            .enumerate()
            .with_min_len(MIN_ROWS)
            .for_each_init(
                || vec![0f32; 3 * d.k],
                |scratch, (r, (dq, dt))| {
                    #[cfg(target_arch = "x86_64")]
                    if fast {
                        // SAFETY: the CPU supports the features the function is compiled for.
                        return unsafe { backward_row_avx2(d, x, g, r, (dq, dt), scratch) };
                    }
                    let _ = fast;
                    backward_row_impl(d, x, g, r, (dq, dt), scratch)
                },
            );
    }
    let mut dtau = vec![0f32; h];
    for row in dtau_rows.chunks_exact(h.max(1)) {
        for (a, b) in dtau.iter_mut().zip(row) {
            *a += b;
        }
    }
    (dq, dtau)
}
