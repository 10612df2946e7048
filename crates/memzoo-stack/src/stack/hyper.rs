//! [`HyperConnection`]: hyper-connections (Zhu et al. 2024, arXiv 2409.19606, Algorithm 2),
//! `s` residual streams around each branch instead of one (`XlConfig::residual_streams`).
//!
//! The stream is `s` copies of the embedding, `H = [h_1 .. h_s]` (`[batch, len, s d]`, stream
//! `i` at columns `i d .. (i + 1) d`); the head reads their sum. Around a branch `f` (the
//! attention, the feed-forward), with `H̄ = normalize(H) sqrt(d) (γ + 1)` per stream (the
//! hyper-connections package's RMSNorm):
//!
//! - width: `A = tanh(H̄ W_α) a + A_0` (`[s, 1 + s]` per position: `A_0` learned,
//!   `W_α`: `d -> 1 + s`, `a` a learned scale), `[x ; H'] = Aᵀ H` (`x` the branch's input,
//!   `H'` the `s` mixed streams);
//! - depth: `B = tanh(H̄ w_β) b + B_0` (one weight per stream), `H ← B f(x) + H'`.
//!
//! recurrent-memory-transformer-pytorch uses 4 streams by default (`num_residual_streams`); one
//! stream is the plain residual `h + f(h)` (the package then has no such parameters, and
//! memzoo no `HyperConnection`).

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::activation::tanh;
use burn::tensor::{Device, Tensor, TensorData};

/// One branch's hyper-connection over `s` streams of width `d`.
///
/// # Shapes
/// - `gamma`: `[d]`; `static_alpha`: `[s, 1 + s]`; `dynamic_alpha`: `[d, 1 + s]`;
///   `static_beta`: `[s]`; `dynamic_beta`: `[d]`; the two scales `[1]`
#[derive(Module, Debug)]
pub struct HyperConnection {
    /// `γ` of the streams' RMSNorm, `normalize(h) sqrt(d) (γ + 1)`.
    pub gamma: Param<Tensor<1>>,
    /// `A_0`: column 0 weighs the streams into the branch's input, columns `1..` mix them.
    pub static_alpha: Param<Tensor<2>>,
    /// `W_α`, the input-dependent part of `A`.
    pub dynamic_alpha: Param<Tensor<2>>,
    /// `a`, its scale.
    pub dynamic_alpha_scale: Param<Tensor<1>>,
    /// `B_0`: the branch output's weight in each stream.
    pub static_beta: Param<Tensor<1>>,
    /// `w_β`, the input-dependent part of `B`.
    pub dynamic_beta: Param<Tensor<1>>,
    /// `b`, its scale.
    pub dynamic_beta_scale: Param<Tensor<1>>,
    /// Streams `s`.
    #[module(skip)]
    pub streams: usize,
}

/// What the width connection leaves for the depth connection: the mixed streams `H'`
/// (`[batch, len, s, d]`) and `B` (`[batch, len, s, 1]`).
pub struct HyperState {
    rest: Tensor<4>,
    beta: Tensor<4>,
}

impl HyperConnection {
    /// The package's initialisation: the branch reads stream `index` (`A_0`'s column 0), the
    /// streams pass through (`A_0`'s identity), every branch output is added to every stream
    /// (`B_0 = 1`), the dynamic parts zero with scales 0.01, `γ = 0`.
    pub fn new(streams: usize, width: usize, index: usize, device: &Device) -> Self {
        let s = streams;
        let mut alpha = vec![0.0f32; s * (1 + s)];
        for i in 0..s {
            alpha[i * (1 + s) + 1 + i] = 1.0;
        }
        alpha[(index % s) * (1 + s)] = 1.0;
        let scale = || {
            Param::from_tensor(Tensor::from_data(
                TensorData::new(vec![0.01f32], [1]),
                device,
            ))
        };
        HyperConnection {
            gamma: Initializer::Zeros.init([width], device),
            static_alpha: Param::from_tensor(Tensor::from_data(
                TensorData::new(alpha, [s, 1 + s]),
                device,
            )),
            dynamic_alpha: Initializer::Zeros.init([width, 1 + s], device),
            dynamic_alpha_scale: scale(),
            static_beta: Initializer::Ones.init([s], device),
            dynamic_beta: Initializer::Zeros.init([width], device),
            dynamic_beta_scale: scale(),
            streams,
        }
    }

    /// The width connection: the branch's input `x` and what the depth connection needs.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, s d]` → `x`: `[batch, len, d]`
    pub fn width(&self, h: Tensor<3>) -> (Tensor<3>, HyperState) {
        let [b, len, sd] = h.dims();
        let s = self.streams;
        let d = sd / s;
        let streams = h.reshape([b, len, s, d]);
        // H̄ = normalize(H) sqrt(d) (γ + 1), per stream (F.normalize: ‖h‖ at least 1e-12).
        let norm = streams
            .clone()
            .powi_scalar(2)
            .sum_dim(3)
            .sqrt()
            .clamp_min(1e-12);
        let gain = self.gamma.val().add_scalar(1.0).reshape([1, 1, 1, d]);
        let normed = (streams.clone() / norm).mul_scalar((d as f64).sqrt()) * gain;
        // A = tanh(H̄ W_α) a + A_0: [b, len, s, 1 + s]
        let rows = normed.clone().reshape([b * len * s, d]);
        let dynamic = tanh(rows.clone().matmul(self.dynamic_alpha.val()))
            * self.dynamic_alpha_scale.val().unsqueeze::<2>();
        let alpha = dynamic.reshape([b, len, s, 1 + s]) + self.static_alpha.val().unsqueeze::<4>();
        // B = tanh(H̄ w_β) b + B_0: [b, len, s, 1]
        let dynamic = tanh(rows.matmul(self.dynamic_beta.val().unsqueeze_dim::<2>(1)))
            * self.dynamic_beta_scale.val().unsqueeze::<2>();
        let beta = dynamic.reshape([b, len, s, 1]) + self.static_beta.val().reshape([1, 1, s, 1]);
        // [x ; H'] = Aᵀ H: [b, len, 1 + s, d]
        let mixed = alpha.swap_dims(2, 3).matmul(streams);
        let x = mixed.clone().narrow(2, 0, 1).reshape([b, len, d]);
        let rest = mixed.narrow(2, 1, s);
        (x, HyperState { rest, beta })
    }

    /// The depth connection: `B f(x) + H'`.
    ///
    /// # Shapes
    /// - `out`: `[batch, len, d]` → `[batch, len, s d]`
    pub fn depth(&self, out: Tensor<3>, state: HyperState) -> Tensor<3> {
        let [b, len, d] = out.dims();
        let s = self.streams;
        let added = out.unsqueeze_dim::<4>(2) * state.beta + state.rest;
        added.reshape([b, len, s * d])
    }
}

/// `s` copies of `h` as the streams.
///
/// # Shapes
/// - `h`: `[batch, len, d]` → `[batch, len, s d]`
pub fn expand_streams(h: Tensor<3>, streams: usize) -> Tensor<3> {
    if streams == 1 {
        return h;
    }
    let [b, len, d] = h.dims();
    h.unsqueeze_dim::<4>(2)
        .expand([b, len, streams, d])
        .reshape([b, len, streams * d])
}

/// The sum of the streams.
///
/// # Shapes
/// - `h`: `[batch, len, s d]` → `[batch, len, d]`
pub fn reduce_streams(h: Tensor<3>, streams: usize) -> Tensor<3> {
    if streams == 1 {
        return h;
    }
    let [b, len, sd] = h.dims();
    h.reshape([b, len, streams, sd / streams])
        .sum_dim(2)
        .reshape([b, len, sd / streams])
}
