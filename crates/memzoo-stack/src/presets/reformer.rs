//! The Reformer (Kitaev, Kaiser, Levskaya, ICLR 2020) as a preset of the layer stack: LSH /
//! local attention layers ([`LayerKind::Lsh`], [`LayerKind::Local`]) with reversible residuals,
//! a chunked GELU feed-forward, axial positions, pre-LN, a final LayerNorm over
//! `(y_1 + y_2) / 2`, a linear head and seeded, replayable randomness. [`ReformerConfig`] (the
//! preset's parameters in the paper's terms) builds the stack's [`XlConfig`] ([`ReformerConfig::stack`]);
//! [`ReformerLm`] is the stack. The components (LSH attention, the chunking, axial embeddings,
//! the reversible coupling and its backward) live in `memzoo_reformer`.

use burn::config::Config;
use burn::tensor::Device;
use memzoo_reformer::{LshConfig, ReformerError};

use crate::error::XlError;
use crate::stack::{
    Activation, AxialConfig, HeadInput, KnnLayerConfig, LayerKind, PeerCompat, Randomness,
    Residual, TransformerXl, XlConfig,
};

/// The Reformer is the layer stack with LSH / local layers (see the module docs).
pub type ReformerLm = TransformerXl;

/// Configuration of the Reformer (Kitaev et al. 2020), a preset of the layer stack
/// ([`ReformerConfig::stack`]). Defaults: the Reformer-small reference (6 layers, d_model 256,
/// 8 heads x 32, seq 4096, LSH with [`LshConfig`]'s defaults (bucket 64, 4 rounds), causal, reversible, chunked FF, axial
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
    /// Chunking, hashing and scoring of the LSH and local layers, with [`LshConfig`]'s
    /// defaults: chunks (= buckets) of 64, 4 hash rounds, buckets from the length, one chunk
    /// before, causal, unit keys; `lsh.seed` is the seed of the (fixed) rotations in evaluation.
    #[config(default = "LshConfig::new()")]
    pub lsh: LshConfig,
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
            .with_lsh(
                LshConfig::new()
                    .with_chunk_len(256)
                    .with_n_buckets(Some(512))
                    .with_n_rounds(2)
                    .with_local_chunk_len(Some(128)),
            )
            .with_dropout(0.2)
            .with_max_seq_len(65_536)
            .with_axial_shape(Some([128, 512]))
            .with_axial_dims(Some([256, 768]))
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
    /// (`lsh.seed` for evaluation, `train_seed` for training steps); the LSH and local layers'
    /// settings `lsh`; `layer_norm_eps`, `ff_activation`, `head_input`; XL memory `mem_len`.
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
            .with_final_dropout(false)
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_init_std(self.init_std)
            .with_norm_gain_std(Some(0.0))
            .with_layers(self.layer_kinds())
            .with_lsh(self.lsh.clone())
            .with_knn(self.knn.clone())
            .with_residual(if self.reversible {
                Residual::Reversible
            } else {
                Residual::Sequential
            })
            .with_ff_activation(self.ff_activation)
            .with_layer_norm_epsilon(self.layer_norm_eps)
            .with_compat(PeerCompat::new().with_head_input(self.head_input))
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
        self.lsh
            .validate()
            .map_err(|e| XlError::from(ReformerError::Config(format!("lsh: {e}"))))?;
        self.stack().validate()
    }

    /// Validates the config and initialises the model (the stack of [`stack`](Self::stack)).
    pub fn init(&self, device: &Device) -> Result<ReformerLm, XlError> {
        self.validate()?;
        self.stack().init(device)
    }
}
