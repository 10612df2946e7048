//! A linear layer applied to every position as one matrix product.

use burn::nn::Linear;
use burn::tensor::Tensor;

/// `linear(x)` with the batch and position dims folded into one: `[batch * len, d_in]` rows
/// times the weight.
///
/// Burn keeps a `[batch, len, d_in]` input batched when `len` fills its row tiles: on an
/// autodiff device the product is then a batched matmul with the weight broadcast, whose
/// backward forms one weight gradient per batch row (`[batch, d_in, d_out]`, each product
/// packing the weight again) and sums them. On rows the weight gradient is one product over all
/// `batch * len` rows, `dW = Xᵀ dY`, as the maths has it (Transformer-XL's training step on
/// `flex`: see the README's Benchmarks).
///
/// # Shapes
/// - `x`: `[batch, len, d_in]` → `[batch, len, d_out]`
pub fn linear_rows(linear: &Linear, x: Tensor<3>) -> Tensor<3> {
    let [b, l, d] = x.dims();
    // Burn's `Linear::forward`, to the bit, without the copy of every product's output that
    // Burn's `flex` matmul makes (`memzoo_fused::linear`).
    let bias = linear.bias.as_ref().map(|b| b.val());
    let y = memzoo_fused::linear(x.reshape([b * l, d]), linear.weight.val(), bias);
    let d_out = y.dims()[1];
    y.reshape([b, l, d_out])
}
