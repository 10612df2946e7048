//! A softmax whose backward keeps its output alone: `dS = P ⊙ (dP - Σ_j P_j dP_j)`.
//!
//! Burn 0.22.1's softmax is the backend's default composition,
//! `exp(x - max) / Σ exp(x - max)`, which autodiff records op by op: `exp` keeps its output for
//! its backward and the division keeps its operands, so an attention layer holds both the
//! exponentials and the probabilities, two `[batch, heads, qlen, klen]` tensors, until the
//! backward (PyTorch's softmax keeps its output alone). On a GPU, where the attention runs as
//! tensor ops, that is one score-sized tensor per layer more than the peer holds
//! (`docs/backends.md`, "On a GPU"). This op computes the same softmax (the backend's own) and
//! records one backward that keeps `P`.
//!
//! It runs on `flex` and, with this crate's `cube` feature (turned on by the top crates' `wgpu`,
//! `wgpu-plain` and `cuda` features), on CubeCL's backend (wgpu, CUDA; with fusion where Burn
//! fuses); [`softmax`] falls back to Burn's on every other device (LibTorch keeps its own
//! softmax, whose backward already keeps only the output).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{Device, Tensor};

/// The softmax that keeps its output alone for the backward, as a backend extension.
#[backend_extension(Flex, Cube: cfg(feature = "cube"), Autodiff)]
pub trait SoftmaxBackend: Backend {
    /// `softmax(x)` along `dim`: the backend's own.
    fn softmax_keeping_output(x: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        Self::softmax(x, dim)
    }
}

impl SoftmaxBackend for Flex {}

#[cfg(feature = "cube")]
impl SoftmaxBackend for burn::backend::Cube {}

impl<B: SoftmaxBackend, C: CheckpointStrategy> SoftmaxBackend for Autodiff<B, C> {
    fn softmax_keeping_output(x: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let nodes = [x.node()];
        let x = x.into_primitive();
        let op = SoftmaxBackward { dim };
        match op.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let p = B::softmax_keeping_output(x, dim);
                prep.finish(p.clone(), p)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::softmax_keeping_output(x, dim)),
        }
    }
}

/// The softmax's backward from its output `P`: `dS = P ⊙ (dP - Σ_j P_j dP_j)` along `dim`.
#[derive(Debug)]
struct SoftmaxBackward {
    dim: usize,
}

impl<B: Backend> Backward<B, 1> for SoftmaxBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<FloatTensor<B>, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dp = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let p = ops.state;
            // Σ_j P_j dP_j, kept as a dim of 1 and broadcast back.
            let dot = B::float_sum_dim(B::float_mul(p.clone(), dp.clone()), self.dim);
            let ds = B::float_mul(p, B::float_sub(dp, dot));
            grads.register::<B>(node.id, ds);
        }
    }
}

/// Whether [`softmax`] runs the op on `device`: `flex`, and CubeCL's backend where this crate
/// was built with it.
pub fn keeps_output_only(device: &Device) -> bool {
    if crate::supports(device) {
        return true;
    }
    #[cfg(feature = "cube")]
    {
        use burn::backend::DispatchDevice;
        matches!(
            device.as_dispatch().clone().inner(),
            DispatchDevice::Cube(_)
        )
    }
    #[cfg(not(feature = "cube"))]
    false
}

/// `softmax(x)` along `dim`, the same values as [`burn::tensor::activation::softmax`]; on an
/// autodiff device its backward keeps only the output (see the module docs), where
/// [`keeps_output_only`] says so, and is Burn's elsewhere.
///
/// # Shapes
/// - `x`: any → the same
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    if keeps_output_only(&x.device()) {
        Tensor::from_dispatch(<Dispatch as SoftmaxBackend>::softmax_keeping_output(
            x.into_dispatch(),
            dim,
        ))
    } else {
        burn::tensor::activation::softmax(x, dim)
    }
}
