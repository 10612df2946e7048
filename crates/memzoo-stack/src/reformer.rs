//! The Reformer (Kitaev, Kaiser, Levskaya, ICLR 2020) as a preset of the layer stack: LSH /
//! local attention layers ([`LayerKind::Lsh`], [`LayerKind::Local`]) with reversible residuals,
//! a chunked GELU feed-forward, axial positions, pre-LN, a final LayerNorm over
//! `(y_1 + y_2) / 2`, a linear head and seeded, replayable randomness. [`ReformerConfig`] (the
//! preset's parameters in the paper's terms) builds the stack's [`XlConfig`] ([`ReformerConfig::stack`]);
//! [`ReformerLm`] is the stack. The components (LSH attention, the chunking, axial embeddings,
//! the reversible coupling and its backward) live in `memzoo_reformer`.

use burn::config::Config;
use burn::tensor::Device;
use memzoo_reformer::{LshScores, ReformerError};

use crate::error::XlError;
use crate::stack::{
    Activation, AxialConfig, HeadInput, KnnLayerConfig, LayerKind, LshLayerConfig, Randomness,
    Residual, TransformerXl, XlConfig,
};

/// The Reformer is the layer stack with LSH / local layers (see the module docs).
pub type ReformerLm = TransformerXl;

/// Configuration of the Reformer (Kitaev et al. 2020), a preset of the layer stack
/// ([`ReformerConfig::stack`]). Defaults: the Reformer-small reference (6 layers, d_model 256,
/// 8 heads x 32, seq 4096, bucket 64, 4 rounds, causal, reversible, chunked FF, axial
/// positions, bytes).
#[derive(Config, Debug)]
pub struct ReformerConfig {
    /// Vocabulary size. Default: 256 (bytes).
    #[config(default = 256)]
    pub vocab_size: usize,
    /// Model width. Default: 256.
    #[config(default = 256)]
    pub d_model: usize,
    /// Number of layers. Default: 6.
    #[config(default = 6)]
    pub n_layers: usize,
    /// Attention heads per layer. Default: 8.
    #[config(default = 8)]
    pub n_heads: usize,
    /// Width of each head. Default: 32.
    #[config(default = 32)]
    pub d_head: usize,
    /// Inner width of the feed-forward. Default: 1024.
    #[config(default = 1024)]
    pub d_ff: usize,
    /// Longest sequence (the axial grid covers it). Default: 4096.
    #[config(default = 4096)]
    pub max_seq_len: usize,
    /// Attention kind per layer, `"lsh"` or `"local"` (or any kind of the stack, e.g. `"knn"`
    /// for a kNN memory layer, see [`LayerKind`]), repeated to `n_layers`; empty: all LSH.
    /// Default: empty.
    #[config(default = "Vec::new()")]
    pub attn_layers: Vec<LayerKind>,
    /// LSH: how a query scores its shared-QK keys. Default: unit keys and no further scale, as
    /// trax and HF (`scaled_unit_keys`: also `1/sqrt(d_head)`, as reformer-pytorch).
    #[config(default = "LshScores::UnitKeys")]
    pub lsh_scores: LshScores,
    /// Chunk length of the attention (= LSH bucket size). Default: 64.
    #[config(default = 64)]
    pub bucket_size: usize,
    /// LSH buckets per round (even); `None`: length / bucket size. Default: none.
    #[config(default = "None")]
    pub n_buckets: Option<usize>,
    /// LSH hash rounds. Default: 4.
    #[config(default = 4)]
    pub n_rounds: usize,
    /// Chunks before its own a chunk attends to. Default: 1.
    #[config(default = 1)]
    pub n_chunks_before: usize,
    /// Chunks after its own a chunk attends to. Default: 0.
    #[config(default = 0)]
    pub n_chunks_after: usize,
    /// Causal (language model) masking. Default: true.
    #[config(default = true)]
    pub causal: bool,
    /// Reversible residual layers (activations rebuilt in the backward). Default: true.
    #[config(default = true)]
    pub reversible: bool,
    /// Positions per feed-forward chunk (0: no chunking). Default: 512.
    #[config(default = 512)]
    pub ff_chunk_len: usize,
    /// Axial position embeddings (else none). Default: true.
    #[config(default = true)]
    pub axial_positions: bool,
    /// Axial grid `(a_1, a_2)`, `a_1 a_2 >= max_seq_len`; `None`: the smallest near-square
    /// grid. Default: none (64 x 64 for 4096).
    #[config(default = "None")]
    pub axial_shape: Option<[usize; 2]>,
    /// Axial widths `(d_1, d_2)`, `d_1 + d_2 = d_model`; `None`: halves. Default: none.
    #[config(default = "None")]
    pub axial_dims: Option<[usize; 2]>,
    /// Dropout on embeddings and on the outputs of attention and feed-forward. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// Standard deviation of the normal initialiser of the embedding and every weight matrix
    /// (biases start at zero, LayerNorms at gain 1), HF Reformer's `initializer_range`.
    /// Default: 0.02.
    #[config(default = 0.02)]
    pub init_std: f64,
    /// Standard deviation of the axial position embeddings' normal initialiser (`None`:
    /// `init_std`, the token embedding's). The token and position embeddings are summed, so
    /// they start at one scale, as in reformer-pytorch (both N(0, 1)). HF's Reformer draws
    /// them from N(0, `axial_norm_std` = 1) beside tokens from N(0, 0.02): the positions drown
    /// the tokens 50:1, and a small Reformer trained so sat at the unigram level (4.84 bpc on
    /// tiny Shakespeare after 250 steps, 3.58 with `None`). Default: none.
    #[config(default = "None")]
    pub axial_std: Option<f64>,
    /// Seed of the (fixed) hash rotations in evaluation. Default: 0.
    #[config(default = 0)]
    pub eval_seed: u64,
    /// Base seed of the per-step rotations and dropout masks of `train_step`. Default: 1.
    #[config(default = 1)]
    pub train_seed: u64,
    /// XL memory: positions of the previous segment each layer attends to beside its own
    /// (the `x_2` stream of a reversible layer); 0: none, as the Reformer, which reads each
    /// segment on its own. Needs `axial_positions = false` (axial positions index one
    /// segment). Default: 0.
    #[config(default = 0)]
    pub mem_len: usize,
    /// The kNN layers' retrieval and memory (used where `attn_layers` lists `knn`).
    #[config(default = "KnnLayerConfig::new()")]
    pub knn: KnnLayerConfig,
    /// Chunk length of the local layers; `None`: `bucket_size` (trax's enwik8 and HF have
    /// their own, e.g. 128 beside LSH chunks of 256). Default: none.
    #[config(default = "None")]
    pub local_chunk_len: Option<usize>,
    /// LSH: a factorised bucket count `[f_1, .., f_k]` (HF's `num_buckets = [a, b]`), instead of
    /// `n_buckets`. Default: empty.
    #[config(default = "Vec::new()")]
    pub bucket_factors: Vec<usize>,
    /// LSH: count a pair found in several rounds once (HF and reformer-pytorch do not).
    /// Default: true.
    #[config(default = true)]
    pub dedup_rounds: bool,
    /// LSH: rotations per head, as HF draws them (false: shared by the heads). Default: false.
    #[config(default = false)]
    pub rotations_per_head: bool,
    /// LSH: epsilon of the key normalisation (trax and HF: 1e-6; 0 keeps the fused kernel).
    /// Default: 0.
    #[config(default = 0.0)]
    pub key_eps: f64,
    /// Epsilon of every LayerNorm (HF's `layer_norm_eps` is 1e-12). Default: 1e-5.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
    /// The feed-forward's activation (HF's `hidden_act`: relu in `google/reformer-enwik8`).
    /// Default: gelu.
    #[config(default = "Activation::Gelu")]
    pub ff_activation: Activation,
    /// What the head reads from the two streams: their mean, or HF's `cat(y_1, y_2)` with a
    /// `2 d_model` LayerNorm and decoder. Default: mean.
    #[config(default = "HeadInput::Mean")]
    pub head_input: HeadInput,
}

impl ReformerConfig {
    /// Reformer-small, memzoo's reference for CPU-sized runs (= [`ReformerConfig::new`]).
    pub fn small() -> Self {
        Self::new()
    }

    /// The Reformer's enwik8 configuration (Kitaev et al. 2020; trax's `reformer_enwik8.gin`):
    /// 12 reversible layers, d_model 1024, 8 heads x 128, feed-forward 4096, attention
    /// `[local, local, lsh, local]` repeated, LSH with 512 buckets of 256 positions and 2 hash
    /// rounds, dropout 0.2, sequences of 65,536 bytes with axial positions 128 x 512 (widths
    /// 256 + 768), local layers in chunks of 128 (trax's `local_attention` bins).
    pub fn enwik8() -> Self {
        Self::new()
            .with_n_layers(12)
            .with_d_model(1024)
            .with_n_heads(8)
            .with_d_head(128)
            .with_d_ff(4096)
            .with_attn_layers(vec![
                LayerKind::Local,
                LayerKind::Local,
                LayerKind::Lsh,
                LayerKind::Local,
            ])
            .with_bucket_size(256)
            .with_n_buckets(Some(512))
            .with_n_rounds(2)
            .with_dropout(0.2)
            .with_max_seq_len(65_536)
            .with_axial_shape(Some([128, 512]))
            .with_axial_dims(Some([256, 768]))
            .with_local_chunk_len(Some(128))
    }

    /// The attention kind of every layer (`attn_layers` repeated to `n_layers`).
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        if self.attn_layers.is_empty() {
            return vec![LayerKind::Lsh; self.n_layers];
        }
        (0..self.n_layers)
            .map(|i| self.attn_layers[i % self.attn_layers.len()])
            .collect()
    }

    /// The axial grid.
    pub fn axial_grid(&self) -> [usize; 2] {
        self.axial_shape.unwrap_or_else(|| {
            let a1 = (self.max_seq_len as f64).sqrt().ceil().max(1.0) as usize;
            [a1, self.max_seq_len.div_ceil(a1).max(1)]
        })
    }

    /// The axial widths.
    pub fn axial_widths(&self) -> [usize; 2] {
        self.axial_dims
            .unwrap_or([self.d_model / 2, self.d_model - self.d_model / 2])
    }

    /// The layer stack this preset stands for: `attn_layers` as the layers; pre-LN blocks (gains
    /// initialised at 1) with
    /// a GELU feed-forward chunked by `ff_chunk_len` and dropout on its output only; reversible
    /// (or sequential) residuals; token embeddings unscaled, plus axial positions; a final
    /// LayerNorm and an untied linear head with no dropout before it; seeded randomness
    /// (`eval_seed` for evaluation, `train_seed` for training steps); LSH chunking and
    /// hashing from `bucket_size`, `n_buckets`, `n_rounds`, `n_chunks_*`, `lsh_scores`,
    /// `causal`, `bucket_factors`, `dedup_rounds`, `rotations_per_head`, `key_eps`; local
    /// chunks of `local_chunk_len`; `layer_norm_eps`, `ff_activation`, `head_input`; XL
    /// memory `mem_len`.
    pub fn stack(&self) -> XlConfig {
        XlConfig::new()
            .with_vocab_size(self.vocab_size)
            .with_d_model(self.d_model)
            .with_n_layers(self.n_layers)
            .with_n_heads(self.n_heads)
            .with_d_head(Some(self.d_head))
            .with_d_inner(self.d_ff)
            .with_dropout(self.dropout)
            .with_dropatt(self.dropatt)
            .with_mem_len(self.mem_len)
            .with_pre_ln(true)
            .with_final_norm(true)
            .with_final_dropout(false)
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_init_std(self.init_std)
            .with_norm_gain_std(Some(0.0))
            .with_layers(self.layer_kinds())
            .with_lsh(
                LshLayerConfig::new()
                    .with_chunk_len(self.bucket_size)
                    .with_n_rounds(self.n_rounds)
                    .with_n_buckets(self.n_buckets)
                    .with_n_chunks_before(self.n_chunks_before)
                    .with_n_chunks_after(self.n_chunks_after)
                    .with_causal(self.causal)
                    .with_scores(self.lsh_scores)
                    .with_seed(self.eval_seed)
                    .with_local_chunk_len(self.local_chunk_len)
                    .with_bucket_factors(self.bucket_factors.clone())
                    .with_dedup_rounds(self.dedup_rounds)
                    .with_rotations_per_head(self.rotations_per_head)
                    .with_key_eps(self.key_eps),
            )
            .with_knn(self.knn.clone())
            .with_residual(if self.reversible {
                Residual::Reversible
            } else {
                Residual::Sequential
            })
            .with_ff_activation(self.ff_activation)
            .with_layer_norm_epsilon(self.layer_norm_eps)
            .with_head_input(self.head_input)
            .with_ff_inner_dropout(false)
            .with_ff_chunk_len(self.ff_chunk_len)
            .with_axial(self.axial_positions.then(|| {
                AxialConfig::new(self.axial_grid(), self.axial_widths())
                    .with_std(Some(self.axial_std.unwrap_or(self.init_std)))
            }))
            .with_randomness(Randomness::Seeded)
            .with_train_seed(self.train_seed)
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::from(ReformerError::Config(m)));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("d_head", self.d_head),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
            ("bucket_size", self.bucket_size),
            ("n_rounds", self.n_rounds),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        for (name, p) in [("dropout", self.dropout), ("dropatt", self.dropatt)] {
            if !(0.0..1.0).contains(&p) {
                return bad(format!("{name} must be in [0, 1), got {p}"));
            }
        }
        let axial_std = self.axial_std.unwrap_or(self.init_std);
        for (name, std) in [("init_std", self.init_std), ("axial_std", axial_std)] {
            if !(std.is_finite() && std > 0.0) {
                return bad(format!("{name} must be positive, got {std}"));
            }
        }
        if self.axial_positions {
            let [a1, a2] = self.axial_grid();
            let [d1, d2] = self.axial_widths();
            if a1 * a2 < self.max_seq_len || a1 == 0 || a2 == 0 {
                return bad(format!(
                    "axial_shape {a1} x {a2} = {} must cover max_seq_len {}",
                    a1 * a2,
                    self.max_seq_len
                ));
            }
            if d1 + d2 != self.d_model || d1 == 0 || d2 == 0 {
                return bad(format!(
                    "axial_dims ({d1}, {d2}) must be positive and sum to d_model {}",
                    self.d_model
                ));
            }
        }
        self.stack().validate()
    }

    /// Validates the config and initialises the model (the stack of [`stack`](Self::stack)).
    pub fn init(&self, device: &Device) -> Result<ReformerLm, XlError> {
        self.validate()?;
        self.stack().init(device)
    }
}
