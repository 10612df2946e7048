//! The exact GELU and its derivative on host slices, vectorisable and multi-threaded.
//!
//! `gelu(x) = x Φ(x)`, `Φ(x) = ½ (1 + erf(x / √2))` the standard normal's CDF (Hendrycks and
//! Gimpel 2016; not the tanh approximation), and `gelu'(x) = Φ(x) + x φ(x)`,
//! `φ(x) = e^{-x²/2} / √(2π)`.
//!
//! Burn's `flex` backend evaluates it one element at a time on one thread with the C library's
//! `erff`, a branchy function the compiler cannot vectorise: in a GELU feed-forward that is
//! about a tenth of a training step. Here both directions are branch-free loops the compiler
//! turns into SIMD code, split across threads:
//!
//! - `erfc` by Abramowitz and Stegun's 7.1.26, `erfc(u) = t P(t) e^{-u²}` for `u ≥ 0`,
//!   `t = 1 / (1 + p u)`, a degree-5 polynomial (absolute error below 1.5e-7), so that
//!   `Φ(x) = ½ erfc(|x| / √2)` for `x < 0` and `1 − ½ erfc(|x| / √2)` for `x ≥ 0`: no
//!   cancellation in the far left tail, where `Φ` is tiny;
//! - `e^y` by range reduction `y = n ln 2 + r`, `|r| ≤ ln 2 / 2`, a degree-7 Taylor polynomial
//!   in `r` (relative error about 1e-8 before rounding) and `2^n` built in the exponent bits.
//!
//! Against the C library's `erff` the forward differs by at most about 1e-7 of `|x|`
//! (`fused_relative::fused_gelu_matches_burns_exact_gelu` in the tests, gradients included).

use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// `1 / √2`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1 / √(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// `e^y` for `y ≤ 0` (clamped at -87, where `e^y` is below f32's smallest normal number).
#[inline(always)]
fn exp_neg(y: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 products with small n, and the rest.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let y = y.max(-87.0);
    let (n, two_n) = crate::lsh::round_and_pow2(y * LOG2_E);
    let r = (y - n * LN2_HI) - n * LN2_LO;
    // e^r, Horner form of Σ_{k ≤ 7} r^k / k!.
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    p * two_n
}

/// `(Φ(x), e^{-x²/2})`: the normal CDF and the unnormalised density.
#[inline(always)]
fn cdf_and_density(x: f32) -> (f32, f32) {
    // Abramowitz and Stegun 7.1.26.
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let u = x.abs() * FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * u);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let density = exp_neg(-0.5 * x * x);
    // ½ erfc(|x| / √2): the tail beyond |x|.
    let tail = 0.5 * poly * density;
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    (cdf, density)
}

/// The elements of a tensor in row-major order as `rows` runs of `len` contiguous values,
/// `stride` apart, from `offset` in `data`: a contiguous tensor (one run), or a view whose last
/// dim is contiguous and whose other dims step evenly (GEGLU's half of a product's columns).
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    /// The storage.
    pub data: &'a [f32],
    /// Offset of the first element.
    pub offset: usize,
    /// Runs.
    pub rows: usize,
    /// Values per run.
    pub len: usize,
    /// Distance between the starts of consecutive runs.
    pub stride: usize,
}

impl<'a> Rows<'a> {
    /// A contiguous slice as one run.
    pub fn contiguous(x: &'a [f32]) -> Self {
        Rows {
            data: x,
            offset: 0,
            rows: 1,
            len: x.len(),
            stride: x.len(),
        }
    }

    /// Elements.
    pub fn n(&self) -> usize {
        self.rows * self.len
    }

    /// Calls `f(first element's index, values)` for each contiguous piece of the elements
    /// `start..start + count` (row-major).
    fn pieces(&self, start: usize, count: usize, mut f: impl FnMut(usize, &[f32])) {
        let (mut e, end) = (start, start + count);
        while e < end {
            let (r, c) = (e / self.len, e % self.len);
            let take = (self.len - c).min(end - e);
            let at = self.offset + r * self.stride + c;
            f(e - start, &self.data[at..at + take]);
            e += take;
        }
    }

    fn check(&self) {
        if self.n() > 0 {
            let last = self.offset + (self.rows - 1) * self.stride + self.len;
            assert!(
                self.len <= self.stride || self.rows == 1,
                "gelu: rows overlap"
            );
            assert!(last <= self.data.len(), "gelu: rows outside the storage");
        }
    }
}

/// `y_i = gelu(x_i)` for the elements of `x` in row-major order, in parallel.
///
/// # Shapes
/// - `x`: `rows x len` elements, `y`: as many
pub fn forward(x: Rows, y: &mut [f32]) {
    x.check();
    assert_eq!(x.n(), y.len(), "gelu forward: input and output lengths");
    y.par_chunks_mut(CHUNK).enumerate().for_each(|(t, y)| {
        let n = y.len();
        x.pieces(t * CHUNK, n, |at, x| {
            forward_chunk(x, &mut y[at..at + x.len()])
        });
    });
}

/// [`forward`] on one chunk, on AVX2 where the CPU has it (8 lanes instead of SSE's 4; the
/// same operations, so the same results: Rust does not contract `a * b + c` into an FMA).
fn forward_chunk(x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
        // SAFETY: the CPU supports the feature the function is compiled for.
        return unsafe { forward_chunk_avx2(x, y) };
    }
    forward_chunk_impl(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn forward_chunk_avx2(x: &[f32], y: &mut [f32]) {
    forward_chunk_impl(x, y)
}

#[inline(always)]
fn forward_chunk_impl(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x * cdf_and_density(x).0;
    }
}

/// `dx_i = dy_i gelu'(x_i)` for the elements of `x` in row-major order, in parallel.
///
/// # Shapes
/// - `x`: `rows x len` elements, `dy`, `dx`: as many
pub fn backward(x: Rows, dy: &[f32], dx: &mut [f32]) {
    x.check();
    assert_eq!(x.n(), dy.len(), "gelu backward: input and gradient lengths");
    assert_eq!(x.n(), dx.len(), "gelu backward: input and output lengths");
    dx.par_chunks_mut(CHUNK)
        .zip(dy.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(t, (dx, dy))| {
            let n = dx.len();
            x.pieces(t * CHUNK, n, |at, x| {
                let end = at + x.len();
                backward_chunk(x, &dy[at..end], &mut dx[at..end])
            });
        });
}

/// [`backward`] on one chunk, on AVX2 where the CPU has it (as [`forward_chunk`]).
fn backward_chunk(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if memzoo_backend::simd::avx2() {
        // SAFETY: the CPU supports the feature the function is compiled for.
        return unsafe { backward_chunk_avx2(x, dy, dx) };
    }
    backward_chunk_impl(x, dy, dx)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn backward_chunk_avx2(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    backward_chunk_impl(x, dy, dx)
}

#[inline(always)]
fn backward_chunk_impl(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
        let (cdf, density) = cdf_and_density(x);
        *dx = dy * (cdf + x * FRAC_1_SQRT_2PI * density);
    }
}
