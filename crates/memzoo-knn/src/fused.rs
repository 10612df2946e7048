//! Where the kNN layer's read of its retrieved pairs runs as one fused CPU kernel
//! ([`memzoo_fused::knn_attention_fused`]) and where as tensor ops: fused on `flex` with no
//! dropout on the probabilities (as relative attention, `memzoo_relative::fused`), its
//! tensor-op path [`memory_read_tensor_ops`](KnnAttention::memory_read_tensor_ops) everywhere
//! else.

use burn::tensor::{DType, Tensor};
use memzoo_fused::knn_attention_fused;
use memzoo_fused::softmax::softmax;
use memzoo_memory::Retrieved;

use crate::attention::{KnnAttention, MASKED};
use crate::error::KnnError;

impl KnnAttention {
    /// Whether the attention over the retrieved pairs can run as the fused kernel: on `flex`,
    /// f32, no dropout on the probabilities (none configured, or no autodiff). It does when
    /// [`fused_memory`](Self::fused_memory) is also set.
    pub fn fused_memory_applies(&self, q: &Tensor<4>) -> bool {
        let device = q.device();
        memzoo_fused::supports(&device)
            && q.dtype() == DType::F32
            && (self.attention.dropatt.prob == 0.0 || !device.is_autodiff())
    }

    /// The read of the retrieved pairs, `V_m = Dropatt(softmax_m(τ q̂·k̂_m)) v_m` over the filled
    /// slots (Wu et al. 2022, sec. 3.1): the fused kernel where it applies, else tensor ops. A
    /// query whose slots are all empty reads 0 (fused) or the mean of its slots (tensor ops);
    /// the gate gives it no weight either way.
    ///
    /// # Shapes
    /// - `q`: `[batch, qlen, heads, d_head]` (`q̂`), `tau`: `[heads]`
    /// - output: `[batch, qlen, heads, d_head]`
    pub fn memory_read(
        &self,
        q: Tensor<4>,
        tau: Tensor<1>,
        found: &Retrieved,
    ) -> Result<Tensor<4>, KnnError> {
        if self.fused_memory && self.fused_memory_applies(&q) {
            return knn_attention_fused(
                q,
                tau,
                found.keys.clone(),
                found.values.clone(),
                found.mask.clone(),
                false,
            )
            .map_err(|e| KnnError::Input(e.to_string()));
        }
        Ok(self.memory_read_tensor_ops(q, tau, found))
    }

    /// [`memory_read`](Self::memory_read) as tensor ops (every backend), in the store's
    /// `[batch, qlen, heads, k, dh]` layout (no permutes of the retrieved pairs): one small
    /// product per (row, query, head), batched.
    ///
    /// # Shapes
    /// As [`memory_read`](Self::memory_read).
    pub fn memory_read_tensor_ops(
        &self,
        q: Tensor<4>,
        tau: Tensor<1>,
        found: &Retrieved,
    ) -> Tensor<4> {
        let [batch, qlen, h, dh] = q.dims();
        let kk = found.keys.dims()[3];
        let n = batch * qlen * h;
        // τ q̂·k̂_m: [n, 1, dh] x [n, dh, k] -> [b, q, h, k]
        let mem_scores = q
            .reshape([n, 1, dh])
            .matmul(found.keys.clone().reshape([n, kk, dh]).swap_dims(1, 2))
            .reshape([batch, qlen, h, kk])
            * tau.reshape([1, 1, h, 1]);
        let mem_scores = mem_scores.mask_fill(found.mask.clone(), MASKED);
        let mem_probs = self.attention.drop_probs(softmax(mem_scores, 3));
        // A_m V_mem: [n, 1, k] x [n, k, dh] -> [b, q, h, dh]
        mem_probs
            .reshape([n, 1, kk])
            .matmul(found.values.clone().reshape([n, kk, dh]))
            .reshape([batch, qlen, h, dh])
    }

    /// The joint mixing's context with the retrieved part fused: one softmax over
    /// `[s_r ++ s_l]` is the two parts' own softmaxes weighted by `w_r = exp(lse_r - lse)`,
    /// `w_l = exp(lse_l - lse)`, `lse = log(exp(lse_r) + exp(lse_l))`, so
    /// `Σ_m A_im v_m + Σ_j A_ij v_j = w_r V_m + w_l softmax(s_l) V` (a query that found
    /// nothing has `w_r = 0`). Runs where [`fused_memory_applies`](Self::fused_memory_applies)
    /// (no dropout on the probabilities).
    ///
    /// # Shapes
    /// - `q`: `[batch, qlen, heads, d_head]` (`q̂`), `tau`: `[heads]`
    /// - `local`: masked local scores `[batch, heads, qlen, klen]`, `v`: `[batch, heads, klen, d_head]`
    /// - output: `[batch, qlen, heads, d_head]`
    pub(crate) fn joint_mix(
        &self,
        q: Tensor<4>,
        tau: Tensor<1>,
        found: &Retrieved,
        local: Tensor<4>,
        v: Tensor<4>,
    ) -> Result<Tensor<4>, KnnError> {
        let dh = q.dims()[3];
        let read = knn_attention_fused(
            q,
            tau,
            found.keys.clone(),
            found.values.clone(),
            found.mask.clone(),
            true,
        )
        .map_err(|e| KnnError::Input(e.to_string()))?;
        let remote = read.clone().narrow(3, 0, dh); // [b, q, h, dh]
        let lse_r = read.narrow(3, dh, 1); // [b, q, h, 1]
        // log Σ_j exp(s_l) per query; the shift is a constant (it cancels).
        let shift = local.clone().max_dim(3).detach();
        let lse_l = (local.clone() - shift.clone()).exp().sum_dim(3).log() + shift;
        let lse_l = lse_l.swap_dims(1, 2); // [b, q, h, 1]
        let from_local = softmax(local, 3).matmul(v).swap_dims(1, 2); // [b, q, h, dh]
        let top = lse_r.clone().max_pair(lse_l.clone()).detach();
        let lse =
            ((lse_r.clone() - top.clone()).exp() + (lse_l.clone() - top.clone()).exp()).log() + top;
        let w_r = (lse_r - lse.clone()).exp();
        let w_l = (lse_l - lse).exp();
        Ok(remote * w_r + from_local * w_l)
    }
}
