//! Reversible residual coupling (RevNet; Kitaev et al. 2020, sec. 3) for any pair of residual
//! branches `F`, `G`, and the layer-by-layer backward that rebuilds activations instead of
//! storing them. The layer stack (`memzoo_stack`) runs its reversible layers with these.
//!
//! Forward: `y_1 = x_1 + F(x_2)`, `y_2 = x_2 + G(y_1)`. Inverse: `x_2 = y_2 - G(y_1)`,
//! `x_1 = y_1 - F(x_2)`.
//!
//! # Shapes
//! - every activation: `[batch, len, d_model]`

use std::ops::Range;

use burn::tensor::{Gradients, Tensor};

/// `(y_1, y_2) = (x_1 + F(x_2), x_2 + G(y_1))`; `f` also returns what the backward replays
/// (e.g. the LSH buckets it used), returned third.
pub fn couple<R, E>(
    x1: Tensor<3>,
    x2: Tensor<3>,
    f: impl FnOnce(Tensor<3>) -> Result<(Tensor<3>, R), E>,
    g: impl FnOnce(Tensor<3>) -> Tensor<3>,
) -> Result<(Tensor<3>, Tensor<3>, R), E> {
    let (fx, replay) = f(x2.clone())?;
    let y1 = x1 + fx;
    let y2 = x2 + g(y1.clone());
    Ok((y1, y2, replay))
}

/// The inverse of [`couple`]: `x_2 = y_2 - G(y_1)`, `x_1 = y_1 - F(x_2)`.
pub fn uncouple(
    y1: Tensor<3>,
    y2: Tensor<3>,
    f: impl FnOnce(Tensor<3>) -> Tensor<3>,
    g: impl FnOnce(Tensor<3>) -> Tensor<3>,
) -> (Tensor<3>, Tensor<3>) {
    let x2 = y2 - g(y1.clone());
    let x1 = y1 - f(x2.clone());
    (x1, x2)
}

/// One layer of the reversible backward pass.
///
/// From the outputs `(y_1, y_2)` and their gradients `(dy_1, dy_2)` (untracked tensors),
/// rebuilds the inputs and returns `(x_1, x_2, dx_1, dx_2)`, handing the gradients of every
/// partial backward to `collect` (which takes those of the parameters of `F` and `G`):
///
/// - `G` phase: `x_2 = y_2 - G(y_1)` and `dy_1 += (∂G/∂y_1)ᵀ dy_2`. `G` must be position-wise:
///   it is recomputed and differentiated `g_chunk` positions at a time (`0`: all at once), so
///   its inner activation never exists for the whole sequence. `g(x, range)` is `G` of the
///   positions `range` of `y_1`, given them as an autodiff leaf `x` (its dropout mask: that
///   slice of the forward's).
/// - `F` phase: `x_1 = y_1 - F(x_2)`, `dx_2 = dy_2 + (∂F/∂x_2)ᵀ dy_1`. `f` is `F` on an
///   autodiff leaf, replaying the forward pass exactly (its dropout masks, and the LSH buckets
///   or retrieved kNN pairs the forward used: re-hashing the rebuilt `x_2`, whose rounding
///   error can flip an argmax, would differentiate another sparsity pattern).
///
/// The parameters of `F` and `G` must live on an autodiff device.
#[allow(clippy::too_many_arguments)]
pub fn reverse<E>(
    y1: Tensor<3>,
    y2: Tensor<3>,
    dy1: Tensor<3>,
    dy2: Tensor<3>,
    g_chunk: usize,
    g: impl Fn(Tensor<3>, Range<usize>) -> Tensor<3>,
    f: impl FnOnce(Tensor<3>) -> Result<Tensor<3>, E>,
    collect: &mut impl FnMut(&mut Gradients),
) -> Result<(Tensor<3>, Tensor<3>, Tensor<3>, Tensor<3>), E> {
    let [b, l, _] = y1.dims();
    let chunk = if g_chunk == 0 { l } else { g_chunk.min(l) };
    // G phase: dG/dy1 and G(y1), chunk by chunk.
    let mut g_vals = Vec::new();
    let mut g_grads = Vec::new();
    for s in (0..l).step_by(chunk.max(1)) {
        let e = (s + chunk).min(l);
        let leaf = y1.clone().slice([0..b, s..e]).autodiff().require_grad();
        let out = g(leaf.clone(), s..e);
        let dy2_part = dy2.clone().slice([0..b, s..e]);
        let mut grads = (out.clone() * dy2_part).sum().backward();
        g_grads.push(leaf.grad(&grads).expect("leaf requires grad").inner());
        collect(&mut grads);
        g_vals.push(out.inner());
    }
    let x2 = y2 - Tensor::cat(g_vals, 1);
    let dy1_total = dy1 + Tensor::cat(g_grads, 1);
    // F phase.
    let leaf = x2.clone().autodiff().require_grad();
    let out = f(leaf.clone())?;
    let mut grads = (out.clone() * dy1_total.clone()).sum().backward();
    let dx2 = dy2 + leaf.grad(&grads).expect("leaf requires grad").inner();
    collect(&mut grads);
    let x1 = y1 - out.inner();
    Ok((x1, x2, dy1_total, dx2))
}
