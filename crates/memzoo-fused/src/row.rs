//! Products of a single row, `o = a B`, for the attention of one query (a generated token),
//! the kNN attention's units and a kNN store's search of one query ([`dots_into`]): the scores
//! `o_j = a · b_j` against each key row `b_j`, and the output `o = Σ_j a_j b_j` over the value
//! rows.
//!
//! `gemm` runs a one-row product as a matrix-vector product whose inner loop, for the scores,
//! ends every output with a horizontal sum of one register (about 30 cycles per 32-wide key on
//! the Zen 5), and for the output loads and stores the accumulator at every row. Here the
//! scores take eight keys at a time in eight independent accumulators, and the output keeps its
//! accumulators in registers across the rows. The sums are taken in another order than
//! `gemm`'s, so the results differ from its in the last bits.

/// The operands of a one-row product: a vector `a`, `n` rows `b_j` of `d` floats `bs` apart
/// (`b[j · bs + c]`), and the output `o` (`+=` when `accumulate`), for either product:
/// - the dots ([`Rows::dots`]): `o[j · os] (+)= Σ_{c < d} a[c] · b[j · bs + c]` for `j < n`;
/// - the combination ([`combine_avx512`], [`combine_avx2`]; `os` 1):
///   `o[c] (+)= Σ_{j < n} a[j] · b[j · bs + c]` for `c < d`.
///
/// Raw pointers: the constructor's caller vouches for them.
#[derive(Clone, Copy)]
struct Rows {
    a: *const f32,
    b: *const f32,
    bs: usize,
    d: usize,
    n: usize,
    o: *mut f32,
    os: isize,
    accumulate: bool,
}

impl Rows {
    /// Writes output `j`: `s`, or `s` added to it.
    ///
    /// # Safety
    /// `j < n`, and `o` writable at `j · os`.
    #[inline(always)]
    unsafe fn put(self, j: usize, s: f32) {
        // SAFETY: the caller's.
        unsafe {
            let at = self.o.offset(j as isize * self.os);
            *at = if self.accumulate { *at + s } else { s };
        }
    }

    /// The dots, with AVX-512 or AVX2 where the CPU has them, else a plain loop.
    ///
    /// # Safety
    /// `a` holds `d` floats; `b` holds `n` rows of `d` floats `bs` apart; `o` is writable at
    /// `j · os` for `j < n` and aliases neither.
    unsafe fn dots(self) {
        #[cfg(target_arch = "x86_64")]
        {
            if memzoo_backend::simd::avx512() {
                // SAFETY: the CPU has AVX-512 F; the rest is the caller's.
                return unsafe { dots_avx512(self) };
            }
            if memzoo_backend::simd::avx2() {
                // SAFETY: the CPU has AVX2 and FMA; the rest is the caller's.
                return unsafe { dots_avx2(self) };
            }
        }
        // SAFETY: the caller's.
        unsafe { dots_portable(self) }
    }
}

/// `out[j] = a · rows[j]` for the `out.len()` rows of `rows`, each `a.len()` wide: one query's
/// scores against keys stored row by row (the kNN attention's units, a kNN store's search of
/// one query).
///
/// # Panics
/// When `rows` holds fewer than `out.len()` rows.
pub fn dots_into(a: &[f32], rows: &[f32], out: &mut [f32]) {
    let (d, n) = (a.len(), out.len());
    assert!(
        rows.len() >= n * d,
        "dots_into: {n} rows of {d} in {}",
        rows.len()
    );
    // SAFETY: `a` is `d` floats, `rows` holds `n` rows of `d` (asserted), `out` `n` floats.
    unsafe {
        Rows {
            a: a.as_ptr(),
            b: rows.as_ptr(),
            bs: d,
            d,
            n,
            o: out.as_mut_ptr(),
            os: 1,
            accumulate: false,
        }
        .dots()
    };
}

/// [`Rows::dots`] in plain loops.
///
/// # Safety
/// As [`Rows::dots`].
unsafe fn dots_portable(x: Rows) {
    for j in 0..x.n {
        // SAFETY: the caller's.
        unsafe {
            let s: f32 = (0..x.d).map(|c| *x.a.add(c) * *x.b.add(j * x.bs + c)).sum();
            x.put(j, s);
        }
    }
}

/// `dst[0, :] (+)= lhs[0, :] · rhs` for a one-row product `[1, k] x [k, n]` through raw
/// strides, as `relative`'s `mm` takes them (`rhs_rs` along `k`, `rhs_cs` along `n`), where a
/// SIMD kernel here takes the layout: the scores ([`Rows::dots`]: `lhs` and `rhs`'s rows along `k`
/// contiguous) with AVX-512 or AVX2, the output (`rhs`'s and `dst`'s columns contiguous: one
/// multiply-add of a row per `k`) with AVX-512, or AVX2 for whole registers. `false` (nothing
/// written) elsewhere.
///
/// # Safety
/// Every element the shapes and strides address must be valid (`dst` writable, not aliased).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product(
    (n, k): (usize, usize),
    dst: *mut f32,
    dst_cs: isize,
    accumulate: bool,
    lhs: *const f32,
    lhs_cs: isize,
    rhs: *const f32,
    (rhs_rs, rhs_cs): (isize, isize),
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if lhs_cs == 1 && rhs_rs == 1 && rhs_cs > 0 && memzoo_backend::simd::avx2() {
        // SAFETY: column `j` of `rhs` is `k` floats at `j rhs_cs`; the rest the caller's.
        let x = Rows {
            a: lhs,
            b: rhs,
            bs: rhs_cs as usize,
            d: k,
            n,
            o: dst,
            os: dst_cs,
            accumulate,
        };
        unsafe { x.dots() };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if lhs_cs == 1 && rhs_cs == 1 && dst_cs == 1 && rhs_rs > 0 {
        // Row `j` of `rhs` is `n` floats at `j rhs_rs`, `lhs` `k` floats.
        let x = Rows {
            a: lhs,
            b: rhs,
            bs: rhs_rs as usize,
            d: n,
            n: k,
            o: dst,
            os: 1,
            accumulate,
        };
        if memzoo_backend::simd::avx512() {
            // SAFETY: the CPU has AVX-512 F; the rest is the caller's.
            unsafe { combine_avx512(x) };
            return true;
        }
        if memzoo_backend::simd::avx2() && n.is_multiple_of(8) {
            // SAFETY: the CPU has AVX2 and FMA; `n` whole registers wide; as above.
            unsafe { combine_avx2(x) };
            return true;
        }
    }
    // (Read here too so that a build for another architecture, without the kernels, does
    // not warn of unused arguments.)
    let _ = (
        n, k, dst, dst_cs, accumulate, lhs, lhs_cs, rhs, rhs_rs, rhs_cs,
    );
    false
}

/// Keys scored together: eight independent chains of multiply-adds keep both FMA units busy
/// through their latency.
const ROWS: usize = 8;

/// [`Rows::dots`] with AVX-512: eight rows at a time, 16 columns per multiply-add (the last ones
/// masked), each row's register summed at the end.
///
/// # Safety
/// The CPU must have AVX-512 F; as [`Rows::dots`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512(x: Rows) {
    use std::arch::x86_64::*;
    let Rows { a, b, bs, d, n, .. } = x;
    let full = d / 16 * 16;
    let tail: __mmask16 = ((1u32 << (d % 16)) - 1) as __mmask16;
    // SAFETY (every load): columns `c < d` of `a` and of rows `j < n` of `b`, the tail masked.
    let row = |j: usize, acc: &mut __m512| unsafe {
        let r = b.add(j * bs);
        let mut c = 0;
        while c < full {
            *acc = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(c)), _mm512_loadu_ps(r.add(c)), *acc);
            c += 16;
        }
        if tail != 0 {
            let x = _mm512_maskz_loadu_ps(tail, a.add(full));
            *acc = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, r.add(full)), *acc);
        }
    };
    // SAFETY: `j < n`, the caller's.
    let put = |j: usize, s: f32| unsafe { x.put(j, s) };
    let mut j0 = 0;
    while j0 + ROWS <= n {
        let mut acc = [_mm512_setzero_ps(); ROWS];
        for (r, acc) in acc.iter_mut().enumerate() {
            row(j0 + r, acc);
        }
        for (r, acc) in acc.into_iter().enumerate() {
            put(j0 + r, _mm512_reduce_add_ps(acc));
        }
        j0 += ROWS;
    }
    for j in j0..n {
        let mut acc = _mm512_setzero_ps();
        row(j, &mut acc);
        put(j, _mm512_reduce_add_ps(acc));
    }
}

/// [`Rows::dots`] with AVX2: as [`dots_avx512`], 8 columns per multiply-add and the last `d % 8`
/// in plain arithmetic.
///
/// # Safety
/// The CPU must have AVX2 and FMA; as [`Rows::dots`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(x: Rows) {
    use std::arch::x86_64::*;
    let Rows { a, b, bs, d, n, .. } = x;
    let full = d / 8 * 8;
    // SAFETY (every load): columns `c < d` of `a` and of rows `j < n` of `b`.
    let row = |j: usize, acc: &mut __m256| -> f32 {
        unsafe {
            let r = b.add(j * bs);
            let mut c = 0;
            while c < full {
                *acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(c)), _mm256_loadu_ps(r.add(c)), *acc);
                c += 8;
            }
            (full..d).map(|c| *a.add(c) * *r.add(c)).sum()
        }
    };
    let hsum = |v: __m256| -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    };
    // SAFETY: `j < n`, the caller's.
    let put = |j: usize, s: f32| unsafe { x.put(j, s) };
    let mut j0 = 0;
    while j0 + ROWS <= n {
        let mut acc = [_mm256_setzero_ps(); ROWS];
        let mut rest = [0f32; ROWS];
        for (r, acc) in acc.iter_mut().enumerate() {
            rest[r] = row(j0 + r, acc);
        }
        for (r, acc) in acc.into_iter().enumerate() {
            put(j0 + r, hsum(acc) + rest[r]);
        }
        j0 += ROWS;
    }
    for j in j0..n {
        let mut acc = _mm256_setzero_ps();
        let rest = row(j, &mut acc);
        put(j, hsum(acc) + rest);
    }
}

/// Output columns whose accumulators stay in registers across the rows: four 16-wide ones.
const COLUMNS: usize = 64;

/// `o[c] (+)= Σ_{j < n} a[j] · b[j · bs + c]` for `c < d` (`+=` when `accumulate`): per band
/// of 64 columns, four accumulators (the last band's masked) through every row.
///
/// # Safety
/// The CPU must have AVX-512 F; `a` holds `n` floats; `b` holds `n` rows of `d` floats `bs`
/// apart; `o` holds `d` floats and aliases neither.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn combine_avx512(x: Rows) {
    use std::arch::x86_64::*;
    let Rows {
        a,
        b,
        bs,
        d,
        n,
        o,
        accumulate,
        ..
    } = x;
    for c0 in (0..d).step_by(COLUMNS) {
        // Lanes of each of the band's four registers inside the output.
        let masks: [__mmask16; 4] = std::array::from_fn(|v| {
            let lanes = d.saturating_sub(c0 + 16 * v).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        });
        let mut acc = [_mm512_setzero_ps(); 4];
        for j in 0..n {
            // SAFETY: `j < n`; row `j`'s columns `c0 + 16 v + lane` below `d` (masked).
            unsafe {
                let w = _mm512_set1_ps(*a.add(j));
                let r = b.add(j * bs + c0);
                for (v, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_maskz_loadu_ps(masks[v], r.add(16 * v));
                    *acc = _mm512_fmadd_ps(w, x, *acc);
                }
            }
        }
        for (v, acc) in acc.into_iter().enumerate() {
            // SAFETY: the output's columns `c0 + 16 v + lane` below `d` (masked).
            unsafe {
                let at = o.add(c0 + 16 * v);
                let sum = if accumulate {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(masks[v], at), acc)
                } else {
                    acc
                };
                _mm512_mask_storeu_ps(at, masks[v], sum);
            }
        }
    }
}

/// [`combine_avx512`] with AVX2, for outputs a whole number of 8-float registers wide: per
/// band of 32 columns, four accumulators (the last band's unused ones idle) through every row.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `d` a multiple of 8; as [`combine_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn combine_avx2(x: Rows) {
    use std::arch::x86_64::*;
    let Rows {
        a,
        b,
        bs,
        d,
        n,
        o,
        accumulate,
        ..
    } = x;
    const BAND: usize = 32;
    for c0 in (0..d).step_by(BAND) {
        let width = (d - c0).min(BAND) / 8;
        let mut acc = [_mm256_setzero_ps(); BAND / 8];
        for j in 0..n {
            // SAFETY: `j < n`; row `j`'s columns `c0 + 8 v..c0 + 8 v + 8 <= d`.
            unsafe {
                let w = _mm256_set1_ps(*a.add(j));
                let r = b.add(j * bs + c0);
                for (v, acc) in acc.iter_mut().enumerate().take(width) {
                    *acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(r.add(8 * v)), *acc);
                }
            }
        }
        for (v, acc) in acc.into_iter().enumerate().take(width) {
            // SAFETY: the output's columns `c0 + 8 v..c0 + 8 v + 8 <= d`.
            unsafe {
                let at = o.add(c0 + 8 * v);
                let sum = if accumulate {
                    _mm256_add_ps(_mm256_loadu_ps(at), acc)
                } else {
                    acc
                };
                _mm256_storeu_ps(at, sum);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A float in [-1, 1) from a counter (no generator needed).
    fn value(i: usize) -> f32 {
        ((i.wrapping_mul(2_654_435_761) % 2000) as f32 - 1000.0) / 1000.0
    }

    type Kernel = unsafe fn(Rows);

    /// Each kernel this CPU has (and the plain loop) against the naive sums in f64, for widths around the
    /// registers' (tails of 1, 7 and 15 columns, several bands of 64), row counts around the
    /// eight-row groups, a row stride wider than the row, a strided output (scores) and both
    /// write modes; nothing written between or past the outputs.
    #[test]
    fn one_row_products_equal_naive_sums() {
        let mut kernels: Vec<(&str, Kernel)> = vec![("portable", dots_portable)];
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if avx2 {
            kernels.push(("avx2", dots_avx2));
        }
        let avx512 = is_x86_feature_detected!("avx512f");
        if avx512 {
            kernels.push(("avx512", dots_avx512));
        }
        for d in [1, 7, 16, 31, 32, 64, 65, 130] {
            for n in [1, 7, 8, 9, 17, 100] {
                let bs = d + 3;
                let a: Vec<f32> = (0..n.max(d)).map(value).collect();
                let b: Vec<f32> = (0..n * bs).map(|i| value(i + 7919)).collect();
                let tol = |want: f64| 1e-5 * (1.0 + want.abs()) * (n.max(d) as f64).sqrt();
                for accumulate in [false, true] {
                    let base = if accumulate { 0.5 } else { 0.0 };
                    for &(name, kernel) in &kernels {
                        // Scores: n outputs, 2 apart.
                        let mut o = vec![0.5f32; 2 * n];
                        // SAFETY: the sizes above; the CPU has the kernel's features.
                        unsafe {
                            kernel(Rows {
                                a: a.as_ptr(),
                                b: b.as_ptr(),
                                bs,
                                d,
                                n,
                                o: o.as_mut_ptr(),
                                os: 2,
                                accumulate,
                            })
                        };
                        for j in 0..n {
                            let want = base
                                + (0..d)
                                    .map(|c| a[c] as f64 * b[j * bs + c] as f64)
                                    .sum::<f64>();
                            let got = o[2 * j] as f64;
                            let at = format!("{name} dots d {d} n {n} j {j}");
                            assert!((got - want).abs() < tol(want), "{at}: {got} vs {want}");
                            assert_eq!(o[2 * j + 1], 0.5, "{at}: wrote between outputs");
                        }
                    }
                    let mut combines: Vec<(&str, Kernel)> = Vec::new();
                    if avx512 {
                        combines.push(("avx512", combine_avx512));
                    }
                    if avx2 && d % 8 == 0 {
                        combines.push(("avx2", combine_avx2));
                    }
                    for &(name, combine) in &combines {
                        // Output: d contiguous columns, then a sentinel.
                        let mut o = vec![0.5f32; d + 1];
                        // SAFETY: the sizes above; the CPU has the kernel's features.
                        unsafe {
                            combine(Rows {
                                a: a.as_ptr(),
                                b: b.as_ptr(),
                                bs,
                                d,
                                n,
                                o: o.as_mut_ptr(),
                                os: 1,
                                accumulate,
                            })
                        };
                        for c in 0..d {
                            let want = base
                                + (0..n)
                                    .map(|j| a[j] as f64 * b[j * bs + c] as f64)
                                    .sum::<f64>();
                            let got = o[c] as f64;
                            let at = format!("{name} combine d {d} n {n} c {c}");
                            assert!((got - want).abs() < tol(want), "{at}: {got} vs {want}");
                        }
                        assert_eq!(
                            o[d], 0.5,
                            "{name} combine d {d} n {n}: wrote past the output"
                        );
                    }
                }
            }
        }
    }
}
