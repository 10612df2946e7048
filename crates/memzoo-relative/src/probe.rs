//! Where a layer's attention goes, made visible (`memzoo inspect`): the probabilities of every
//! query over the XL memory, the segment and (kNN layers) the retrieved pairs.
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
use burn::tensor::activation::{sigmoid, softmax};
use memzoo_memory::Retrieved;

use crate::attention::{RelativeMultiHeadAttention, XlBiases};
use crate::error::RelativeError;
use crate::knn::{KnnAttention, KnnMixing, MASKED, l2_normalize};
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
    /// The pairs themselves, as the search returned them (keys bit-exact copies of the
    /// stored ones: the caller can find which stored position each one is).
    pub found: Retrieved,
}

/// The masses of probabilities `[batch, heads, qlen, mlen + qlen]` on the first `mlen` keys
/// and on the rest, each scaled by `scale` (`[batch, heads, qlen]`; `None`: 1).
fn split_mass(probs: Tensor<4>, mlen: usize, scale: Option<Tensor<3>>) -> (Tensor<3>, Tensor<3>) {
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

impl KnnAttention {
    /// Where the segment's queries attend, given the pairs `found` that the layer's forward
    /// pass retrieved for them (see the module docs): the local probabilities
    /// `softmax(mask(τ q̂·k̂ + β))` over `cat(memory, x)` and the retrieved ones
    /// `softmax(τ q̂·k̂_m)`, mixed as the layer mixes them ([`KnnMixing`]).
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
    pub fn probe(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        found: &Retrieved,
    ) -> Result<AttentionProbe, RelativeError> {
        let [batch, qlen, _] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        let att = &self.attention;
        let (q, k, _) = att.project(x, memory, ctx)?;
        let q = l2_normalize(q); // [b, q, h, dh]
        let k = l2_normalize(k);
        let tau_h = self.log_scale.val().exp(); // [heads]
        // Local scores τ q̂·k̂ + β, as the layer computes them: [b, h, q, klen].
        let q_in = q.clone().swap_dims(1, 2)
            * tau_h
                .clone()
                .reshape([1, h, 1, 1])
                .mul_scalar((dh as f32).sqrt());
        let local = ctx.mask_scores(att.scores(q_in, k.swap_dims(1, 2), ctx, None)?);
        // Cosines q̂·k̂_m of the retrieved slots: [b, q, h, k].
        let kk = found.keys.dims()[3];
        let n = batch * qlen * h;
        let cosine = q
            .reshape([n, 1, dh])
            .matmul(found.keys.clone().reshape([n, kk, dh]).swap_dims(1, 2))
            .reshape([batch, qlen, h, kk]);
        let filled = found.mask.clone().bool_not().float(); // [b, q, h, k]
        let remote =
            (cosine.clone() * tau_h.reshape([1, 1, h, 1])).mask_fill(found.mask.clone(), MASKED);
        let (memory, segment, mass, weights) = match self.mixing {
            KnnMixing::Gate => {
                // g per (b, q, h), 0 where the query found nothing.
                let found_any = filled.clone().max_dim(3); // [b, q, h, 1]
                let g = sigmoid(self.gate.val()).reshape([1, 1, h, 1]) * found_any;
                let weights = softmax(remote, 3) * filled * g.clone();
                let g = g.reshape([batch, qlen, h]).swap_dims(1, 2); // [b, h, q]
                let (memory, segment) = split_mass(
                    softmax(local, 3),
                    ctx.mlen,
                    Some(g.clone().neg().add_scalar(1.0)),
                );
                (memory, segment, g, weights)
            }
            KnnMixing::Joint => {
                let remote = remote.swap_dims(1, 2); // [b, h, q, k]
                let probs = softmax(Tensor::cat(vec![remote, local], 3), 3);
                let weights = probs.clone().narrow(3, 0, kk).swap_dims(1, 2) * filled;
                let klen = probs.dims()[3] - kk;
                let (memory, segment) = split_mass(probs.narrow(3, kk, klen), ctx.mlen, None);
                let mass = weights
                    .clone()
                    .sum_dim(3)
                    .reshape([batch, qlen, h])
                    .swap_dims(1, 2);
                (memory, segment, mass, weights)
            }
        };
        Ok(AttentionProbe {
            memory,
            segment,
            retrieved: Some(RetrievedProbe {
                mass,
                weights,
                scores: cosine,
                found: found.clone(),
            }),
        })
    }
}
