//! The kNN layer's probe (`memzoo inspect`): where its queries' attention goes, over the XL
//! memory, the segment and the pairs its forward pass retrieved. The types and the relative
//! layers' probe are `memzoo_relative::probe`'s; see there for the masses and their sums.

use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, softmax};
use memzoo_memory::Retrieved;
use memzoo_relative::probe::split_mass;
use memzoo_relative::{AttentionProbe, KeySplit, RelativeContext, RetrievedProbe};

use crate::attention::{KnnAttention, KnnMixing, MASKED, l2_normalize};
use crate::error::KnnError;

impl KnnAttention {
    /// Where the segment's queries attend, given the pairs `found` that the layer's forward
    /// pass retrieved for them (see the module docs): the local probabilities
    /// `softmax(mask(τ q̂·k̂ + β))` over `cat(memory, x)` and the retrieved ones
    /// `softmax(τ q̂·k̂_m)`, mixed as the layer mixes them ([`KnnMixing`]); the local keys
    /// divided as `split` says ([`KeySplit::memory`]`(ctx.mlen)`: XL memory and segment).
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
    pub fn probe(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        found: &Retrieved,
        split: KeySplit,
    ) -> Result<AttentionProbe, KnnError> {
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
        let (compressed, memory, segment, mass, weights) = match self.mixing {
            KnnMixing::Gate => {
                // g per (b, q, h), 0 where the query found nothing.
                let found_any = filled.clone().max_dim(3); // [b, q, h, 1]
                let g = sigmoid(self.gate.val()).reshape([1, 1, h, 1]) * found_any;
                let weights = softmax(remote, 3) * filled * g.clone();
                let g = g.reshape([batch, qlen, h]).swap_dims(1, 2); // [b, h, q]
                let (compressed, memory, segment) = split_mass(
                    softmax(local, 3),
                    split,
                    Some(g.clone().neg().add_scalar(1.0)),
                );
                (compressed, memory, segment, g, weights)
            }
            KnnMixing::Joint => {
                let remote = remote.swap_dims(1, 2); // [b, h, q, k]
                let probs = softmax(Tensor::cat(vec![remote, local], 3), 3);
                let weights = probs.clone().narrow(3, 0, kk).swap_dims(1, 2) * filled;
                let klen = probs.dims()[3] - kk;
                let (compressed, memory, segment) =
                    split_mass(probs.narrow(3, kk, klen), split, None);
                let mass = weights
                    .clone()
                    .sum_dim(3)
                    .reshape([batch, qlen, h])
                    .swap_dims(1, 2);
                (compressed, memory, segment, mass, weights)
            }
        };
        Ok(AttentionProbe {
            compressed,
            memory,
            segment,
            retrieved: Some(RetrievedProbe {
                mass,
                weights,
                scores: cosine,
                keys: found.keys.clone(),
            }),
        })
    }
}
