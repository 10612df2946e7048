//! The Reformer's attention layer ([`ReformerAttention`]): projections, hash rotations and
//! the forward pass over [`crate::attention`]'s LSH and local attention.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::attention::*;
use crate::error::ReformerError;
use crate::rng::mix;

/// Which attention a Reformer layer uses (`"lsh"` or `"local"` in a config file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    /// Hashed (LSH) attention with shared QK.
    Lsh,
    /// Local attention inside position-ordered chunks.
    Local,
}

impl AttentionKind {
    /// Parses `"lsh"` or `"local"`.
    pub fn parse(s: &str) -> Result<Self, ReformerError> {
        match s {
            "lsh" => Ok(Self::Lsh),
            "local" => Ok(Self::Local),
            other => Err(ReformerError::Config(format!(
                "unknown attention layer type `{other}`: expected \"lsh\" or \"local\""
            ))),
        }
    }
}

/// Multi-head self-attention of the Reformer: LSH (shared QK) or local (chunked).
///
/// Sequences whose length is not a multiple of `chunk_len` are padded internally (the padding
/// is hidden as keys and cut from the output).
///
/// # Shapes
/// - `x`: `[batch, len, d_model]`
/// - `pad_mask`: `[batch, len]`, `true` = padding token (never attended to)
/// - output: `[batch, len, d_model]`
#[derive(Module, Debug)]
pub struct ReformerAttention {
    /// `W_q` (LSH: the shared `W_qk`), `d_model -> n_heads * d_head`.
    pub query: Linear,
    /// `W_k` (local attention only).
    pub key: Option<Linear>,
    /// `W_v`.
    pub value: Linear,
    /// Output projection.
    pub output: Linear,
    /// LSH or local.
    #[module(skip)]
    pub kind: AttentionKind,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
    /// Chunk length (bucket size).
    pub chunk_len: usize,
    /// Buckets per round (`None`: from the length).
    pub n_buckets: Option<usize>,
    /// Hash rounds.
    pub n_rounds: usize,
    /// Chunks looked at before.
    pub n_chunks_before: usize,
    /// Chunks looked at after.
    pub n_chunks_after: usize,
    /// Causal masking.
    pub causal: bool,
    /// De-duplicate pairs over hash rounds.
    pub dedup_rounds: bool,
    /// LSH score convention.
    #[module(skip)]
    pub lsh_scores: LshScores,
    /// LSH implementation.
    #[module(skip)]
    pub lsh_kernel: LshKernel,
    /// Dropout on attention probabilities.
    pub dropatt: f64,
    /// Factorised bucket count (empty: `n_buckets` as one factor).
    #[module(skip)]
    pub bucket_factors: Vec<usize>,
    /// Rotations drawn per head.
    pub rotations_per_head: bool,
    /// Epsilon of the key normalisation.
    pub key_eps: f64,
    /// Fixed rotations `[heads or 1, d_head, n_rounds, Σ factors / 2]` for passes outside
    /// training (see [`LshConfig::fixed_rotations`](crate::LshConfig::fixed_rotations)); never trained (read
    /// detached).
    pub rotations: Option<Param<Tensor<4>>>,
}

impl ReformerAttention {
    /// The fixed rotations (see [`LshConfig::fixed_rotations`](crate::LshConfig::fixed_rotations)), if the layer
    /// holds them.
    pub fn fixed_rotations(&self) -> Option<Tensor<4>> {
        self.rotations.as_ref().map(|r| r.val())
    }

    /// Replaces the fixed rotations, `[heads or 1, d_head, n_rounds, Σ factors / 2]` (a layer
    /// built with `fixed_rotations = true`); an error names a shape that does not fit.
    pub fn set_fixed_rotations(&mut self, rotations: Tensor<4>) -> Result<(), ReformerError> {
        let Some(old) = &self.rotations else {
            return Err(ReformerError::Config(
                "this layer holds no fixed rotations (build it with fixed_rotations = true)".into(),
            ));
        };
        if old.dims() != rotations.dims() {
            return Err(ReformerError::Config(format!(
                "rotations of shape {:?}, the layer needs {:?} ([heads or 1, d_head, n_rounds, \
                 buckets / 2])",
                rotations.dims(),
                old.dims()
            )));
        }
        self.rotations = Some(Param::from_tensor(rotations.detach()));
        Ok(())
    }

    /// Rotations for one pass: the fixed ones outside training (when held, and of `rounds`
    /// rounds), else drawn from `seed` (`[heads or 1, d_head, rounds, Σ factors / 2]`).
    fn rotations_for(
        &self,
        rounds: usize,
        n_buckets: usize,
        seed: u64,
        train: bool,
        device: &Device,
    ) -> Tensor<4> {
        if let Some(fixed) = &self.rotations
            && !train
            && fixed.dims()[2] == rounds
        {
            return fixed.val().detach();
        }
        let width = if self.bucket_factors.is_empty() {
            n_buckets
        } else {
            self.bucket_factors.iter().sum()
        };
        let heads = if self.rotations_per_head {
            self.n_heads
        } else {
            1
        };
        // One head: the numbers of `random_rotations(d_head, rounds, n_buckets, seed)`.
        let data = crate::rng::normal_vec(heads * self.d_head * rounds * (width / 2), seed);
        Tensor::from_data(
            TensorData::new(data, [heads, self.d_head, rounds, width / 2]),
            device,
        )
    }

    /// Buckets per round used for a padded length.
    pub fn buckets_for(&self, padded_len: usize) -> usize {
        if !self.bucket_factors.is_empty() {
            return self.bucket_factors.iter().product();
        }
        self.n_buckets.unwrap_or_else(|| {
            let n = padded_len.div_ceil(self.chunk_len).max(2);
            n + n % 2
        })
    }

    /// Self-attention of `x`. Rotations and dropout come from `opts` (see [`ForwardOptions`]).
    pub fn forward(
        &self,
        x: Tensor<3>,
        pad_mask: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
    ) -> Tensor<3> {
        self.forward_recorded(x, pad_mask, opts, None).0
    }

    /// [`forward`](Self::forward) that also returns the LSH bucket ids it used
    /// (`[batch, heads, n_rounds, padded len]`; `None` for local attention), and that uses
    /// `buckets` instead of hashing `x` when given (the ids of an earlier pass: the reversible
    /// backward replays the forward's sparsity pattern exactly).
    pub fn forward_recorded(
        &self,
        x: Tensor<3>,
        pad_mask: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
        buckets: Option<Tensor<4, Int>>,
    ) -> (Tensor<3>, Option<Tensor<4, Int>>) {
        let [b, l, _] = x.dims();
        let (out, used) = self.attend(x, pad_mask, opts, buckets, None);
        let out = out
            .swap_dims(1, 2)
            .reshape([b, l, self.n_heads * self.d_head]);
        (self.output.forward(out), used)
    }

    /// Where each position's attention goes (`memzoo inspect`): per head, its mass on the
    /// positions `bounds[i - 1]..bounds[i]` of `x` (`bounds[-1]` = 0), one tensor per bound.
    /// It is the layer's own attention (same chunks, rounds and, given the forward pass's
    /// `buckets`, the same hashes) with every value replaced by the indicators of those
    /// positions: `Σ_j P_ij 1[j ∈ part]`. No dropout.
    ///
    /// # Shapes
    /// - `x`: `[batch, len, d_model]`; `buckets` as [`forward_recorded`](Self::forward_recorded)
    ///   returns them
    /// - output: `bounds.len()` tensors `[batch, heads, len]`
    pub fn masses(
        &self,
        x: Tensor<3>,
        bounds: &[usize],
        opts: &ForwardOptions,
        buckets: Option<Tensor<4, Int>>,
    ) -> Vec<Tensor<3>> {
        let [b, l, _] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        let lp = l.div_ceil(self.chunk_len) * self.chunk_len;
        // Column i of every value: 1 on the positions of part i (up to d_head parts per pass).
        let indicators = |parts: &[(usize, usize)]| {
            let mut row = vec![0f32; lp * dh];
            for (i, &(from, to)) in parts.iter().enumerate() {
                for j in from..to.min(l) {
                    row[j * dh + i] = 1.0;
                }
            }
            let data = row.repeat(b * h);
            Tensor::<4>::from_data(TensorData::new(data, [b, h, lp, dh]), &x.device())
        };
        let parts: Vec<(usize, usize)> = (0..bounds.len())
            .map(|i| (if i == 0 { 0 } else { bounds[i - 1] }, bounds[i]))
            .collect();
        let eval = ForwardOptions {
            train: false,
            ..opts.clone()
        };
        let mut masses = Vec::with_capacity(parts.len());
        for group in parts.chunks(dh.max(1)) {
            let values = indicators(group);
            let (out, _) = self.attend(x.clone(), None, &eval, buckets.clone(), Some(values));
            for i in 0..group.len() {
                masses.push(out.clone().narrow(3, i, 1).reshape([b, h, l]));
            }
        }
        masses
    }

    /// The attention of `x` before the output projection, with the values `values` instead
    /// of the layer's where given (`[batch, heads, padded len, d_head]`), and the buckets it
    /// used.
    ///
    /// # Shapes
    /// - `x`: `[batch, len, d_model]` → `[batch, heads, len, d_head]`
    fn attend(
        &self,
        x: Tensor<3>,
        pad_mask: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
        buckets: Option<Tensor<4, Int>>,
        values: Option<Tensor<4>>,
    ) -> (Tensor<4>, Option<Tensor<4, Int>>) {
        let [b, l, d] = x.dims();
        let (h, dh, c) = (self.n_heads, self.d_head, self.chunk_len);
        let device = x.device();
        let lp = l.div_ceil(c) * c;
        let (x, pad) = if lp == l {
            (x, pad_mask)
        } else {
            let x = Tensor::cat(vec![x, Tensor::zeros([b, lp - l, d], &device)], 1);
            let user = pad_mask.unwrap_or_else(|| Tensor::<2, Int>::zeros([b, l], &device).bool());
            let extra = Tensor::<2, Int>::ones([b, lp - l], &device).bool();
            (x, Some(Tensor::cat(vec![user, extra], 1)))
        };
        let heads = |t: Tensor<3>| t.reshape([b, lp, h, dh]).swap_dims(1, 2);
        let params = ChunkParams {
            chunk_len: c,
            before: self.n_chunks_before,
            after: self.n_chunks_after,
            causal: self.causal,
            dedup_rounds: self.dedup_rounds,
            lsh_scores: self.lsh_scores,
            kernel: self.lsh_kernel,
            key_eps: self.key_eps,
        };
        let dropatt = (opts.train && self.dropatt > 0.0).then(|| (self.dropatt, mix(opts.seed, 2)));
        let q = heads(self.query.forward(x.clone()));
        let v = values.unwrap_or_else(|| heads(self.value.forward(x.clone())));
        let (out, used) = match (self.kind, &self.key) {
            (AttentionKind::Local, Some(key)) => {
                let k = heads(key.forward(x));
                (local_attention(q, k, v, pad, params, dropatt), None)
            }
            _ => {
                let n_buckets = self.buckets_for(lp);
                let buckets = buckets.unwrap_or_else(|| {
                    let rounds = opts.n_rounds.unwrap_or(self.n_rounds);
                    let rot = self.rotations_for(
                        rounds,
                        n_buckets,
                        mix(opts.seed, 1),
                        opts.train,
                        &device,
                    );
                    if rot.dims()[0] == 1 && self.bucket_factors.len() <= 1 {
                        let [_, _, r, half] = rot.dims();
                        hash_buckets_with(
                            q.clone().detach(),
                            rot.reshape([dh, r, half]),
                            self.lsh_kernel,
                        )
                    } else {
                        hash_buckets_factored(q.clone().detach(), rot, &self.bucket_factors)
                    }
                });
                let out = lsh_attention_with_buckets(
                    q,
                    v,
                    buckets.clone(),
                    n_buckets,
                    pad,
                    params,
                    dropatt,
                );
                (out, Some(buckets))
            }
        };
        let out = if lp == l {
            out
        } else {
            out.slice([0..b, 0..h, 0..l])
        };
        (out, used)
    }
}
