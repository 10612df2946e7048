//! The LSH bucket sort with device ops only: a stable radix sort on the bucket ids.
//!
//! Burn's sorts run on the host for CubeCL's devices (wgpu, CUDA: CubeCL has no sort kernel;
//! [`memzoo_backend::sorts_on_host`]), a copy to the CPU and back at every LSH layer, forward
//! and reverse. The keys here are small (bucket ids below `n_values`, a few thousand at most), so
//! a least-significant-digit radix sort with one bit a pass (Blelloch's split) orders them with
//! element-wise ops, prefix sums and scatters: `⌈log2 n_values⌉` passes of `O(len)` work each.

use burn::tensor::{IndexingUpdateOp, Int, Tensor};

/// The block length of [`prefix_sum`]: each level sums within blocks of this many elements.
const SCAN_BLOCK: usize = 64;

/// Inclusive prefix sums along the last dimension, `y[.., j] = Σ_{i ≤ j} x[.., i]`, in
/// `O(len · SCAN_BLOCK)` work.
///
/// CubeCL's `cumsum` reads the whole prefix for each output (`O(len²)` along the dimension), so
/// the sum runs in levels: within blocks of 64 (`SCAN_BLOCK`), then over the blocks' totals (the
/// same way, recursively), each block adding the totals of the blocks before it.
///
/// # Shapes
/// - `x`, output: `[rows, len]`
pub fn prefix_sum(x: Tensor<2, Int>) -> Tensor<2, Int> {
    let [rows, len] = x.dims();
    if len <= SCAN_BLOCK {
        return x.cumsum(1);
    }
    let blocks = len.div_ceil(SCAN_BLOCK);
    let padded = match blocks * SCAN_BLOCK - len {
        0 => x,
        pad => {
            let zeros = Tensor::<2, Int>::zeros([rows, pad], &x.device()).cast(x.dtype());
            Tensor::cat(vec![x, zeros], 1)
        }
    };
    let within = padded.reshape([rows, blocks, SCAN_BLOCK]).cumsum(2);
    let totals = within
        .clone()
        .slice([0..rows, 0..blocks, SCAN_BLOCK - 1..SCAN_BLOCK])
        .reshape([rows, blocks]);
    // What the blocks before each block add: the exclusive prefix sum of the totals.
    let before = prefix_sum(totals.clone()) - totals;
    (within + before.reshape([rows, blocks, 1]))
        .reshape([rows, blocks * SCAN_BLOCK])
        .slice([0..rows, 0..len])
}

/// The stable sort of each row by its keys, as the permutation that sorts it:
/// `keys[r, order[r, 0]] ≤ keys[r, order[r, 1]] ≤ ...`, equal keys in their original order.
/// The same permutation as `keys.sort_with_indices(1)` on distinct `(key, index)` pairs, with
/// device ops only.
///
/// Each pass moves the elements whose bit `p` is 0 to the front, in order, then those whose
/// bit is 1 (a stable split): element `i` with bit `b_i`, `o_i = Σ_{j < i} b_j` ones before it
/// and `z = len - Σ_j b_j` zeros in all goes to `i - o_i` when `b_i = 0`, to `z + o_i` when
/// `b_i = 1`. After the passes over bits `0..⌈log2 n_values⌉`, lowest first, the rows are
/// sorted by the whole key.
///
/// # Shapes
/// - `keys`: `[rows, len]`, values in `0..n_values`
/// - output: `[rows, len]`, indices into `0..len`
pub fn stable_order(keys: Tensor<2, Int>, n_values: usize) -> Tensor<2, Int> {
    let [rows, len] = keys.dims();
    let device = keys.device();
    let index = memzoo_backend::index_range(len, &device)
        .reshape([1, len])
        .expand([rows, len])
        .cast(keys.dtype());
    let bits = usize::BITS - n_values.saturating_sub(1).leading_zeros();
    let (mut order, mut keys) = (index.clone(), keys);
    for p in 0..bits {
        let bit = keys.clone().div_scalar(1i64 << p).remainder_scalar(2);
        let ones_through = prefix_sum(bit.clone());
        let zeros = ones_through
            .clone()
            .slice([0..rows, len - 1..len])
            .neg()
            .add_scalar(len as i64);
        let ones_before = ones_through - bit.clone();
        let zeros_before = index.clone() - ones_before.clone();
        // b ? z + o : i - o, as i - o + b (z + o - (i - o)).
        let dest = zeros_before.clone() + bit * (zeros + ones_before - zeros_before);
        let place = |values: Tensor<2, Int>| {
            Tensor::zeros_like(&values).scatter(1, dest.clone(), values, IndexingUpdateOp::Add)
        };
        order = place(order);
        if p + 1 < bits {
            keys = place(keys);
        }
    }
    order
}
