//! The settings of LSH and local attention, defined once ([`LshConfig`]), and the configuration
//! of one attention layer ([`ReformerAttentionConfig`], which holds them).
//!
//! [`LshConfig`] is what a user tunes: chunk (= bucket) length, hash rounds, buckets, the
//! chunk window, the score convention, the rotations and their seed, and the local layers' own
//! chunking. The layer stack's `[model.lsh]` is this struct, the Reformer preset
//! (`memzoo_stack::ReformerConfig::lsh`) holds one, and every LSH or local layer is built from
//! it, so each default is written here only.

use burn::config::Config;
use burn::module::Param;
use burn::nn::{Initializer, LinearConfig};
use burn::tensor::Device;

use crate::attention::{ChunkParams, LshKernel, LshScores};
use crate::error::ReformerError;
use crate::layer::{AttentionKind, ReformerAttention};

/// Chunking, hashing and scoring of LSH and local attention (Kitaev et al. 2020, sec. 2): the
/// one place their defaults are defined. A local layer reads `chunk_len`, `n_chunks_before`
/// and `n_chunks_after` unless its own `local_*` value is set; LSH layers read the rest.
#[derive(Config, Debug)]
pub struct LshConfig {
    /// Chunk length (= LSH bucket size). Default: 64 (reformer-pytorch's `bucket_size`).
    #[config(default = 64)]
    pub chunk_len: usize,
    /// LSH hash rounds. Default: 4.
    #[config(default = 4)]
    pub n_rounds: usize,
    /// LSH buckets per round (even); `None`: the padded length over `chunk_len`, rounded up to
    /// an even number (at least 2). Default: none.
    #[config(default = "None")]
    pub n_buckets: Option<usize>,
    /// Chunks before its own a chunk attends to. Default: 1.
    #[config(default = 1)]
    pub n_chunks_before: usize,
    /// Chunks after its own a chunk attends to (non-causal layers only). Default: 0.
    #[config(default = 0)]
    pub n_chunks_after: usize,
    /// Causal masking by original position; false lets every position see the whole sequence
    /// (an encoder, not a language model). Default: true.
    #[config(default = true)]
    pub causal: bool,
    /// LSH: how a query scores its shared-QK keys. Default: unit keys and no further scale
    /// (trax's and HF's convention; `scaled_unit_keys` also divides by `sqrt(d_head)`, as
    /// reformer-pytorch).
    #[config(default = "LshScores::UnitKeys")]
    pub scores: LshScores,
    /// Seed of the LSH rotations of passes that are not training steps (a layer stack's
    /// evaluation and generation: `ForwardOptions::eval(seed)`; with the stack's
    /// `randomness = "device"`, of every pass). Default: 0.
    #[config(default = 0)]
    pub seed: u64,
    /// LSH: count a (query, key) pair found in several hash rounds once (see
    /// [`ChunkParams::dedup_rounds`]); HF's and reformer-pytorch's attention do not.
    /// Default: true.
    #[config(default = true)]
    pub dedup_rounds: bool,
    /// LSH: a factorised bucket count `[f_1, .., f_k]` (HF's `num_buckets` as a list, e.g.
    /// `[64, 128]` for `google/reformer-enwik8`): the bucket is `h_1 + f_1 h_2 + ..` with `h_i`
    /// in `0..f_i` from its own `f_i / 2` rotation columns
    /// ([`hash_buckets_factored`](crate::hash_buckets_factored)); `n_buckets` is then `Π f_i`
    /// (it may be left `None`). Empty: not factorised. Default: empty.
    #[config(default = "Vec::new()")]
    pub bucket_factors: Vec<usize>,
    /// LSH: every head draws its own rotations (`[heads, d_head, rounds, n / 2]`, as HF's
    /// `LSHSelfAttention`); false: one set shared by all heads. Default: false.
    #[config(default = false)]
    pub rotations_per_head: bool,
    /// LSH: epsilon of the key normalisation, `k̂ = q / sqrt(|q|² + d_head ε)`
    /// ([`ChunkParams::key_eps`]; trax and HF: 1e-6); 0: `q / |q|`, which keeps the fused
    /// kernel. Default: 0.
    #[config(default = 0.0)]
    pub key_eps: f64,
    /// LSH: the layer holds one set of rotations as a (never trained) parameter,
    /// `[heads or 1, d_head, n_rounds, Σ factors / 2]`, saved in checkpoints and used by every
    /// pass that is not training (evaluation, generation, a gradient taken outside a training
    /// step), instead of rotations drawn from the pass's seed; training steps still draw fresh
    /// ones. Set them with [`ReformerAttention::set_fixed_rotations`] (e.g. the rotations a
    /// PyTorch Reformer drew in one forward pass, to reproduce it exactly). Needs `n_buckets`
    /// or `bucket_factors`. Default: false.
    #[config(default = false)]
    pub fixed_rotations: bool,
    /// Chunk length of local layers; `None`: `chunk_len` (HF has `local_attn_chunk_length`
    /// beside `lsh_attn_chunk_length`; trax's enwik8 128 beside LSH chunks of 256).
    /// Default: none.
    #[config(default = "None")]
    pub local_chunk_len: Option<usize>,
    /// Chunks before its own a local layer's chunk attends to; `None`: `n_chunks_before`.
    /// Default: none.
    #[config(default = "None")]
    pub local_n_chunks_before: Option<usize>,
    /// Chunks after its own a local layer's chunk attends to; `None`: `n_chunks_after`.
    /// Default: none.
    #[config(default = "None")]
    pub local_n_chunks_after: Option<usize>,
    /// The output projection has a bias (reformer-pytorch's `to_out`; HF's and trax's have
    /// none). Default: false.
    #[config(default = false)]
    pub output_bias: bool,
}

impl LshConfig {
    /// The chunk length and window (`chunk_len`, chunks before, chunks after) of a layer of
    /// `kind`: a local layer's own `local_*` values where set.
    pub fn window(&self, kind: AttentionKind) -> [usize; 3] {
        let own = |local: Option<usize>, shared: usize| match kind {
            AttentionKind::Local => local.unwrap_or(shared),
            AttentionKind::Lsh => shared,
        };
        [
            own(self.local_chunk_len, self.chunk_len),
            own(self.local_n_chunks_before, self.n_chunks_before),
            own(self.local_n_chunks_after, self.n_chunks_after),
        ]
    }

    /// How a layer of `kind` chunks and scores, with the LSH implementation `kernel`.
    pub fn chunk_params(&self, kind: AttentionKind, kernel: LshKernel) -> ChunkParams {
        let [chunk_len, before, after] = self.window(kind);
        ChunkParams {
            chunk_len,
            before,
            after,
            causal: self.causal,
            dedup_rounds: self.dedup_rounds,
            lsh_scores: self.scores,
            kernel,
            key_eps: self.key_eps,
        }
    }

    /// Checks every setting, naming the bad value.
    pub fn validate(&self) -> Result<(), ReformerError> {
        let bad = |m: String| Err(ReformerError::Config(m));
        for (name, v) in [
            ("chunk_len", self.chunk_len),
            ("n_rounds", self.n_rounds),
            ("local_chunk_len", self.local_chunk_len.unwrap_or(1)),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        if let Some(nb) = self.n_buckets
            && (nb == 0 || nb % 2 != 0)
        {
            return bad(format!(
                "n_buckets must be even and positive (buckets are argmax over [xR, -xR]), got {nb}"
            ));
        }
        if let Some(f) = self.bucket_factors.iter().find(|&&f| f == 0 || f % 2 != 0) {
            return bad(format!(
                "bucket_factors {:?}: every factor must be even and positive, got {f}",
                self.bucket_factors
            ));
        }
        let product: usize = self.bucket_factors.iter().product();
        if !self.bucket_factors.is_empty()
            && let Some(nb) = self.n_buckets
            && nb != product
        {
            return bad(format!(
                "n_buckets = {nb} but bucket_factors {:?} multiply to {product}",
                self.bucket_factors
            ));
        }
        if !(self.key_eps.is_finite() && self.key_eps >= 0.0) {
            return bad(format!("key_eps must be >= 0, got {}", self.key_eps));
        }
        if self.fixed_rotations && self.n_buckets.is_none() && self.bucket_factors.is_empty() {
            return bad(
                "fixed_rotations needs a fixed bucket count: set n_buckets or bucket_factors"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Configuration of a [`ReformerAttention`] layer (LSH or local).
#[derive(Config, Debug)]
pub struct ReformerAttentionConfig {
    /// Width of the layer's input and output.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
    /// LSH or local attention. Default: LSH.
    #[config(default = "AttentionKind::Lsh")]
    pub kind: AttentionKind,
    /// Chunking, hashing and scoring (see [`LshConfig`] for each default).
    #[config(default = "LshConfig::new()")]
    pub lsh: LshConfig,
    /// LSH: the fused CPU kernel where the device allows it, or tensor ops everywhere (see
    /// [`LshKernel`]). Default: automatic by device.
    #[config(default = "LshKernel::Auto")]
    pub lsh_kernel: LshKernel,
    /// Dropout on the attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// Initialiser of every weight. Default: normal(0, 0.02).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl ReformerAttentionConfig {
    /// Checks the configuration, naming the bad value.
    pub fn validate(&self) -> Result<AttentionKind, ReformerError> {
        for (name, v) in [
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("d_head", self.d_head),
        ] {
            if v == 0 {
                return Err(ReformerError::Config(format!(
                    "{name} must be positive, got 0"
                )));
            }
        }
        if !(0.0..1.0).contains(&self.dropatt) {
            return Err(ReformerError::Config(format!(
                "dropatt must be in [0, 1), got {}",
                self.dropatt
            )));
        }
        self.lsh.validate()?;
        Ok(self.kind)
    }

    /// The shape of the layer's rotations, `[heads or 1, d_head, n_rounds, Σ factors / 2]`
    /// (`None`: the bucket count follows the length).
    pub fn rotation_shape(&self) -> Option<[usize; 4]> {
        let lsh = &self.lsh;
        let width = if lsh.bucket_factors.is_empty() {
            lsh.n_buckets?
        } else {
            lsh.bucket_factors.iter().sum()
        };
        let heads = if lsh.rotations_per_head {
            self.n_heads
        } else {
            1
        };
        Some([heads, self.d_head, lsh.n_rounds, width / 2])
    }

    /// Initialises the layer after validating the configuration.
    pub fn init(&self, device: &Device) -> Result<ReformerAttention, ReformerError> {
        let kind = self.validate()?;
        let lsh = &self.lsh;
        let params = lsh.chunk_params(kind, self.lsh_kernel);
        let inner = self.n_heads * self.d_head;
        let linear = |i, o| {
            LinearConfig::new(i, o)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        Ok(ReformerAttention {
            query: linear(self.d_model, inner),
            key: (kind == AttentionKind::Local).then(|| linear(self.d_model, inner)),
            value: linear(self.d_model, inner),
            output: if lsh.output_bias {
                let mut out = LinearConfig::new(inner, self.d_model)
                    .with_initializer(self.initializer.clone())
                    .init(device);
                out.bias = out
                    .bias
                    .map(|_| Initializer::Zeros.init([self.d_model], device));
                out
            } else {
                linear(inner, self.d_model)
            },
            kind,
            n_heads: self.n_heads,
            d_head: self.d_head,
            chunk_len: params.chunk_len,
            n_buckets: lsh.n_buckets,
            n_rounds: lsh.n_rounds,
            n_chunks_before: params.before,
            n_chunks_after: params.after,
            causal: lsh.causal,
            dedup_rounds: lsh.dedup_rounds,
            lsh_scores: lsh.scores,
            lsh_kernel: self.lsh_kernel,
            dropatt: self.dropatt,
            bucket_factors: lsh.bucket_factors.clone(),
            rotations_per_head: lsh.rotations_per_head,
            key_eps: lsh.key_eps,
            rotations: match (
                lsh.fixed_rotations && kind == AttentionKind::Lsh,
                self.rotation_shape(),
            ) {
                (true, Some(shape)) => Some(Param::from_tensor(
                    Initializer::Normal {
                        mean: 0.0,
                        std: 1.0,
                    }
                    .init::<4, _>(shape, device)
                    .val(),
                )),
                _ => None,
            },
        })
    }
}
