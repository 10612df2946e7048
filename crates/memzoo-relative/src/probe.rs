//! Where a layer's attention goes, made visible (`memzoo inspect`): the probabilities of every
//! query over the XL memory, the segment and (kNN layers, probed by `memzoo_knn`'s
//! `KnnAttention::probe`) the retrieved pairs.
//!
//! The fused kernels never materialise the probabilities, so a probe computes them a second
//! time as plain tensor ops from the layer's own [`scores`](RelativeMultiHeadAttention::scores)
//! (and, for a kNN layer, from the pairs its forward pass retrieved). Only a pass that asks for
//! it (the stack's traced pass, `memzoo_stack::Trace`) runs a probe; every other pass is
//! untouched. Probes run without dropout (evaluation).
//!
//! With `P` a query's probabilities over `cat(memory, segment)` (`mlen + qlen` keys):
//! - relative layers: memory mass `Σ_{j<mlen} P_j`, segment mass `Σ_{j≥mlen} P_j`;
//! - kNN layers, gate mixing (Wu et al. 2022, sec. 3.2): the output mixes `g V_m + (1-g) V_c`,
//!   so the retrieved pairs carry `g` (0 for a query that found nothing) and slot `m` carries
//!   `g A_m`, `A_m = softmax_m(τ q̂·k̂_m)`; the local part `(1-g) P` is split as above;
//! - kNN layers, joint mixing: one softmax over `[retrieved ++ memory ++ segment]`, summed
//!   per part.
//!
//! Each query's three masses sum to 1.

use burn::tensor::Tensor;
use burn::tensor::activation::softmax;

use crate::attention::{RelativeMultiHeadAttention, XlBiases};
use crate::error::RelativeError;
use crate::positions::RelativeContext;

/// What one attention layer's probabilities put where, per query and head.
///
/// # Shapes
/// - `memory`, `segment`, `knn`: `[batch, heads, qlen]`
#[derive(Debug, Clone)]
pub struct AttentionProbe {
    /// Mass on the XL memory's keys (the first `mlen` of `cat(memory, segment)`).
    pub memory: Tensor<3>,
    /// Mass on the segment's keys.
    pub segment: Tensor<3>,
    /// kNN layers: the retrieved pairs, their mass and weights; `None` for other layers.
    pub retrieved: Option<RetrievedProbe>,
}

/// The retrieved pairs of a kNN layer's queries as its attention weighs them.
///
/// # Shapes
/// - `mass`: `[batch, heads, qlen]`
/// - `weights`, `scores`: `[batch, qlen, heads, k]` (the store's layout, best match first)
#[derive(Debug, Clone)]
pub struct RetrievedProbe {
    /// Mass on all retrieved pairs of a query.
    pub mass: Tensor<3>,
    /// Weight of each retrieved slot in the layer's output mix (0 on empty slots).
    pub weights: Tensor<4>,
    /// Cosine similarity `q̂·k̂_m` of each slot (what the search ranks by).
    pub scores: Tensor<4>,
    /// The retrieved keys `[batch, qlen, kv heads, k, d_head]`, as the search returned them
    /// (bit-exact copies of the stored ones: the caller can find which stored position each
    /// one is).
    pub keys: Tensor<5>,
}

/// The masses of probabilities `[batch, heads, qlen, mlen + qlen]` on the first `mlen` keys
/// and on the rest, each scaled by `scale` (`[batch, heads, qlen]`; `None`: 1).
pub fn split_mass(
    probs: Tensor<4>,
    mlen: usize,
    scale: Option<Tensor<3>>,
) -> (Tensor<3>, Tensor<3>) {
    let [b, h, q, klen] = probs.dims();
    let memory = match mlen {
        0 => Tensor::zeros([b, h, q], &probs.device()),
        _ => probs
            .clone()
            .narrow(3, 0, mlen)
            .sum_dim(3)
            .reshape([b, h, q]),
    };
    let segment = probs
        .narrow(3, mlen, klen - mlen)
        .sum_dim(3)
        .reshape([b, h, q]);
    match scale {
        Some(s) => (memory * s.clone(), segment * s),
        None => (memory, segment),
    }
}

impl RelativeMultiHeadAttention {
    /// The attention probabilities of the segment `x` over `cat(memory, x)`, as tensor ops:
    /// `softmax(mask(scores))` (see the type docs for the scores), no dropout.
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
    /// - output: `[batch, heads, qlen, mlen + qlen]`
    pub fn probabilities(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        let (q, k, _) = self.project(x, memory, ctx)?;
        let scores = self.scores(q.swap_dims(1, 2), k.swap_dims(1, 2), ctx, shared)?;
        Ok(softmax(ctx.mask_scores(scores), 3))
    }

    /// Where the segment's queries attend: memory and segment masses of
    /// [`probabilities`](Self::probabilities) (see the module docs).
    ///
    /// # Shapes
    /// As [`probabilities`](Self::probabilities); the masses `[batch, heads, qlen]`.
    pub fn probe(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<AttentionProbe, RelativeError> {
        let probs = self.probabilities(x, memory, ctx, shared)?;
        let (memory, segment) = split_mass(probs, ctx.mlen, None);
        Ok(AttentionProbe {
            memory,
            segment,
            retrieved: None,
        })
    }
}
