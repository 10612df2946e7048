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
//! - relative layers: memory mass `Σ_{j<mlen} P_j`, segment mass `Σ_{j≥mlen} P_j` (a
//!   Compressive Transformer's memory prefix `cat(cmem, mem)` splits further, [`KeySplit`]);
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
/// - `compressed`, `memory`, `segment`: `[batch, heads, qlen]`
#[derive(Debug, Clone)]
pub struct AttentionProbe {
    /// Mass on the compressed memory's keys (a Compressive Transformer's, leading the memory
    /// prefix); `None` where the layer reads none.
    pub compressed: Option<Tensor<3>>,
    /// Mass on the memory's keys: the XL memory (the keys of `cat(memory, segment)` before the
    /// segment, after any compressed ones), or an RMT stack's memory tokens.
    pub memory: Tensor<3>,
    /// Mass on the segment's keys.
    pub segment: Tensor<3>,
    /// kNN layers: the retrieved pairs, their mass and weights; `None` for other layers.
    pub retrieved: Option<RetrievedProbe>,
}

impl AttentionProbe {
    /// The probe of the queries `start..start + len` alone (an RMT stack's segment tokens,
    /// between its read and write memory tokens).
    pub fn queries(self, start: usize, len: usize) -> Self {
        let rows = |t: Tensor<3>| t.narrow(2, start, len);
        Self {
            compressed: self.compressed.map(rows),
            memory: rows(self.memory),
            segment: rows(self.segment),
            retrieved: self.retrieved.map(|r| RetrievedProbe {
                mass: rows(r.mass),
                weights: r.weights.narrow(1, start, len),
                scores: r.scores.narrow(1, start, len),
                keys: r.keys.narrow(1, start, len),
            }),
        }
    }
}

/// Where a probe divides the keys of `cat(memory, segment)`: the first `compressed` are a
/// compressed memory, the next `memory` the memory, the rest the segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeySplit {
    /// Keys of the compressed memory (0: none).
    pub compressed: usize,
    /// Keys of the memory after them.
    pub memory: usize,
}

impl KeySplit {
    /// `mlen` memory keys and no compressed ones: the layer's own context.
    pub fn memory(mlen: usize) -> Self {
        Self {
            compressed: 0,
            memory: mlen,
        }
    }
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

/// The masses of probabilities `[batch, heads, qlen, klen]` on the compressed memory, the
/// memory and the segment as `split` divides the keys, each scaled by `scale`
/// (`[batch, heads, qlen]`; `None`: 1). The compressed mass is `None` where `split` has none.
pub fn split_mass(
    probs: Tensor<4>,
    split: KeySplit,
    scale: Option<Tensor<3>>,
) -> (Option<Tensor<3>>, Tensor<3>, Tensor<3>) {
    let [b, h, q, klen] = probs.dims();
    let mass = |start: usize, len: usize| match len {
        0 => Tensor::zeros([b, h, q], &probs.device()),
        _ => probs
            .clone()
            .narrow(3, start, len)
            .sum_dim(3)
            .reshape([b, h, q]),
    };
    let (c, m) = (split.compressed, split.memory);
    let scaled = |t: Tensor<3>| match &scale {
        Some(s) => t * s.clone(),
        None => t,
    };
    let compressed = (c > 0).then(|| scaled(mass(0, c)));
    let memory = scaled(mass(c, m));
    let segment = scaled(mass(c + m, klen - c - m));
    (compressed, memory, segment)
}

impl RelativeMultiHeadAttention {
    /// The attention probabilities of the segment `x` over `cat(memory, x)`, as tensor ops:
    /// `softmax(mask(scores))` (see the type docs for the scores), no dropout; with a null
    /// key/value, the probabilities of the real keys (the rest is on the null key).
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
        let q = q.swap_dims(1, 2);
        let scores = ctx.mask_scores(self.scores(q.clone(), k.swap_dims(1, 2), ctx, shared)?);
        match self.peer.as_ref().and_then(|p| p.null_kv.as_ref()) {
            Some(null) => {
                let klen = scores.dims()[3];
                let all = Tensor::cat(vec![Self::null_scores(q, null.val()), scores], 3);
                Ok(softmax(all, 3).narrow(3, 1, klen))
            }
            None => Ok(softmax(scores, 3)),
        }
    }

    /// Where the segment's queries attend: the masses of
    /// [`probabilities`](Self::probabilities) on the parts `split` divides the keys into
    /// ([`KeySplit::memory`]`(ctx.mlen)`: the XL memory and the segment; see the module docs).
    ///
    /// # Shapes
    /// As [`probabilities`](Self::probabilities); the masses `[batch, heads, qlen]`.
    pub fn probe(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
        split: KeySplit,
    ) -> Result<AttentionProbe, RelativeError> {
        let probs = self.probabilities(x, memory, ctx, shared)?;
        let (compressed, memory, segment) = split_mass(probs, split, None);
        Ok(AttentionProbe {
            compressed,
            memory,
            segment,
            retrieved: None,
        })
    }
}
