//! The attention kind of each layer, the stack's residual and head options, and the settings
//! of its LSH, local and kNN layers.

use burn::config::Config;
use memzoo_knn::KnnMixing;
use memzoo_memory::{HnswConfig, HostScoring, IndexKind, WhenFull};
use memzoo_relative::PositionKind;
use serde::{Deserialize, Serialize};

/// The attention of one layer of the stack.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// Relative attention with Transformer-XL's sinusoids and `u`/`v` biases (Dai et al. 2019).
    Xl,
    /// Relative attention with learned relative embeddings (labml).
    Learned,
    /// Relative attention with T5's bucketed biases (Raffel et al. 2020).
    T5,
    /// kNN-augmented attention (Wu et al. 2022): T5 local attention plus the top-k pairs
    /// retrieved from the layer's kNN memory of everything read before.
    Knn,
    /// The Reformer's LSH attention (Kitaev et al. 2020), shared-QK, over `cat(memory, x)`.
    Lsh,
    /// The Reformer's chunked local attention over `cat(memory, x)`.
    Local,
    /// Content-only attention `s q·k` (no relative term), the stack adding sinusoidal
    /// absolute positions to its embeddings: the vanilla Transformer (Al-Rfou et al. 2018),
    /// Transformer-XL's baseline. Needs `mem_len = 0` and every layer of this kind.
    Absolute,
    /// Content attention over rotary positions with optional xPos scaling (Su et al. 2021;
    /// Sun et al. 2022; block-recurrent-transformer-pytorch): relative, so it reads an XL
    /// memory (see `memzoo_relative::rotary`).
    Rotary,
}

impl LayerKind {
    /// The relative position scheme of a relative kind (`None` for `knn`, `lsh`, `local`).
    pub fn positions(self) -> Option<PositionKind> {
        match self {
            LayerKind::Xl => Some(PositionKind::Xl),
            LayerKind::Learned => Some(PositionKind::Learned),
            LayerKind::T5 => Some(PositionKind::T5),
            LayerKind::Absolute => Some(PositionKind::Absolute),
            LayerKind::Rotary => Some(PositionKind::Rotary),
            LayerKind::Knn | LayerKind::Lsh | LayerKind::Local => None,
        }
    }

    /// The relative kind of a position scheme.
    pub fn of_positions(kind: PositionKind) -> Self {
        match kind {
            PositionKind::Xl => LayerKind::Xl,
            PositionKind::Learned => LayerKind::Learned,
            PositionKind::T5 => LayerKind::T5,
            PositionKind::Absolute => LayerKind::Absolute,
            PositionKind::Rotary => LayerKind::Rotary,
        }
    }

    /// The model family a stack of these layers is (the label checkpoints carry): `memorizing`
    /// with kNN layers, `reformer` with LSH or local attention layers (and no kNN ones), `xl`
    /// otherwise. The one place the family is computed, for a config
    /// ([`XlConfig::family`](crate::XlConfig::family)) and a model
    /// ([`TransformerXl::stack_family`](crate::TransformerXl::stack_family)) alike.
    pub fn family_of(kinds: &[LayerKind]) -> &'static str {
        if kinds.contains(&LayerKind::Knn) {
            "memorizing"
        } else if kinds
            .iter()
            .any(|k| matches!(k, LayerKind::Lsh | LayerKind::Local))
        {
            "reformer"
        } else {
            "xl"
        }
    }
}

/// How each layer arranges its two residual branches, the attention `F` and the feed-forward
/// `G` (`[model] residual = "sequential"` or `"reversible"`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Residual {
    /// One stream: `h = x + F(x)`, `out = h + G(h)` (post-LN: a LayerNorm after each sum).
    #[default]
    Sequential,
    /// Two streams (RevNet; Kitaev et al. 2020, sec. 3): the embedding starts both,
    /// `y_1 = x_1 + F(x_2)`, `y_2 = x_2 + G(y_1)`, and the head reads `(y_1 + y_2) / 2`. A
    /// layer's inputs can be rebuilt from its outputs, so the training step
    /// ([`TransformerXl::train_step`](crate::TransformerXl::train_step)) keeps no activations per layer.
    Reversible,
}

/// The feed-forward's activation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `max(0, x)` (Transformer-XL).
    #[default]
    Relu,
    /// `x Φ(x)` (the Reformer).
    Gelu,
    /// GEGLU (Shazeer 2020): the first layer is `d_model -> 2 d_inner`, its halves `a`, `g`
    /// give `a · gelu(g)` (`d_inner` wide) for the second layer. `d_inner` is written out in
    /// the config, never derived (recurrent-memory-transformer-pytorch takes
    /// `int(d_model · ff_mult · 2 / 3)`).
    Geglu,
}

/// Where dropout masks and LSH rotations come from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Randomness {
    /// The backend's random generator (Burn's `Dropout`); LSH layers keep one fixed set of
    /// rotations each (`lsh.seed + layer`).
    #[default]
    Device,
    /// Every dropout mask and LSH rotation is drawn on the host from a seed per pass, layer
    /// and site (the Reformer's `ForwardOptions`), so a pass can be replayed exactly, as the
    /// reversible backward needs. Evaluation passes use the seed `lsh.seed` and no dropout;
    /// each training step draws a fresh seed from `train_seed` (new rotations every step, as
    /// the Reformer).
    Seeded,
}

/// What the head of a reversible stack reads from the last layer's two streams `y_1`, `y_2`
/// (`[model] head_input = "mean"` or `"concat"`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum HeadInput {
    /// `(y_1 + y_2) / 2`, `d_model` wide (reformer-pytorch's mean, memzoo's Reformer).
    #[default]
    Mean,
    /// `cat(y_1, y_2)`, `2 d_model` wide: the final LayerNorm and the linear output are that
    /// wide (HF's `ReformerModelWithLMHead`: `LayerNorm(2 d_model)`, decoder from `2 d_model`).
    Concat,
}

/// Axial position embeddings added to the token embedding (Kitaev et al. 2020; trax's
/// `AxialPositionalEncoding`): position `p = i a_2 + j` gets `cat(E_1[i], E_2[j])`.
#[derive(Config, Debug)]
pub struct AxialConfig {
    /// The grid `(a_1, a_2)`; `a_1 a_2` bounds the segment length.
    pub shape: [usize; 2],
    /// The two tables' widths `(d_1, d_2)`, `d_1 + d_2 = d_model`.
    pub dims: [usize; 2],
    /// Standard deviation of the tables' normal initialiser; `None`: the token embedding's
    /// (`embedding_std`, else `init_std`). Default: none.
    #[config(default = "None")]
    pub std: Option<f64>,
    /// `E_1[i] + E_2[j]` with both tables `d_model` wide (`dims = [d_model, d_model]`,
    /// reformer-pytorch's default) instead of their concatenation. Default: false.
    #[config(default = false)]
    pub summed: bool,
}

/// The settings of the stack's LSH and local layers (`[model.lsh]`, used where
/// [`XlConfig::layers`](crate::XlConfig::layers) lists `lsh` or `local`): the Reformer crate's
/// [`LshConfig`](memzoo_reformer::LshConfig), where each of their defaults is defined. Such a
/// layer attends over `cat(memory, x)` as one causal sequence (the memory's positions are keys
/// for the segment's queries, as in an XL layer) and has no position scheme of its own:
/// positions reach it through the stack's relative layers.
#[deprecated(note = "the stack's LSH settings are `memzoo_reformer::LshConfig`")]
pub type LshLayerConfig = memzoo_reformer::LshConfig;

/// Which pairs a kNN layer adds to its kNN memory after a segment.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum KnnFeed {
    /// The segment's own pairs, right after it is read (memzoo).
    #[default]
    Segment,
    /// The pairs that leave the layer's XL memory: of `cat(memory, segment)`, all but the
    /// last `mem_len` (with `mem_len = 0`, the segment's), so a position reaches the kNN
    /// memory once the XL memory drops it (memorizing-transformers-pytorch).
    Evicted,
}

/// Settings of the stack's kNN layers (used where [`XlConfig::layers`](crate::XlConfig::layers) lists `knn`).
#[derive(Config, Debug)]
pub struct KnnLayerConfig {
    /// Retrieved pairs per query. Default: 32 (Wu et al. 2022).
    #[config(default = 32)]
    pub top_k: usize,
    /// kNN memories per (batch row, kv head), oldest evicted first. Default: 16,384.
    #[config(default = 16384)]
    pub max_memories: usize,
    /// kNN search structure. Default: `auto` (exact up to `auto_crossover`, then HNSW).
    #[config(default = "IndexKind::Auto")]
    pub index: IndexKind,
    /// Where `auto` switches to HNSW. Default: 262,144 (see `KnnMemoryConfig`).
    #[config(default = 262144)]
    pub auto_crossover: usize,
    /// HNSW parameters. Default: connectivity 32, expansion_add 64, expansion_search by size.
    #[config(default = "HnswConfig::new()")]
    pub hnsw: HnswConfig,
    /// How exact search scores the keys in host memory (CPU devices): `f32`, `int8` (an int8
    /// pass, then f32 for the keys that may reach the top-k: the same top-k) or `auto` (int8
    /// from 65,536 keys per store where the CPU has AVX-512 VNNI, resting after searches
    /// where it paid less; see `memzoo_memory::HostScoring`). Default: auto.
    #[config(default = "HostScoring::Auto")]
    pub scoring: HostScoring,
    /// Initial temperature of the normalised scores. Default: 20.
    #[config(default = 20.0)]
    pub attn_scale_init: f64,
    /// How local and retrieved attention combine: `gate` (two softmaxes and a learned gate,
    /// the paper) or `joint` (one softmax over both, no gate, memorizing-transformers-pytorch).
    /// Default: gate.
    #[config(default = "KnnMixing::Gate")]
    pub mixing: KnnMixing,
    /// What the kNN memory receives: the segment's pairs (`segment`) or those leaving the XL
    /// memory (`evicted`, memorizing-transformers-pytorch). Default: segment.
    #[config(default = "KnnFeed::Segment")]
    pub feed: KnnFeed,
    /// A full row evicts its oldest pairs (`evict`) or is emptied (`reset`,
    /// memorizing-transformers-pytorch; see `memzoo_memory::reset`). Default: evict.
    #[config(default = "WhenFull::Evict")]
    pub when_full: WhenFull,
}

/// qk-RMSNorm (`[model.qk_norm]`; block-recurrent-transformer-pytorch's `qk_rmsnorm`): in the
/// layers it covers, queries and keys are l2-normalised per head and scaled by learned gains
/// (`d_head` each, starting at 1) before the positions, and the scores are `s q̂·k̂` with a
/// fixed scale `s` instead of `1 / sqrt(d_head)` (see `memzoo_relative::rotary`). It needs
/// rotary or absolute layers where it applies.
#[derive(Config, Debug)]
pub struct QkNormConfig {
    /// Every layer (the peer's `all_layers_qk_rmsnorm`); false: the Block-Recurrent
    /// recurrent layer alone, its self-attention and the state's three attentions (the
    /// peer's default). Default: false.
    #[config(default = false)]
    pub all_layers: bool,
    /// The fixed scale `s` of the scores. Default: 8 (the peer's `qk_rmsnorm_scale`, which
    /// its 0.4.4 stores but never applies: its import sets `1 / sqrt(d_head)`, what it
    /// computes).
    #[config(default = 8.0)]
    pub scale: f64,
}
