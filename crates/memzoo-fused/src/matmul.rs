//! The 2-D matrix product `C = A B` on host buffers, written into a fresh buffer without
//! zeroing or copying it first.
//!
//! Burn's `flex` matmul calls the same `gemm` crate, but allocates its output as a zeroed
//! byte vector and then copies it into a 16-byte-aligned buffer (`FlexTensor::empty` through
//! `Bytes::from_bytes_vec`, which re-aligns every `Vec<u8>`): two passes over the output
//! before the product writes it, 4-8% of a small model's training step. Here the product
//! writes an uninitialised `Vec<f32>` directly. The call is Burn's own (the same operand
//! strides, `gemm` with `read_dst = false`, and the same rule for using the thread pool), so
//! the results are Burn's to the bit.
//!
//! The backward of `C = A B` from `G = dL/dC`: `dA = G Bᵀ`, `dB = Aᵀ G` (the transposes are
//! strided views, not copies).

use gemm::{Parallelism, gemm};

/// A read-only strided view of a 2-D `f32` matrix in a tensor's storage.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    /// The whole storage buffer.
    pub data: &'a [f32],
    /// Offset of element `(0, 0)`.
    pub offset: usize,
    /// Rows and columns.
    pub shape: [usize; 2],
    /// Strides (elements) of rows and columns.
    pub strides: [isize; 2],
}

impl<'a> Matrix<'a> {
    /// The transpose, as a view of the same storage.
    pub fn t(self) -> Matrix<'a> {
        Matrix {
            shape: [self.shape[1], self.shape[0]],
            strides: [self.strides[1], self.strides[0]],
            ..self
        }
    }

    /// Whether every element the shape and strides address lies inside the storage.
    fn in_bounds(&self) -> bool {
        let [r, c] = self.shape;
        if r == 0 || c == 0 {
            return true;
        }
        let mut lo = self.offset as isize;
        let mut hi = self.offset as isize;
        for (n, s) in [(r, self.strides[0]), (c, self.strides[1])] {
            let reach = (n as isize - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        lo >= 0 && (hi as usize) < self.data.len()
    }
}

/// Products of at least this many multiply-adds use the thread pool (Burn's `flex` rule).
const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;

/// `C = A B`, `[m, k] x [k, n] → [m, n]` row-major.
///
/// # Panics
/// When the inner dimensions differ or a view reaches outside its storage (the callers check
/// shapes and build the views from tensors' layouts).
///
/// # Shapes
/// - `a`: `[m, k]`, `b`: `[k, n]` → `[m, n]`
pub fn matmul(a: Matrix, b: Matrix) -> Vec<f32> {
    let ([m, k], [kb, n]) = (a.shape, b.shape);
    assert_eq!(k, kb, "matmul: [{m}, {k}] x [{kb}, {n}]");
    assert!(
        a.in_bounds() && b.in_bounds(),
        "matmul: a view outside its storage"
    );
    if k == 0 {
        return vec![0.0; m * n];
    }
    let ops = m.saturating_mul(n).saturating_mul(k);
    let parallelism = match ops >= PARALLEL_THRESHOLD {
        true => Parallelism::Rayon(0),
        false => Parallelism::None,
    };
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: the views lie inside their storage (checked above) and `out` has room for the
    // `m x n` row-major result; with `read_dst = false` gemm writes every element of it
    // without reading any (k > 0), so the length can then cover them.
    unsafe {
        gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.data.as_ptr().add(a.offset),
            a.strides[1],
            a.strides[0],
            b.data.as_ptr().add(b.offset),
            b.strides[1],
            b.strides[0],
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
        out.set_len(m * n);
    }
    out
}
