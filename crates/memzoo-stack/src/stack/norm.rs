//! [`Norm`]: the stack's normalisation, LayerNorm or RMSNorm ([`NormKind`]).

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::module::layer_norm;
use burn::tensor::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// The normalisation of every residual block and of the final norm (`[model] norm`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// LayerNorm (Ba et al. 2016): `(x - mean(x)) / sqrt(var(x) + eps) γ + β`.
    #[default]
    Layer,
    /// RMSNorm (Zhang & Sennrich 2019): `x / sqrt(mean(x²) + eps) γ`, no bias (PyTorch's
    /// `nn.RMSNorm`, recurrent-memory-transformer-pytorch's blocks).
    Rms,
}

/// A LayerNorm or an RMSNorm over the last dimension. Its parameters are named as Burn's
/// `LayerNorm`'s (`gamma`, `beta`), so checkpoints of LayerNorm stacks load unchanged; an
/// RMSNorm has no `beta`.
///
/// # Shapes
/// - input: `[..., width]` → the same
#[derive(Module, Debug)]
pub struct Norm {
    /// The gain `γ`, `[width]`.
    pub gamma: Param<Tensor<1>>,
    /// The bias `β`, `[width]` (LayerNorm only).
    pub beta: Option<Param<Tensor<1>>>,
    /// `eps` added to the variance (LayerNorm) or to the mean square (RMSNorm).
    pub epsilon: f64,
    /// Which normalisation.
    #[module(skip)]
    pub kind: NormKind,
}

impl Norm {
    /// A norm of `width` with gain 1 (or drawn from `gain`) and bias 0.
    pub fn new(
        kind: NormKind,
        width: usize,
        epsilon: f64,
        gain: Initializer,
        device: &Device,
    ) -> Self {
        Norm {
            gamma: gain.init([width], device),
            beta: (kind == NormKind::Layer).then(|| Initializer::Zeros.init([width], device)),
            epsilon,
            kind,
        }
    }

    /// Normalises `x` over its last dimension (f16 in f32, as Burn's LayerNorm).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        let wide = dtype == DType::F16;
        let x = if wide { x.cast(DType::F32) } else { x };
        let cast = |t: Tensor<1>| if wide { t.cast(DType::F32) } else { t };
        let gamma = cast(self.gamma.val());
        let out = match self.kind {
            NormKind::Layer => layer_norm(
                x,
                gamma,
                self.beta.as_ref().map(|b| cast(b.val())),
                self.epsilon,
            ),
            NormKind::Rms => {
                // x / sqrt(mean(x²) + eps) γ
                let ms = x.clone().powi_scalar(2).mean_dim(D - 1);
                let inv = ms.add_scalar(self.epsilon).sqrt().recip();
                x * inv * gamma.unsqueeze::<D>()
            }
        };
        if wide { out.cast(dtype) } else { out }
    }
}
