//! Where attention runs as one fused CPU kernel ([`memzoo_fused::relative_attention_fused`]) and
//! where as tensor ops.
//!
//! On the `flex` backend, with no dropout on the probabilities, Transformer-XL's and T5's
//! schemes (and the learned one without its biases, `learned_biases = false`, which is XL's
//! shifted form), and absolute and rotary positions (no position term: the content scores of
//! [`content_operands`](RelativeMultiHeadAttention::content_operands), with a null key where
//! positions are absolute and there is no qk-RMSNorm) run scores, relative shift, mask,
//! softmax and `P V` (forward and backward) as one multi-threaded op. Everywhere else (other
//! backends, the learned scheme with its biases, `dropatt > 0` in training) the tensor-op
//! path [`attend_tensor_ops`](RelativeMultiHeadAttention::attend_tensor_ops) runs, which is
//! also the reference the kernel is tested against (`tests/fused_relative.rs`).
//!
//! The kNN layer (`memzoo_knn::KnnAttention`) reads its retrieved pairs with a fused kernel on
//! the same terms.

use burn::module::Param;
use burn::tensor::{DType, Int, Tensor};
use memzoo_fused::softmax::softmax;
use memzoo_fused::{RelParams, RelativePosition, relative_attention_fused};

use crate::attention::{PositionParams, RelativeMultiHeadAttention, XlBiases};
use crate::error::RelativeError;
use crate::positions::{PositionIndex, RelativeContext};

impl RelativeMultiHeadAttention {
    /// `Dropatt(softmax(mask(scores))) V` per head (see the type docs for the scores): the
    /// fused kernel where it applies (see the module docs), else tensor ops.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, qlen, d_head]`; `k`, `v`: `[batch, heads, klen, d_head]`
    /// - output: `[batch, heads, qlen, d_head]`
    pub fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        if self.fused_applies(&q, ctx) {
            return match self.scheme {
                PositionParams::Absolute(_) | PositionParams::Rotary(_) => {
                    self.attend_content_fused(q, k, v, ctx)
                }
                _ => self.attend_fused(q, k, v, ctx, shared),
            };
        }
        self.attend_tensor_ops(q, k, v, ctx, shared)
    }

    /// [`attend`](Self::attend) as tensor ops (every backend and scheme).
    ///
    /// # Shapes
    /// As [`attend`](Self::attend).
    pub fn attend_tensor_ops(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        let scores = self.scores(q, k, ctx, shared)?;
        Ok(self
            .drop_probs(softmax(ctx.mask_scores(scores), 3))
            .matmul(v))
    }

    /// Whether [`attend`](Self::attend) runs the fused kernel: on `flex`, f32, XL or T5
    /// positions (or learned ones without their biases), and no dropout on the probabilities
    /// (none configured, or no autodiff).
    pub fn fused_applies(&self, q: &Tensor<4>, ctx: &RelativeContext) -> bool {
        let device = q.device();
        let scheme = match (&self.scheme, &ctx.index) {
            (PositionParams::Xl(_), PositionIndex::Xl(_) | PositionIndex::XlRows { .. })
            | (PositionParams::T5(_), PositionIndex::T5(_)) => true,
            // The learned scheme without its biases is XL's shifted form (below).
            (PositionParams::Learned(_), PositionIndex::Learned(_)) => {
                !self.positions.learned_biases
            }
            // No position term: the content scores alone.
            (PositionParams::Absolute(_), PositionIndex::Absolute)
            | (PositionParams::Rotary(_), PositionIndex::Rotary) => true,
            _ => false,
        };
        memzoo_fused::supports(&device)
            && q.dtype() == DType::F32
            && scheme
            && (self.dropatt.prob == 0.0 || !device.is_autodiff())
    }

    /// [`attend`](Self::attend) by the fused kernel (XL or T5 positions on `flex`; see
    /// [`fused_applies`](Self::fused_applies)). The kernel's scores are those of
    /// [`scores`](Self::scores): XL `(q + u)·k s + relative_shift((q + v)·W_R R s)`, T5
    /// `q·k s + β`.
    ///
    /// # Shapes
    /// As [`attend`](Self::attend).
    pub fn attend_fused(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        let [_, h, _, dh] = q.dims();
        let scale = 1.0 / (dh as f32).sqrt();
        let per_head = |p: &Param<Tensor<2>>| p.val().reshape([1, h, 1, dh]);
        let position = match (&self.scheme, &ctx.index) {
            (
                PositionParams::Xl(p),
                index @ (PositionIndex::Xl(_) | PositionIndex::XlRows { .. }),
            ) => {
                let biases = p.biases_or(shared)?;
                // W_R R: [W, h, dh] (projected, or read from the layer's table)
                let r = self.projected_positions(p, index)?;
                // (a) + (c) scored with s (q + u), (b) + (d) with s (q + v).
                let qp = (q.clone() + per_head(&biases.position)).mul_scalar(scale);
                let qc = (q + per_head(&biases.content)).mul_scalar(scale);
                (qc, RelativePosition::Shifted { qp, r })
            }
            (PositionParams::Learned(p), PositionIndex::Learned(idx))
                if !self.positions.learned_biases =>
            {
                // q·k s + relative_shift(q·E_d s): XL's shifted form, E_d read per column.
                let r = p.embedding.val().select(0, idx.clone()); // [W, h, dh]
                let q = q.mul_scalar(scale);
                (q.clone(), RelativePosition::Shifted { qp: q, r })
            }
            (PositionParams::T5(p), PositionIndex::T5(idx)) => {
                // β_{bucket(i + mlen - j)}, read per pair inside the kernel.
                let position = RelativePosition::Buckets {
                    table: self.t5_table(&p.bias, ctx)?,
                    bucket: idx.clone(),
                };
                (q.mul_scalar(scale), position)
            }
            _ => {
                return Err(RelativeError::Input(format!(
                    "the fused kernel takes XL, T5 or bias-free learned positions, not {:?} \
                     (context) / {:?} (layer)",
                    ctx.index.kind(),
                    self.positions.kind
                )));
            }
        };
        let (qc, position) = position;
        // The shapes come from this layer: a rejection names them as a bad input.
        relative_attention_fused(qc, k, v, position, ctx.mask.clone(), self.fused_params(ctx))
            .map_err(|e| RelativeError::Input(e.to_string()))
    }

    /// [`attend`](Self::attend) of absolute or rotary positions by the fused kernel, the
    /// scores `s q'·k'ᵀ` of [`content_operands`](Self::content_operands) and no position term.
    fn attend_content_fused(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        ctx: &RelativeContext,
    ) -> Result<Tensor<4>, RelativeError> {
        let (qc, k) = self.content_operands(q, k)?;
        relative_attention_fused(
            qc,
            k,
            v,
            RelativePosition::None,
            ctx.mask.clone(),
            self.fused_params(ctx),
        )
        .map_err(|e| RelativeError::Input(e.to_string()))
    }

    /// The fused kernel's settings for `ctx`: its mask value, and this layer's
    /// [`recompute_probabilities`](crate::RelativeAttentionConfig::recompute_probabilities).
    fn fused_params(&self, ctx: &RelativeContext) -> RelParams {
        RelParams::new(ctx.mask_value).with_recompute_probabilities(self.recompute_probabilities)
    }

    /// Whether [`attend_null`](Self::attend_null) runs the fused kernel: where
    /// [`attend`](Self::attend) does, with absolute positions and no qk-RMSNorm (the null key
    /// is scored by `s q·k_null`, the content score of a plain key).
    pub fn fused_null_applies(&self, q: &Tensor<4>, ctx: &RelativeContext) -> bool {
        matches!(self.scheme, PositionParams::Absolute(_))
            && self.qk_norm.is_none()
            && self.fused_applies(q, ctx)
    }

    /// [`attend_null`](Self::attend_null) by the fused kernel: the null key and value
    /// prepended to the keys and values as a column every query sees.
    ///
    /// # Shapes
    /// As [`attend_null`](Self::attend_null).
    pub(crate) fn attend_null_fused(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        null: Tensor<3>,
        ctx: &RelativeContext,
    ) -> Result<Tensor<4>, RelativeError> {
        let [b, h, qlen, dh] = q.dims();
        let column = |i: usize| {
            null.clone()
                .narrow(0, i, 1)
                .reshape([1, h, 1, dh])
                .expand([b, h, 1, dh])
        };
        let k = Tensor::cat(vec![column(0), k], 2);
        let v = Tensor::cat(vec![column(1), v], 2);
        let mask = ctx.mask.clone().map(|m| {
            // The null column, seen by every query (`false`: visible).
            let seen = Tensor::<3, Int>::zeros([m.dims()[0], qlen, 1], &m.device()).equal_elem(1);
            Tensor::cat(vec![seen, m], 2)
        });
        let (qc, k) = self.content_operands(q, k)?;
        let params = self.fused_params(ctx);
        relative_attention_fused(qc, k, v, RelativePosition::None, mask, params)
            .map_err(|e| RelativeError::Input(e.to_string()))
    }
}
