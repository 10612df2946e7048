//! The layer stack: Transformer-XL (Dai et al. 2019) with any attention kind per layer.
//!
//! One embedding, a list of layers — each one attention kind ([`LayerKind`]: XL-relative,
//! learned-relative, T5, kNN) inside one residual block ([`XlBlock`]) — and one output.
//! Transformer-XL is the stack of `xl` layers; the Memorizing Transformer
//! (`memzoo_knn::MemorizingConfig`) is the same stack with `knn` layers at chosen depths; the
//! Reformer ([`crate::reformer::ReformerConfig`]) is the stack of `lsh` / `local` layers with
//! reversible residuals ([`Residual`]), axial positions ([`AxialConfig`]), a chunked GELU
//! feed-forward and seeded, replayable randomness ([`Randomness`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig,
    Linear, LinearConfig,
};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::activation::{gelu, log_softmax, relu};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_memory::{HnswConfig, IndexKind, KnnIndex, KnnMemoryConfig, Retrieved, WhenFull};
use memzoo_reformer::rng::{dropout_mask, mix};
use memzoo_reformer::{
    AttentionKind as ReformerKind, AxialPositionalEmbedding, AxialPositionalEmbeddingConfig,
    ForwardOptions, LshScores, ReformerAttention, ReformerAttentionConfig, chunked, reversible,
};
use memzoo_relative::{
    AttentionMask, KnnAttention, KnnAttentionConfig, KnnMixing, PositionConfig, PositionKind,
    RelativeAttentionConfig, RelativeContext, RelativeMultiHeadAttention, XlBiases, linear_rows,
};
use serde::{Deserialize, Serialize};

use crate::adaptive::{
    AdaptiveEmbedding, AdaptiveEmbeddingConfig, AdaptiveLogSoftmax, AdaptiveLogSoftmaxConfig,
};
use crate::error::XlError;
use crate::memory::{XlMemory, XlState};

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
}

impl LayerKind {
    /// The relative position scheme of a relative kind (`None` for `knn`, `lsh`, `local`).
    pub fn positions(self) -> Option<PositionKind> {
        match self {
            LayerKind::Xl => Some(PositionKind::Xl),
            LayerKind::Learned => Some(PositionKind::Learned),
            LayerKind::T5 => Some(PositionKind::T5),
            LayerKind::Absolute => Some(PositionKind::Absolute),
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
        }
    }

    /// The model family a stack of these layers is (the label checkpoints carry): `memorizing`
    /// with kNN layers, `reformer` with LSH or local attention layers (and no kNN ones), `xl`
    /// otherwise. The one place the family is computed, for a config
    /// ([`XlConfig::family`]) and a model ([`TransformerXl::stack_family`]) alike.
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
    /// ([`TransformerXl::train_step_state`]) keeps no activations per layer.
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

/// Seed tags of the random sites of seeded passes (see [`Randomness::Seeded`]): layer `l`
/// draws from `child(TAG_LAYER + l)`, inside it the attention from `child(TAG_ATTENTION)`, the
/// dropout on `F`'s and `G`'s outputs from `TAG_DROP_F` / `TAG_DROP_G`.
const TAG_ATTENTION: u64 = 1;
const TAG_DROP_F: u64 = 2;
const TAG_DROP_G: u64 = 3;
const TAG_DROP_FF_INNER: u64 = 4;
/// The relative or kNN attention's own dropout masks (its probabilities; in a device stack
/// its output too), from `child(TAG_ATTENTION_DROPOUT)` of the layer's options.
const TAG_ATTENTION_DROPOUT: u64 = 5;
const TAG_LAYER: u64 = 1_000;
const TAG_EMBED: u64 = 1_000_001;
const TAG_FINAL: u64 = 1_000_002;

/// Inverted dropout of `x` with a mask drawn from `opts`'s seed and `tag` (none outside
/// training): the same options replay the same mask.
fn seeded_dropout(x: Tensor<3>, p: f64, opts: &ForwardOptions, tag: u64) -> Tensor<3> {
    match seeded_mask(x.dims(), p, opts, tag, &x.device()) {
        Some(mask) => x * mask,
        None => x,
    }
}

/// The mask of [`seeded_dropout`] for activations of `shape` (`None`: no dropout).
fn seeded_mask(
    shape: [usize; 3],
    p: f64,
    opts: &ForwardOptions,
    tag: u64,
    device: &Device,
) -> Option<Tensor<3>> {
    if !opts.train {
        return None;
    }
    dropout_mask(shape, p, mix(opts.seed, tag), device)
}

/// Counts training steps so each draws fresh rotations and dropout masks (seeded passes).
///
/// Clones share the count. The trainer does not rely on it: it sets a fresh counter at the
/// stream of every step and replica ([`StepCounter::at`], `SegmentModel::with_train_stream`),
/// so that what a step draws is a function of its step number, not of the process's history
/// (a resumed run draws what the straight one did) or of which replica's thread ran first.
#[derive(Debug, Clone, Default)]
pub struct StepCounter(Arc<AtomicU64>);

impl StepCounter {
    /// A counter of its own (shared with none) starting at `count`.
    pub fn at(count: u64) -> Self {
        Self(Arc::new(AtomicU64::new(count)))
    }

    /// The current count, then increments it.
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// Settings of the stack's LSH and local layers (used where [`XlConfig::layers`] lists `lsh` or
/// `local`). Such a layer attends over `cat(memory, x)` as one causal sequence (the memory's
/// positions are keys for the segment's queries, as in an XL layer) and has no position
/// scheme of its own: positions reach it through the stack's relative layers.
#[derive(Config, Debug)]
pub struct LshLayerConfig {
    /// Chunk length (= LSH bucket size). Default: 32.
    #[config(default = 32)]
    pub chunk_len: usize,
    /// LSH hash rounds. Default: 2.
    #[config(default = 2)]
    pub n_rounds: usize,
    /// LSH buckets per round (even); `None`: from the sequence length. Default: none.
    #[config(default = "None")]
    pub n_buckets: Option<usize>,
    /// Chunks before its own a chunk attends to. Default: 1.
    #[config(default = 1)]
    pub n_chunks_before: usize,
    /// Chunks after its own a chunk attends to (non-causal layers only). Default: 0.
    #[config(default = 0)]
    pub n_chunks_after: usize,
    /// Causal masking by position; false lets every position see the whole sequence (an
    /// encoder, not a language model). Default: true.
    #[config(default = true)]
    pub causal: bool,
    /// How a query scores its shared-QK keys. Default: unit keys (trax, HF).
    #[config(default = "LshScores::UnitKeys")]
    pub scores: LshScores,
    /// Seed of the LSH rotations. With `randomness = "device"` they are drawn once per
    /// (layer, seed) and kept, so that a stack is one function of its parameters; with
    /// `"seeded"` it is the seed of evaluation passes (training draws fresh ones every step,
    /// as the Reformer). Default: 0.
    #[config(default = 0)]
    pub seed: u64,
    /// LSH: count a (query, key) pair found in several hash rounds once (see
    /// `memzoo_reformer::ChunkParams::dedup_rounds`); HF's and reformer-pytorch's default
    /// attention do not. Default: true.
    #[config(default = true)]
    pub dedup_rounds: bool,
    /// LSH: a factorised bucket count `[f_1, .., f_k]` (HF's `num_buckets` as a list, e.g.
    /// `[64, 128]` for `google/reformer-enwik8`); `n_buckets` is then their product. Empty: not
    /// factorised. Default: empty.
    #[config(default = "Vec::new()")]
    pub bucket_factors: Vec<usize>,
    /// LSH: each head hashes with its own rotations (HF draws `[heads, d_head, rounds, n/2]`);
    /// false: one set shared by the heads. Default: false.
    #[config(default = false)]
    pub rotations_per_head: bool,
    /// LSH: epsilon of the key normalisation, `k̂ = q / sqrt(|q|² + d_head ε)` (trax's and HF's
    /// `q rsqrt(mean(q²) + 1e-6) / sqrt(d_head)`: `1e-6`); 0: `q / |q|`. Default: 0.
    #[config(default = 0.0)]
    pub key_eps: f64,
    /// LSH: every LSH layer holds one set of rotations as a never-trained parameter, saved in
    /// checkpoints and used in every pass that is not a training step (evaluation, generation),
    /// instead of rotations drawn from the seed; training steps still draw fresh ones. Set them
    /// with `ReformerAttention::set_fixed_rotations` (the importer reads them from
    /// `rotations.safetensors`, e.g. the rotations a PyTorch Reformer drew in one pass). Needs
    /// `n_buckets` or `bucket_factors`. Default: false.
    #[config(default = false)]
    pub fixed_rotations: bool,
    /// Chunk length of the local layers; `None`: `chunk_len` (HF has `local_attn_chunk_length`
    /// beside `lsh_attn_chunk_length`). Default: none.
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
    /// The output projection of LSH and local layers has a bias (reformer-pytorch's `to_out`).
    /// Default: false.
    #[config(default = false)]
    pub output_bias: bool,
}

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

/// Settings of the stack's kNN layers (used where [`XlConfig::layers`] lists `knn`).
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

/// Configuration of a [`TransformerXl`] language model. Defaults: the XL-small reference
/// config (6 layers, d_model 256, 8 heads x 32, d_inner 1024, mem_len 128, bytes).
#[derive(Config, Debug)]
pub struct XlConfig {
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
    /// Width of each head; `None` means `d_model / n_heads` (which must then divide). Default: none.
    #[config(default = "None")]
    pub d_head: Option<usize>,
    /// Inner width of the position-wise feed-forward. Default: 1024.
    #[config(default = 1024)]
    pub d_inner: usize,
    /// Dropout on embeddings, attention output, feed-forward and final output. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// Positions of earlier segments kept as memory (0: no recurrence). Default: 128.
    #[config(default = 128)]
    pub mem_len: usize,
    /// Every query attends to exactly `mem_len` keys (itself and the `mem_len - 1` before it)
    /// instead of `mlen + i + 1`. Default: false.
    #[config(default = false)]
    pub same_length: bool,
    /// Relative position scheme (XL's own by default; `clamp_len` lives here).
    #[config(default = "PositionConfig::new()")]
    pub positions: PositionConfig,
    /// Pre-LayerNorm residual blocks instead of the paper's post-LN. Default: false.
    #[config(default = false)]
    pub pre_ln: bool,
    /// Output layer shares the embedding matrix (with an adaptive output: the softmax scores
    /// against the adaptive embedding's tables, HF's `tie_word_embeddings`). Default: true.
    #[config(default = true)]
    pub tie_weights: bool,
    /// Width of the embedding table (of its first cluster with `cutoffs`); `None`: `d_model`.
    /// Another width than `d_model` makes input and output adaptive, with projections to
    /// `d_model` (Baevski & Auli 2019). Default: none.
    #[config(default = "None")]
    pub d_embed: Option<usize>,
    /// Cluster bounds of the adaptive input embedding and adaptive log-softmax (Grave et al.
    /// 2017), e.g. `[20000, 40000, 200000]` for WikiText-103; empty: one table and a full
    /// softmax. Any cutoff makes input and output adaptive (see `memzoo_xl::adaptive`).
    /// Default: empty.
    #[config(default = "Vec::new()")]
    pub cutoffs: Vec<usize>,
    /// Cluster `i`'s table has width `d_embed / div_val^i` and its own projection; 1: one
    /// table of width `d_embed`. Above 1 it makes input and output adaptive. Default: 1.
    #[config(default = 1)]
    pub div_val: usize,
    /// Per cluster of an adaptive output: its projection is the embedding's (HF's `tie_projs`;
    /// missing entries are false). Default: empty.
    #[config(default = "Vec::new()")]
    pub tie_projs: Vec<bool>,
    /// Multiply embeddings by `sqrt(d_model)` (Vaswani et al. 2017; Transformer-XL's code and
    /// HF, inside the adaptive embedding). Default: true.
    #[config(default = true)]
    pub scale_embedding: bool,
    /// Epsilon of every LayerNorm. Default: 1e-5 (HF's `layer_norm_epsilon`).
    #[config(default = 1e-5)]
    pub layer_norm_epsilon: f64,
    /// With `pre_ln`: a LayerNorm after the last layer (GPT-2's, memzoo's pre-LN stacks); HF's
    /// pre-LN TransfoXL (`pre_lnorm = true`) has none. Unused without `pre_ln`. Default: true.
    #[config(default = true)]
    pub final_norm: bool,
    /// A sequence starts from `mem_len` zero vectors per layer instead of no memory: its first
    /// segment attends to them like to any memory (they add zero values but take softmax
    /// weight). HF's TransfoXL does this when called with `mems=None` (`init_mems`); set it
    /// for an imported model to score its first segment as HF does. Default: false.
    #[config(default = false)]
    pub zero_first_memory: bool,
    /// XL's `u`/`v` biases per layer instead of shared across layers. Default: false (shared).
    #[config(default = false)]
    pub untie_rel_bias: bool,
    /// Relative-attention layers (`xl`, `learned`, `t5`) get a value bias and an output bias
    /// (`RelativeAttentionConfig::value_output_bias`), as labml's attention has. Default: false.
    #[config(default = false)]
    pub value_output_bias: bool,
    /// Relative-attention layers' output projection has a bias (and their values none), as
    /// memorizing-transformers-pytorch's `Attention` (its kNN layer has none: kNN layers
    /// ignore this). Default: false.
    #[config(default = false)]
    pub attention_output_bias: bool,
    /// Key/value heads of relative and kNN layers, each shared by `n_heads / kv_heads` query
    /// heads; `Some(1)`: multi-query attention (Shazeer 2019; memorizing-transformers-pytorch).
    /// Default: none (a key and value per head).
    #[config(default = "None")]
    pub kv_heads: Option<usize>,
    /// Gradients reach the layers (their LayerNorm, `W_k`, `W_v`) through the XL memory's keys
    /// and values, which memzoo computes from the cached layer inputs in every segment. false:
    /// the memory's keys and values are constants, as in a model that caches them detached
    /// (memorizing-transformers-pytorch); the same forward pass at fixed weights (in training,
    /// memzoo projects the memory with the current weights, such a model kept the old
    /// projections). Default: true.
    #[config(default = true)]
    pub memory_gradients: bool,
    /// `t5` layers read one T5 table of the model, and `knn` layers another, instead of one
    /// each (memorizing-transformers-pytorch's `rel_pos_bias` and `knn_rel_pos_bias`); the
    /// layers' own tables are then unused. Default: false.
    #[config(default = false)]
    pub shared_t5: bool,
    /// The XL memory caches every layer's keys and values (detached, as computed when the
    /// segment was read; a kNN layer's keys normalised), `[batch, mlen, 2 kv_heads d_head]`
    /// per layer, instead of the layer inputs that each segment projects again (Dai et al.'s
    /// formulation, memzoo's default). With fixed weights the two are the same function
    /// (with `memory_gradients = false`, the same gradients too); in training the cached
    /// keys/values keep the projections of the step that computed them
    /// (memorizing-transformers-pytorch). Needs relative / kNN layers only, sequential
    /// residuals and no `zero_first_memory`. Default: false.
    #[config(default = false)]
    pub memory_keys_values: bool,
    /// Standard deviation of the normal initialiser, HF TransfoXL's `init_std` scheme: every
    /// weight matrix, the embedding (also the tied output layer), the `u`/`v` biases and the
    /// relative tables are drawn from N(0, init_std), LayerNorm gains from N(1, init_std), every
    /// bias is zero. Default: 0.02 (HF's and the paper's code).
    ///
    /// Measured faster (one seed, XL-small on tiny Shakespeare with the recipe of `cargo xtask
    /// bench quality`): `init_std = 0.03` with `embedding_std = Some(0.02)` reaches 3.42 / 3.07
    /// / 2.89 / 2.82 bpc at steps 100-400 against HF's 3.50 / 3.10 / 2.92 / 2.85 (0.04: 2.81 at
    /// 400); a larger *embedding* is slower (it strengthens the tied model's self-prediction).
    #[config(default = 0.02)]
    pub init_std: f64,
    /// Standard deviation of the embedding's normal initialiser, when it should differ from
    /// `init_std` (`None`: `init_std`, as HF). A larger one (e.g. `1/sqrt(d_model)`, unit-scale
    /// inputs after the `sqrt(d_model)` scale) makes a tied model predict its input token: its
    /// first loss is ~11 nats instead of ln 256 = 5.5, and a tied post-LN XL-small stalls at
    /// the unigram level. Default: none.
    #[config(default = "None")]
    pub embedding_std: Option<f64>,
    /// Standard deviation of the LayerNorm gains' normal initialiser around 1 (`None`:
    /// `init_std`, HF TransfoXL's scheme; `Some(0.0)`: gains start at exactly 1, as PyTorch's
    /// default and the Reformer). Default: none.
    #[config(default = "None")]
    pub norm_gain_std: Option<f64>,
    /// The attention kind of every layer, bottom to top (as x-transformers' `layers`), e.g.
    /// `["xl", "xl", "knn", "xl"]`; its length must be `n_layers`. Empty: `n_layers` layers of
    /// the `positions` scheme. Default: empty.
    #[config(default = "Vec::new()")]
    pub layers: Vec<LayerKind>,
    /// The kNN layers' retrieval and memory (unused without `knn` layers).
    #[config(default = "KnnLayerConfig::new()")]
    pub knn: KnnLayerConfig,
    /// The LSH and local layers' chunking and hashing (unused without them).
    #[config(default = "LshLayerConfig::new()")]
    pub lsh: LshLayerConfig,
    /// Where a batch row starts a new document, hide its XL memory and clear its kNN
    /// memories. Default: false (Transformer-XL reads the text as one stream, as the paper;
    /// the Memorizing Transformer sets it, as its paper does for documents).
    #[config(default = false)]
    pub document_resets: bool,
    /// How each layer arranges attention and feed-forward: one residual stream, or the
    /// Reformer's two reversible streams (needs `pre_ln` and `randomness = "seeded"`; see
    /// [`Residual`]). Default: sequential.
    #[config(default = "Residual::Sequential")]
    pub residual: Residual,
    /// The feed-forward's activation. Default: relu (Transformer-XL; the Reformer: gelu).
    #[config(default = "Activation::Relu")]
    pub ff_activation: Activation,
    /// Dropout between the feed-forward's two layers as well as after it (Transformer-XL);
    /// false: after it only (the Reformer). Default: true.
    #[config(default = true)]
    pub ff_inner_dropout: bool,
    /// Positions per feed-forward chunk: the feed-forward (position-wise) runs this many
    /// positions at a time, so its `d_inner` activation never exists for the whole segment
    /// (the Reformer's chunking); 0: all at once. Default: 0.
    #[config(default = 0)]
    pub ff_chunk_len: usize,
    /// Axial position embeddings added to the token embedding (the Reformer's); they index
    /// positions within a segment, so they need `mem_len = 0`. Default: none.
    #[config(default = "None")]
    pub axial: Option<AxialConfig>,
    /// Dropout on the final hidden states (Transformer-XL); the Reformer has none. Default:
    /// true.
    #[config(default = true)]
    pub final_dropout: bool,
    /// Where dropout masks and LSH rotations come from (see [`Randomness`]). Default: device.
    #[config(default = "Randomness::Device")]
    pub randomness: Randomness,
    /// With `randomness = "seeded"`: the base seed of training steps (step `n` draws from
    /// `mix(train_seed, n)`). Default: 1.
    #[config(default = 1)]
    pub train_seed: u64,
    /// What the head of a reversible stack reads: `(y_1 + y_2) / 2` or `cat(y_1, y_2)` (HF's
    /// Reformer; see [`HeadInput`]). Needs `residual = "reversible"` for `concat`. Default: mean.
    #[config(default = "HeadInput::Mean")]
    pub head_input: HeadInput,
}

impl XlConfig {
    /// XL-small, memzoo's reference for CPU-sized runs (= [`XlConfig::new`]): 6 layers,
    /// d_model 256, 8 heads x 32, d_inner 1024, mem_len 128, tied, post-LN, bytes; trained with
    /// `tgt_len` 128 (`cargo xtask bench quality`).
    pub fn small() -> Self {
        Self::new()
    }

    /// Transformer-XL's enwik8 base (Dai et al. 2019; the authors' PyTorch
    /// `run_enwik8_base.sh`): 12 layers, d_model 512, 8 heads x 64, d_inner 2048, dropout 0.1,
    /// dropatt 0, mem_len 512, `u`/`v` shared, tied output, post-LN, bytes. Their recipe:
    /// `tgt_len` 512 (evaluation 128), Adam lr 2.5e-4 with cosine decay, batch 22, 400k steps.
    pub fn enwik8_base() -> Self {
        Self::new()
            .with_n_layers(12)
            .with_d_model(512)
            .with_n_heads(8)
            .with_d_head(Some(64))
            .with_d_inner(2048)
            .with_dropout(0.1)
            .with_dropatt(0.0)
            .with_mem_len(512)
    }

    /// Transformer-XL's WikiText-103 base (the authors' `run_wt103_base.sh`): 16 layers,
    /// d_model 410, 10 heads x 41, d_inner 2100, dropout 0.1, dropatt 0, mem_len 150, the
    /// 267,735-word vocabulary, tied. Their recipe: `tgt_len` 150, Adam lr 2.5e-4 with cosine
    /// decay, batch 60, 200k steps. Adaptive input and softmax as theirs: cutoffs 20k / 40k /
    /// 200k, div_val 1 (one table of width 410, so no projections), tables tied, projections
    /// tied but the first's (`tie_projs` [false, true, true, true]).
    pub fn wt103_base() -> Self {
        Self::new()
            .with_vocab_size(267_735)
            .with_n_layers(16)
            .with_d_model(410)
            .with_n_heads(10)
            .with_d_head(Some(41))
            .with_d_inner(2100)
            .with_dropout(0.1)
            .with_dropatt(0.0)
            .with_mem_len(150)
            .with_cutoffs(vec![20_000, 40_000, 200_000])
            .with_div_val(1)
            .with_tie_projs(vec![false, true, true, true])
    }

    /// Whether the input embedding and the output are adaptive (`cutoffs`, `div_val > 1` or a
    /// `d_embed` other than `d_model`).
    pub fn is_adaptive(&self) -> bool {
        !self.cutoffs.is_empty() || self.div_val != 1 || self.embed_width() != self.d_model
    }

    /// The embedding's (first) table width: `d_embed`, else `d_model`.
    pub fn embed_width(&self) -> usize {
        self.d_embed.unwrap_or(self.d_model)
    }

    /// The adaptive input embedding of an adaptive stack: tables ~ N(0, embedding_std or
    /// init_std), projections ~ N(0, init_std / 2) (HF's `proj_init_std` 0.01 against its
    /// `init_std` 0.02).
    pub fn adaptive_embedding(&self) -> AdaptiveEmbeddingConfig {
        AdaptiveEmbeddingConfig::new(self.vocab_size, self.embed_width(), self.d_model)
            .with_cutoffs(self.cutoffs.clone())
            .with_div_val(self.div_val)
            .with_scale(self.scale_embedding)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: self.embedding_std.unwrap_or(self.init_std),
            })
            .with_proj_initializer(Initializer::Normal {
                mean: 0.0,
                std: self.init_std / 2.0,
            })
    }

    /// The adaptive log-softmax of an adaptive stack (initialised as the embedding).
    pub fn adaptive_softmax(&self) -> AdaptiveLogSoftmaxConfig {
        AdaptiveLogSoftmaxConfig::new(self.vocab_size, self.embed_width(), self.d_model)
            .with_cutoffs(self.cutoffs.clone())
            .with_div_val(self.div_val)
            .with_tie_weights(self.tie_weights)
            .with_tie_projs(self.tie_projs.clone())
            .with_initializer(self.initializer())
            .with_proj_initializer(Initializer::Normal {
                mean: 0.0,
                std: self.init_std / 2.0,
            })
    }

    /// The width of one head.
    pub fn head_width(&self) -> usize {
        self.d_head.unwrap_or(self.d_model / self.n_heads.max(1))
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("d_inner", self.d_inner),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        if self.d_head.is_none() && !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!(
                "d_model ({}) is not divisible by n_heads ({}); set d_head explicitly or change one",
                self.d_model, self.n_heads
            ));
        }
        if self.d_head == Some(0) {
            return bad("d_head must be positive, got 0".into());
        }
        if self.same_length && self.mem_len == 0 {
            return bad("same_length needs mem_len > 0 (every query sees mem_len keys)".into());
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return bad(format!("init_std must be positive, got {}", self.init_std));
        }
        if let Some(std) = self.embedding_std
            && !(std.is_finite() && std > 0.0)
        {
            return bad(format!("embedding_std must be positive, got {std}"));
        }
        if let Some(std) = self.norm_gain_std
            && !(std.is_finite() && std >= 0.0)
        {
            return bad(format!("norm_gain_std must be non-negative, got {std}"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon > 0.0) {
            return bad(format!(
                "layer_norm_epsilon must be positive, got {}",
                self.layer_norm_epsilon
            ));
        }
        if self.is_adaptive() {
            self.adaptive_embedding().validate()?;
            self.adaptive_softmax().validate()?;
        } else if self.tie_projs.iter().any(|&t| t) {
            return bad(format!(
                "tie_projs = {:?} ties projections, but the stack is not adaptive (no cutoffs, \
                 div_val 1, d_embed = d_model): there are none",
                self.tie_projs
            ));
        }
        if !self.layers.is_empty() && self.layers.len() != self.n_layers {
            return bad(format!(
                "layers lists {} kinds ({:?}) for n_layers = {}",
                self.layers.len(),
                self.layers,
                self.n_layers
            ));
        }
        let kinds = self.layer_kinds();
        let hashed: Vec<LayerKind> = [LayerKind::Lsh, LayerKind::Local]
            .into_iter()
            .filter(|k| kinds.contains(k))
            .collect();
        if let Some(kind) = hashed.first() {
            // LSH and local layers attend over cat(memory, x) as one causal sequence: they
            // cannot hide part of the memory per row or per query.
            if self.same_length {
                return bad(format!(
                    "same_length = true is not supported with {kind:?} layers (they see all of \
                     cat(memory, segment) causally): set it to false"
                ));
            }
            if self.document_resets {
                return bad(format!(
                    "document_resets = true is not supported with {kind:?} layers (they cannot \
                     hide a finished document's memory per row): set it to false"
                ));
            }
        }
        if self.memory_keys_values {
            let why = if kinds
                .iter()
                .any(|k| k.positions().is_none() && *k != LayerKind::Knn)
            {
                Some(format!(
                    "layers {kinds:?} include LSH / local ones, which cache no keys"
                ))
            } else if self.residual == Residual::Reversible {
                Some("residual = \"reversible\" caches the x_2 stream".into())
            } else if self.zero_first_memory {
                Some("zero_first_memory = true starts from zero layer inputs".into())
            } else {
                None
            };
            if let Some(why) = why {
                return bad(format!(
                    "memory_keys_values = true is not supported here: {why}; set it to false"
                ));
            }
        }
        if self.shared_t5
            && !kinds
                .iter()
                .any(|k| matches!(k, LayerKind::T5 | LayerKind::Knn))
        {
            return bad(format!(
                "shared_t5 = true, but no layer of {kinds:?} reads a T5 table (t5 or knn)"
            ));
        }
        if kinds.contains(&LayerKind::Knn) {
            if self.same_length {
                // kNN layers attend under a plain causal mask; accepting the flag would
                // silently train another model than asked for.
                return bad(
                    "same_length = true is not supported with knn layers (they attend under a \
                     plain causal mask): set it to false"
                        .into(),
                );
            }
            if kinds.iter().all(|&k| k == LayerKind::Knn) {
                return bad(format!(
                    "all {} layers are knn layers; at least one must be a relative-attention layer",
                    kinds.len()
                ));
            }
            let knn = &self.knn;
            if knn.top_k == 0 {
                return bad("knn.top_k must be positive, got 0".into());
            }
            if knn.top_k > knn.max_memories {
                return bad(format!(
                    "knn.top_k ({}) exceeds knn.max_memories ({})",
                    knn.top_k, knn.max_memories
                ));
            }
            self.knn_attention().validate()?;
            self.knn_memory().validate()?;
        }
        for kind in kinds.iter().filter_map(|k| k.positions()) {
            self.attention(kind).validate()?;
        }
        for kind in [LayerKind::Lsh, LayerKind::Local] {
            if kinds.contains(&kind) {
                self.reformer_attention(kind)
                    .validate()
                    .map_err(|e| XlError::Config(format!("{kind:?} layers: {e}")))?;
            }
        }
        if self.head_input == HeadInput::Concat
            && (self.residual != Residual::Reversible || self.is_adaptive() || self.tie_weights)
        {
            return bad(format!(
                "head_input = \"concat\" reads the two streams of residual = \"reversible\" into a \
                 linear output of 2 d_model inputs: it needs residual = \"reversible\" (got {:?}), \
                 tie_weights = false and no adaptive output",
                self.residual
            ));
        }
        if kinds.contains(&LayerKind::Absolute) {
            // Absolute positions index one segment: a memory's keys would repeat the
            // positions of the segment's (the reason Transformer-XL made them relative).
            if kinds.iter().any(|&k| k != LayerKind::Absolute) {
                return bad(format!(
                    "absolute layers add positions to the embeddings, which every layer then \
                     reads: all layers must be absolute, got {kinds:?}"
                ));
            }
            if self.mem_len > 0 {
                return bad(format!(
                    "absolute positions index the positions of one segment, so with mem_len = \
                     {} the memory's keys would share the positions of the segment's: set \
                     mem_len = 0 (the vanilla Transformer), or use relative positions",
                    self.mem_len
                ));
            }
            if self.axial.is_some() {
                return bad("absolute layers add sinusoidal positions already: drop axial".into());
            }
        }
        if let Some(axial) = &self.axial {
            let ([a1, a2], [d1, d2]) = (axial.shape, axial.dims);
            let widths_fit = if axial.summed {
                d1 == self.d_model && d2 == self.d_model
            } else {
                d1 + d2 == self.d_model
            };
            if a1 == 0 || a2 == 0 || d1 == 0 || d2 == 0 || !widths_fit {
                return bad(format!(
                    "axial shape {:?} must be positive and axial dims ({d1}, {d2}) positive and \
                     {} d_model {}",
                    axial.shape,
                    if axial.summed {
                        "(summed) each"
                    } else {
                        "sum to"
                    },
                    self.d_model
                ));
            }
            if let Some(std) = axial.std
                && !(std.is_finite() && std > 0.0)
            {
                return bad(format!("axial.std must be positive, got {std}"));
            }
            if self.mem_len > 0 {
                return bad(format!(
                    "axial positions index the positions of one segment, so with mem_len = {} \
                     the memory's keys would share the positions of the segment's: set \
                     mem_len = 0, or drop axial and take positions from relative layers",
                    self.mem_len
                ));
            }
        }
        if self.residual == Residual::Reversible {
            if !self.pre_ln {
                return bad(
                    "residual = \"reversible\" needs pre_ln = true: a LayerNorm after \
                            each residual sum (post-LN) cannot be inverted"
                        .into(),
                );
            }
            if self.randomness != Randomness::Seeded {
                return bad(
                    "residual = \"reversible\" needs randomness = \"seeded\": its \
                            backward replays each layer's dropout masks and LSH rotations"
                        .into(),
                );
            }
            if self.dropatt > 0.0
                && kinds
                    .iter()
                    .any(|k| !matches!(k, LayerKind::Lsh | LayerKind::Local))
            {
                return bad(format!(
                    "residual = \"reversible\" with {kinds:?} layers needs dropatt = 0 (got {}): \
                     relative and kNN attention draw their attention dropout from the device \
                     generator, which the reversible backward cannot replay",
                    self.dropatt
                ));
            }
        }
        Ok(())
    }

    /// LSH or local layers: the model's heads, `lsh` chunking, causal, the model's dropatt and
    /// initialiser.
    fn reformer_attention(&self, kind: LayerKind) -> ReformerAttentionConfig {
        let lsh = &self.lsh;
        let local = kind == LayerKind::Local;
        let pick =
            |own: Option<usize>, shared: usize| if local { own.unwrap_or(shared) } else { shared };
        ReformerAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_kind(match kind {
                LayerKind::Local => ReformerKind::Local,
                _ => ReformerKind::Lsh,
            })
            .with_chunk_len(pick(lsh.local_chunk_len, lsh.chunk_len))
            .with_n_rounds(lsh.n_rounds)
            .with_n_buckets(lsh.n_buckets)
            .with_n_chunks_before(pick(lsh.local_n_chunks_before, lsh.n_chunks_before))
            .with_n_chunks_after(pick(lsh.local_n_chunks_after, lsh.n_chunks_after))
            .with_causal(lsh.causal)
            .with_lsh_scores(lsh.scores)
            .with_dedup_rounds(lsh.dedup_rounds)
            .with_bucket_factors(lsh.bucket_factors.clone())
            .with_rotations_per_head(lsh.rotations_per_head)
            .with_key_eps(lsh.key_eps)
            .with_fixed_rotations(lsh.fixed_rotations)
            .with_output_bias(lsh.output_bias)
            .with_dropatt(self.dropatt)
            .with_initializer(self.initializer())
    }

    /// The kind of every layer, bottom to top (resolving an empty [`layers`](Self::layers)).
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        if self.layers.is_empty() {
            vec![LayerKind::of_positions(self.positions.kind); self.n_layers]
        } else {
            self.layers.clone()
        }
    }

    /// The model family of this stack, by its layers ([`LayerKind::family_of`]): what a model
    /// built from it reports as [`TransformerXl::stack_family`].
    pub fn family(&self) -> &'static str {
        LayerKind::family_of(&self.layer_kinds())
    }

    /// The configuration of every kNN layer's memory.
    pub fn knn_memory(&self) -> KnnMemoryConfig {
        KnnMemoryConfig::new(self.n_heads, self.head_width())
            .with_n_kv_heads(self.kv_heads)
            .with_when_full(self.knn.when_full)
            .with_max_memories(self.knn.max_memories)
            .with_kind(self.knn.index)
            .with_auto_crossover(self.knn.auto_crossover)
            .with_hnsw(self.knn.hnsw.clone())
    }

    /// kNN layers: T5 local attention (the model's `positions` when they are T5, else T5's
    /// defaults), the model's dropouts and initialiser.
    fn knn_attention(&self) -> KnnAttentionConfig {
        let positions = match self.positions.kind {
            PositionKind::T5 => self.positions.clone(),
            _ => PositionConfig::new().with_kind(PositionKind::T5),
        };
        KnnAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_positions(positions)
            .with_dropout(self.attention_dropout())
            .with_dropatt(self.dropatt)
            .with_attn_scale_init(self.knn.attn_scale_init)
            .with_mixing(self.knn.mixing)
            .with_n_kv_heads(self.kv_heads)
            .with_memory_gradients(self.memory_gradients)
            .with_memory_keys_values(self.memory_keys_values)
            .with_initializer(self.initializer())
    }

    fn initializer(&self) -> Initializer {
        Initializer::Normal {
            mean: 0.0,
            std: self.init_std,
        }
    }

    /// The dropout relative and kNN attention apply to their own output: the model's, except
    /// in seeded passes, where the block applies it with a replayable mask.
    fn attention_dropout(&self) -> f64 {
        match self.randomness {
            Randomness::Device => self.dropout,
            Randomness::Seeded => 0.0,
        }
    }

    /// Relative attention of `kind`, with the parameters of `positions` (clamp length, table
    /// size, buckets).
    fn attention(&self, kind: PositionKind) -> RelativeAttentionConfig {
        RelativeAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_positions(self.positions.clone().with_kind(kind))
            .with_dropout(self.attention_dropout())
            .with_dropatt(self.dropatt)
            .with_own_biases(self.untie_rel_bias)
            .with_value_output_bias(self.value_output_bias)
            .with_output_bias(self.attention_output_bias)
            .with_n_kv_heads(self.kv_heads)
            .with_memory_gradients(self.memory_gradients)
            .with_memory_keys_values(self.memory_keys_values)
            .with_initializer(self.initializer())
    }

    /// A linear layer with HF's initialisation: weight ~ N(0, init_std), bias 0.
    fn init_linear(&self, d_in: usize, d_out: usize, device: &Device) -> Linear {
        let mut linear = LinearConfig::new(d_in, d_out)
            .with_initializer(self.initializer())
            .init(device);
        linear.bias = linear
            .bias
            .map(|_| Initializer::Zeros.init([d_out], device));
        linear
    }

    /// A LayerNorm with HF's initialisation: gain ~ N(1, init_std), bias 0 (gain 1 with
    /// `norm_gain_std = Some(0.0)`).
    pub fn init_norm(&self, device: &Device) -> LayerNorm {
        self.init_norm_of(self.d_model, device)
    }

    /// [`init_norm`](Self::init_norm) of another width (the final norm of a `concat` head).
    fn init_norm_of(&self, width: usize, device: &Device) -> LayerNorm {
        let mut norm = LayerNormConfig::new(width)
            .with_epsilon(self.layer_norm_epsilon)
            .init(device);
        let std = self.norm_gain_std.unwrap_or(self.init_std);
        if std > 0.0 {
            norm.gamma = Initializer::Normal { mean: 1.0, std }.init([width], device);
        }
        norm
    }

    /// The width the final norm and the output read: `2 d_model` with a `concat` head.
    pub fn hidden_width(&self) -> usize {
        match self.head_input {
            HeadInput::Concat => 2 * self.d_model,
            HeadInput::Mean => self.d_model,
        }
    }

    /// The residual block (LayerNorms and feed-forward) of one layer, for any attention.
    pub fn init_block(&self, device: &Device) -> XlBlock {
        XlBlock {
            norm_attention: self.init_norm(device),
            ff_in: self.init_linear(self.d_model, self.d_inner, device),
            ff_out: self.init_linear(self.d_inner, self.d_model, device),
            norm_ff: self.init_norm(device),
            activation: self.ff_activation,
            dropout: DropoutConfig::new(self.dropout).init(),
            pre_ln: self.pre_ln,
            ff_inner_dropout: self.ff_inner_dropout,
            ff_chunk_len: self.ff_chunk_len,
            memory_gradients: self.memory_gradients,
            memory_keys_values: self.memory_keys_values,
            drops_attention: self.randomness == Randomness::Seeded,
        }
    }

    /// Validates the config and initialises the model.
    pub fn init(&self, device: &Device) -> Result<TransformerXl, XlError> {
        self.validate()?;
        let init = self.initializer();
        let kinds = self.layer_kinds();
        let layers = kinds
            .iter()
            .map(|&kind| {
                let attention = match (kind, kind.positions()) {
                    (_, Some(p)) => LayerAttention::Relative(self.attention(p).init(device)?),
                    (LayerKind::Knn, None) => {
                        let mut knn = self.knn_attention().init(device)?;
                        if self.knn.feed == KnnFeed::Evicted {
                            knn.set_evicted_feed(Some(self.mem_len));
                        }
                        LayerAttention::Knn(knn)
                    }
                    (_, None) => {
                        LayerAttention::Hashed(self.reformer_attention(kind).init(device)?)
                    }
                };
                Ok(XlLayer {
                    attention,
                    block: self.init_block(device),
                })
            })
            .collect::<Result<Vec<_>, XlError>>()?;
        let shares_biases = !self.untie_rel_bias && kinds.contains(&LayerKind::Xl);
        let (embedding, output) = if self.is_adaptive() {
            (
                InputEmbedding::Adaptive(self.adaptive_embedding().init(device)?),
                OutputLayer::Adaptive(self.adaptive_softmax().init(device)?),
            )
        } else {
            // Embeddings ~ N(0, init_std) as HF (see `embedding_std`).
            let embedding = EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: self.embedding_std.unwrap_or(self.init_std),
                })
                .init(device);
            let output = if self.tie_weights {
                OutputLayer::Tied(Initializer::Zeros.init([self.vocab_size], device))
            } else {
                OutputLayer::Linear(self.init_linear(self.hidden_width(), self.vocab_size, device))
            };
            (InputEmbedding::Plain(embedding), output)
        };
        let axial = match &self.axial {
            Some(a) => Some(
                AxialPositionalEmbeddingConfig::new(a.shape, a.dims)
                    .with_summed(a.summed)
                    .with_initializer(Initializer::Normal {
                        mean: 0.0,
                        std: a.std.unwrap_or(self.embedding_std.unwrap_or(self.init_std)),
                    })
                    .init(device)?,
            ),
            None => None,
        };
        Ok(TransformerXl {
            embedding,
            axial,
            layers,
            shared_biases: shares_biases
                .then(|| XlBiases::init(self.n_heads, self.head_width(), &init, device)),
            shared_t5: self.shared_t5.then(|| {
                let table = |kind: LayerKind, p: PositionConfig| {
                    kinds
                        .contains(&kind)
                        .then(|| init.init([p.table_len(), self.n_heads], device))
                };
                SharedT5 {
                    plain: table(
                        LayerKind::T5,
                        self.positions.clone().with_kind(PositionKind::T5),
                    ),
                    knn: table(LayerKind::Knn, self.knn_attention().positions),
                }
            }),
            final_norm: (self.pre_ln && self.final_norm)
                .then(|| self.init_norm_of(self.hidden_width(), device)),
            output,
            dropout: DropoutConfig::new(self.dropout).init(),
            knn_memory: self.knn_memory(),
            d_model: self.d_model,
            vocab_size: self.vocab_size,
            mem_len: self.mem_len,
            same_length: self.same_length,
            top_k: self.knn.top_k,
            document_resets: self.document_resets,
            lsh_seed: self.lsh.seed,
            scale: if self.scale_embedding {
                (self.d_model as f64).sqrt()
            } else {
                1.0
            },
            zero_first_memory: self.zero_first_memory,
            memory_keys_values: self.memory_keys_values,
            residual: self.residual,
            final_dropout: self.final_dropout,
            randomness: self.randomness,
            train_seed: self.train_seed,
            head_input: self.head_input,
            eval_rounds: None,
            steps: StepCounter::default(),
            dropout_seed: None,
        })
    }
}

/// The residual structure of a layer around any attention: LayerNorms and the position-wise
/// feed-forward (post-LN as Transformer-XL, or pre-LN), as one stream or, pre-LN, as the two
/// branches `F` ([`attention_branch`](Self::attention_branch)) and `G`
/// ([`ff_branch`](Self::ff_branch)) of a reversible layer.
///
/// Dropout: with `opts` (a seeded pass, [`Randomness::Seeded`]) every mask is drawn from the
/// pass's seed and replays exactly; without, Burn's `Dropout` draws them.
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct XlBlock {
    /// LayerNorm of the attention block.
    pub norm_attention: LayerNorm,
    /// Feed-forward `d_model -> d_inner`.
    pub ff_in: Linear,
    /// Feed-forward `d_inner -> d_model`.
    pub ff_out: Linear,
    /// LayerNorm of the feed-forward block.
    pub norm_ff: LayerNorm,
    /// The feed-forward's activation.
    #[module(skip)]
    pub activation: Activation,
    /// Dropout in the feed-forward (and, in seeded passes, on the attention's output).
    pub dropout: Dropout,
    /// Pre-LN instead of post-LN.
    pub pre_ln: bool,
    /// Dropout between the feed-forward's layers too.
    pub ff_inner_dropout: bool,
    /// Positions per feed-forward chunk (0: all).
    pub ff_chunk_len: usize,
    /// Gradients through the memory's LayerNorm (pre-LN; `XlConfig::memory_gradients`).
    #[module(skip)]
    pub memory_gradients: bool,
    /// The memory is cached keys/values, not normalised (`XlConfig::memory_keys_values`).
    #[module(skip)]
    pub memory_keys_values: bool,
    /// The block drops the attention's output in a pass with options (a seeded stack, whose
    /// relative and kNN attention have no output dropout of their own); `false` (a device
    /// stack): relative and kNN attention drop their own output, LSH and local none.
    #[module(skip)]
    pub drops_attention: bool,
}

/// The dropout masks of one feed-forward pass in a seeded pass, `[batch, len, width]` each.
#[derive(Clone, Debug, Default)]
pub struct FfMasks {
    /// After the activation (`d_inner` wide), when `ff_inner_dropout`.
    pub inner: Option<Tensor<3>>,
    /// On the output (`d_model` wide).
    pub outer: Option<Tensor<3>>,
}

impl FfMasks {
    /// The masks of positions `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        let cut = |m: &Option<Tensor<3>>| {
            m.clone().map(|m| {
                let b = m.dims()[0];
                m.slice([0..b, range.clone()])
            })
        };
        FfMasks {
            inner: cut(&self.inner),
            outer: cut(&self.outer),
        }
    }
}

impl XlBlock {
    /// Applies the block with `attend(x, memory)` as its attention (see the type docs).
    pub fn forward<E>(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        opts: Option<&ForwardOptions>,
        attend: impl FnOnce(Tensor<3>, Option<Tensor<3>>) -> Result<Tensor<3>, E>,
    ) -> Result<Tensor<3>, E> {
        if self.pre_ln {
            // h = x + F(x);  out = h + G(h)
            let h = x.clone() + self.attention_branch(x, memory, opts, attend)?;
            let g = self.ff_branch(h.clone(), opts);
            Ok(h + g)
        } else {
            // h = LN(x + Attn(cat(m, x)));  out = LN(h + FF(h))
            let a = self.drop_attention(attend(x.clone(), memory)?, opts);
            let h = self.norm_attention.forward(x + a);
            let f = self.feed_forward_with(h.clone(), opts);
            Ok(self.norm_ff.forward(h + f))
        }
    }

    /// `F(x) = Dropout(Attn(LN(x), LN(memory)))`, the attention branch of a pre-LN block.
    pub fn attention_branch<E>(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        opts: Option<&ForwardOptions>,
        attend: impl FnOnce(Tensor<3>, Option<Tensor<3>>) -> Result<Tensor<3>, E>,
    ) -> Result<Tensor<3>, E> {
        let norm = |t: Tensor<3>| self.norm_attention.forward(t);
        // Without memory gradients the memory is normalised with constant parameters.
        let memory = match memory {
            // Cached keys/values enter the attention as they are.
            Some(m) if self.memory_keys_values => Some(m),
            Some(m) if !self.memory_gradients => {
                Some(self.norm_attention.clone().no_grad().forward(m))
            }
            m => m.map(norm),
        };
        let a = attend(norm(x), memory)?;
        Ok(self.drop_attention(a, opts))
    }

    /// In a pass with options, the dropout on the attention's output where the block owns it
    /// ([`drops_attention`](Self::drops_attention); otherwise relative and kNN attention apply
    /// their own and LSH / local attention none).
    fn drop_attention(&self, a: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        match opts {
            Some(o) if self.drops_attention => seeded_dropout(a, self.dropout.prob, o, TAG_DROP_F),
            _ => a,
        }
    }

    /// `G(x) = FF(LN(x))`, the feed-forward branch of a pre-LN block.
    pub fn ff_branch(&self, x: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        self.feed_forward_with(self.norm_ff.forward(x), opts)
    }

    /// [`ff_branch`](Self::ff_branch) of some positions, with their slice of the pass's masks
    /// (`G` is position-wise, so this equals that slice of the whole).
    pub fn ff_branch_part(&self, x: Tensor<3>, masks: &FfMasks) -> Tensor<3> {
        self.ff_masked(self.norm_ff.forward(x), masks)
    }

    /// The feed-forward's dropout masks for activations of `shape` in a seeded pass.
    pub fn ff_masks(&self, shape: [usize; 3], opts: &ForwardOptions, device: &Device) -> FfMasks {
        let [b, l, _] = shape;
        let p = self.dropout.prob;
        let d_inner = self.ff_in.weight.dims()[1];
        FfMasks {
            inner: self
                .ff_inner_dropout
                .then(|| seeded_mask([b, l, d_inner], p, opts, TAG_DROP_FF_INNER, device))
                .flatten(),
            outer: seeded_mask(shape, p, opts, TAG_DROP_G, device),
        }
    }

    /// `FF(x) = Dropout(W_2 Dropout(act(W_1 x)))` (the inner dropout only with
    /// `ff_inner_dropout`), `ff_chunk_len` positions at a time; masks from Burn's `Dropout`.
    pub fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.feed_forward_with(x, None)
    }

    /// [`feed_forward`](Self::feed_forward), with seeded masks in a seeded pass.
    fn feed_forward_with(&self, x: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        match opts {
            Some(o) => {
                let masks = self.ff_masks(x.dims(), o, &x.device());
                chunked(x, self.ff_chunk_len, |c, r| {
                    self.ff_masked(c, &masks.slice(r))
                })
            }
            None => chunked(x, self.ff_chunk_len, |c, _| {
                let h = self.activate(linear_rows(&self.ff_in, c));
                let h = if self.ff_inner_dropout {
                    self.dropout.forward(h)
                } else {
                    h
                };
                self.dropout.forward(linear_rows(&self.ff_out, h))
            }),
        }
    }

    /// The feed-forward of a chunk with explicit masks.
    fn ff_masked(&self, x: Tensor<3>, masks: &FfMasks) -> Tensor<3> {
        let h = self.activate(linear_rows(&self.ff_in, x));
        let h = match &masks.inner {
            Some(m) => h * m.clone(),
            None => h,
        };
        let out = linear_rows(&self.ff_out, h);
        match &masks.outer {
            Some(m) => out * m.clone(),
            None => out,
        }
    }

    fn activate(&self, x: Tensor<3>) -> Tensor<3> {
        match self.activation {
            Activation::Relu => relu(x),
            Activation::Gelu => gelu(x),
        }
    }
}

/// The attention of one layer: relative (XL, learned or T5 positions) or kNN-augmented.
#[derive(Module, Debug)]
pub enum LayerAttention {
    /// Relative multi-head attention over `cat(memory, x)`.
    Relative(RelativeMultiHeadAttention),
    /// kNN-augmented attention: local attention plus the pairs retrieved from a kNN memory.
    Knn(KnnAttention),
    /// The Reformer's LSH or local attention over `cat(memory, x)`.
    Hashed(ReformerAttention),
}

impl LayerAttention {
    /// The layer's kind.
    pub fn kind(&self) -> LayerKind {
        match self {
            LayerAttention::Relative(a) => LayerKind::of_positions(a.positions.kind),
            LayerAttention::Knn(_) => LayerKind::Knn,
            LayerAttention::Hashed(a) => match a.kind {
                ReformerKind::Lsh => LayerKind::Lsh,
                ReformerKind::Local => LayerKind::Local,
            },
        }
    }

    /// The relative attention over `cat(memory, x)`: the layer itself, or a kNN layer's local
    /// attention (its projections are shared with the retrieval, Wu et al. sec. 3); `None`
    /// for LSH and local layers.
    pub fn relative(&self) -> Option<&RelativeMultiHeadAttention> {
        match self {
            LayerAttention::Relative(a) => Some(a),
            LayerAttention::Knn(a) => Some(&a.attention),
            LayerAttention::Hashed(_) => None,
        }
    }

    /// [`relative`](Self::relative), mutably (what an importer writes a checkpoint's weights
    /// into).
    pub fn relative_mut(&mut self) -> Option<&mut RelativeMultiHeadAttention> {
        match self {
            LayerAttention::Relative(a) => Some(a),
            LayerAttention::Knn(a) => Some(&mut a.attention),
            LayerAttention::Hashed(_) => None,
        }
    }

    /// [`relative`](Self::relative) of a layer known to have one.
    ///
    /// # Panics
    /// On an LSH or local layer.
    pub fn local(&self) -> &RelativeMultiHeadAttention {
        self.relative()
            .expect("an LSH or local layer has no relative attention")
    }

    /// The position scheme whose [`RelativeContext`] the layer reads (`None`: it reads none).
    fn positions(&self) -> Option<&PositionConfig> {
        self.relative().map(|a| &a.positions)
    }
}

/// One layer of the stack: its attention over `cat(memory, x)` inside an [`XlBlock`].
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct XlLayer {
    /// The attention.
    pub attention: LayerAttention,
    /// LayerNorms and feed-forward around it.
    pub block: XlBlock,
}

/// What a layer's attention drew in a pass, replayed by the reversible backward so that it
/// differentiates exactly the forward's function.
#[derive(Clone, Debug, Default)]
pub enum Replay {
    /// Nothing to replay (relative and local attention).
    #[default]
    Nothing,
    /// The LSH bucket ids, `[batch, heads, rounds, padded len]`: hashing the rebuilt input
    /// again could flip an argmax and attend to another set of keys.
    Buckets(Box<Tensor<4, Int>>),
    /// The pairs a kNN layer retrieved (its memory has moved on since).
    Retrieved(Box<Retrieved>),
}

impl XlLayer {
    /// What a key/value XL memory (`XlConfig::memory_keys_values`) caches of this layer for
    /// its input `h`: the keys and values its attention computes from it (pre-LN: from
    /// `LN(h)`), detached; `None` for LSH and local layers.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, 2 kv_heads d_head]`
    pub fn cache_entry(&self, h: Tensor<3>) -> Option<Tensor<3>> {
        let h = if self.block.pre_ln {
            self.block.norm_attention.forward(h)
        } else {
            h
        };
        match &self.attention {
            LayerAttention::Relative(a) => Some(a.cache_entry(h)),
            LayerAttention::Knn(a) => Some(a.cache_entry(h)),
            LayerAttention::Hashed(_) => None,
        }
    }

    /// Applies the layer (see [`LayerContext`] for what it reads besides `x` and `memory`); a
    /// kNN layer searches its kNN memory and then adds the segment's pairs to it.
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
    ) -> Result<Tensor<3>, XlError> {
        let opts = cx.opts.clone();
        self.block.forward(x, memory, opts.as_ref(), |x, m| {
            Ok(self.attend(x, m, &mut cx, Replay::Nothing)?.0)
        })
    }

    /// `F(x) = Dropout(Attn(LN(x), LN(memory)))` of a pre-LN layer, with what the attention
    /// drew; `replay` (from an earlier pass) is attended with instead of hashing or searching.
    pub fn f(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        cx: &mut LayerContext<'_>,
        replay: Replay,
    ) -> Result<(Tensor<3>, Replay), XlError> {
        let opts = cx.opts.clone();
        let mut drawn = Replay::Nothing;
        let f = self
            .block
            .attention_branch(x, memory, opts.as_ref(), |x, m| {
                let (a, r) = self.attend(x, m, cx, replay)?;
                drawn = r;
                Ok::<_, XlError>(a)
            })?;
        Ok((f, drawn))
    }

    /// `G(x) = FF(LN(x))` of a pre-LN layer (dropout from `opts` in a seeded pass).
    pub fn g(&self, x: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        self.block.ff_branch(x, opts)
    }

    /// One reversible layer, `(y_1, y_2) = (x_1 + F(x_2), x_2 + G(y_1))`, with what `F` drew
    /// (for [`reverse`](Self::reverse)). `memory`: the `x_2` stream of the previous segment.
    pub fn forward_reversible(
        &self,
        x1: Tensor<3>,
        x2: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
    ) -> Result<(Tensor<3>, Tensor<3>, Replay), XlError> {
        let opts = cx.opts.clone();
        reversible::couple(
            x1,
            x2,
            |x2| self.f(x2, memory, &mut cx, Replay::Nothing),
            |y1| self.g(y1, opts.as_ref()),
        )
    }

    /// The inverse of [`forward_reversible`](Self::forward_reversible) (no gradients),
    /// attending as the forward did through `replay`.
    pub fn inverse(
        &self,
        y1: Tensor<3>,
        y2: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
        replay: Replay,
    ) -> Result<(Tensor<3>, Tensor<3>), XlError> {
        let opts = cx.opts.clone();
        let mut err = None;
        let out = reversible::uncouple(
            y1,
            y2,
            |x2| match self.f(x2.clone(), memory, &mut cx, replay) {
                Ok((f, _)) => f,
                Err(e) => {
                    err = Some(e);
                    x2.zeros_like()
                }
            },
            |y1| self.g(y1, opts.as_ref()),
        );
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// One layer of the reversible backward ([`memzoo_reformer::reversible::reverse`]): from
    /// the outputs and their gradients (untracked), the inputs and theirs, handing every
    /// partial backward's gradients to `collect`. `self` lives on an autodiff device; `cx` and
    /// `replay` are the forward's (its seeded options, the buckets or pairs it drew).
    #[allow(clippy::too_many_arguments)]
    pub fn reverse(
        &self,
        y1: Tensor<3>,
        y2: Tensor<3>,
        dy1: Tensor<3>,
        dy2: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
        replay: Replay,
        collect: &mut impl FnMut(&mut burn::tensor::Gradients),
    ) -> Result<(Tensor<3>, Tensor<3>, Tensor<3>, Tensor<3>), XlError> {
        let opts = cx
            .opts
            .clone()
            .ok_or_else(|| XlError::Input("the reversible backward needs a seeded pass".into()))?;
        let masks = self.block.ff_masks(y1.dims(), &opts, &y1.device());
        reversible::reverse(
            y1,
            y2,
            dy1,
            dy2,
            self.block.ff_chunk_len,
            |x, range| self.block.ff_branch_part(x, &masks.slice(range)),
            |x2| Ok(self.f(x2, memory, &mut cx, replay)?.0),
            collect,
        )
    }

    /// The layer's attention alone over `cat(memory, x)` (inputs already normalised in a
    /// pre-LN block), and what it drew; `replay` (from an earlier pass) is used instead of
    /// hashing or searching again.
    fn attend(
        &self,
        x: Tensor<3>,
        m: Option<Tensor<3>>,
        cx: &mut LayerContext<'_>,
        replay: Replay,
    ) -> Result<(Tensor<3>, Replay), XlError> {
        let missing = |what: &str| {
            XlError::Input(format!("a {:?} layer needs {what}", self.attention.kind()))
        };
        match &self.attention {
            LayerAttention::Relative(a) => {
                let ctx = cx
                    .positions
                    .ok_or_else(|| missing("its position context"))?;
                let out = match cx.attention_dropout_seed().filter(|_| a.has_dropout()) {
                    Some(seed) => a
                        .clone()
                        .with_dropout_seed(Some(seed))
                        .forward(x, m, ctx, cx.shared)?,
                    None => a.forward(x, m, ctx, cx.shared)?,
                };
                Ok((out, Replay::Nothing))
            }
            LayerAttention::Knn(a) => {
                let seeded = cx
                    .attention_dropout_seed()
                    .filter(|_| a.attention.has_dropout())
                    .map(|seed| a.clone().with_dropout_seed(Some(seed)));
                let a = seeded.as_ref().unwrap_or(a);
                let ctx = cx
                    .positions
                    .ok_or_else(|| missing("its position context"))?;
                if let Replay::Retrieved(found) = replay {
                    let out = a.forward_retrieving(x, m, ctx, |_| Ok(*found))?;
                    return Ok((out.output, Replay::Retrieved(Box::new(out.retrieved))));
                }
                let (store, top_k) = cx.knn.as_mut().ok_or_else(|| {
                    missing("its kNN memory: read with forward_state and an XlState")
                })?;
                let evicted = a.evicted_feed().map(|mem_len| {
                    let klen = ctx.klen();
                    (klen.saturating_sub(mem_len), m.clone(), x.clone())
                });
                let out = a.forward(x, m, ctx, &**store, *top_k)?;
                match evicted {
                    // knn.feed = evicted: the first klen - mem_len of cat(memory, x).
                    Some((n, m, x)) if n > 0 => {
                        let (k, v) = a.leading_pairs(m, x, n);
                        store.add(k, v)?;
                    }
                    Some(_) => {}
                    None => store.add(out.keys, out.values)?,
                }
                Ok((out.output, Replay::Retrieved(Box::new(out.retrieved))))
            }
            LayerAttention::Hashed(a) => {
                // One causal sequence cat(m, x); the segment's rows of the output.
                let [_, qlen, _] = x.dims();
                let seq = match m {
                    Some(m) => Tensor::cat(vec![m, x], 1),
                    None => x,
                };
                let len = seq.dims()[1];
                let opts = match &cx.opts {
                    Some(o) if cx.randomness == Randomness::Seeded => o.child(TAG_ATTENTION),
                    _ => ForwardOptions {
                        seed: cx.seed,
                        train: seq.device().is_autodiff(),
                        n_rounds: None,
                    },
                };
                let buckets = match replay {
                    Replay::Buckets(b) => Some(*b),
                    _ => None,
                };
                let (out, used) = a.forward_recorded(seq, None, &opts, buckets);
                let replay = used.map_or(Replay::Nothing, |b| Replay::Buckets(Box::new(b)));
                Ok((out.narrow(1, len - qlen, qlen), replay))
            }
        }
    }
}

/// A position context of one forward pass: the scheme, the shared T5 table it carries
/// (`Some(knn)`, see `TransformerXl::shared_t5`; `None`: none) and the context.
type ContextEntry<'a> = (&'a PositionConfig, Option<bool>, RelativeContext);

/// The T5 tables shared across layers (`XlConfig::shared_t5`), `[num_buckets, n_heads]` each:
/// one read by every `t5` layer, one by every `knn` layer (memorizing-transformers-pytorch's
/// `rel_pos_bias` and `knn_rel_pos_bias`); `None` where the stack has no such layer.
#[derive(Module, Debug)]
pub struct SharedT5 {
    /// The `t5` layers' table.
    pub plain: Option<Param<Tensor<2>>>,
    /// The `knn` layers' table.
    pub knn: Option<Param<Tensor<2>>>,
}

impl SharedT5 {
    /// The kNN layers' table (`knn`) or the T5 layers'.
    pub fn table(&self, knn: bool) -> Option<&Param<Tensor<2>>> {
        if knn {
            self.knn.as_ref()
        } else {
            self.plain.as_ref()
        }
    }

    /// Sets both tables (a checkpoint's, on import): `plain` for the `t5` layers, `knn` for
    /// the `knn` layers.
    pub fn set_tables(&mut self, plain: Tensor<2>, knn: Tensor<2>) {
        self.plain = Some(Param::from_tensor(plain));
        self.knn = Some(Param::from_tensor(knn));
    }
}

/// What one layer reads besides its input and memory.
pub struct LayerContext<'a> {
    /// The position context of the layer's scheme (relative and kNN layers).
    pub positions: Option<&'a RelativeContext>,
    /// XL's `u`/`v` shared across layers (XL layers without their own).
    pub shared: Option<&'a XlBiases>,
    /// The layer's kNN memory and how many pairs to retrieve per query (kNN layers).
    pub knn: Option<(&'a mut (dyn KnnIndex + 'static), usize)>,
    /// Seed of the LSH rotations outside seeded passes (LSH layers).
    pub seed: u64,
    /// The layer's options in a pass with options: a seeded stack's training or evaluation
    /// pass ([`Randomness::Seeded`]: every dropout mask and LSH rotation), or a device stack's
    /// training pass with a dropout seed ([`TransformerXl::with_dropout_seed`]: its dropout
    /// masks); `None`: the device's randomness.
    pub opts: Option<ForwardOptions>,
    /// The stack's randomness: with [`Randomness::Device`], LSH layers keep their fixed
    /// rotations (`seed`) whatever `opts` say.
    pub randomness: Randomness,
}

impl LayerContext<'_> {
    /// The seed of a relative or kNN attention's own dropout masks in a pass with options
    /// (`None`: the device's generator draws them).
    pub fn attention_dropout_seed(&self) -> Option<u64> {
        self.opts
            .as_ref()
            .filter(|o| o.train)
            .map(|o| o.child(TAG_ATTENTION_DROPOUT).seed)
    }
}

/// The output of a [`TransformerXl`] forward pass.
#[derive(Debug, Clone)]
pub struct XlOutput {
    /// Final hidden states, `[batch, qlen, d_model]`.
    pub hidden: Tensor<3>,
    /// The memory to pass to the next segment (detached).
    pub memory: XlMemory,
}

/// The layer stack's language model: Transformer-XL, and with `knn` layers the Memorizing
/// Transformer.
///
/// `forward(tokens, memory)` reads one segment, attending over the memory of earlier segments,
/// and returns the next memory: recurrence is explicit, nothing is hidden in the module. A
/// stack with kNN layers reads with [`forward_state`](Self::forward_state), whose
/// [`XlState`] also holds the kNN memories.
///
/// # Shapes
/// - `tokens`: `[batch, qlen]`
/// - hidden: `[batch, qlen, d_model]`, logits: `[batch, qlen, vocab]`
#[derive(Module, Debug)]
pub struct TransformerXl {
    /// Token embedding: one table, or adaptive (scaled by `sqrt(d_model)` unless
    /// `scale_embedding` is off).
    pub embedding: InputEmbedding,
    /// Axial position embeddings added to the token embedding (the Reformer's).
    pub axial: Option<AxialPositionalEmbedding>,
    /// The layers, bottom to top.
    pub layers: Vec<XlLayer>,
    /// `u`, `v` shared by all XL layers (unless untied).
    pub shared_biases: Option<XlBiases>,
    /// T5 tables shared across layers (`XlConfig::shared_t5`); the layers' own tables are then
    /// unused.
    pub shared_t5: Option<SharedT5>,
    /// The XL memory caches keys/values (`XlConfig::memory_keys_values`).
    #[module(skip)]
    pub memory_keys_values: bool,
    /// Final LayerNorm (pre-LN with `final_norm` only).
    pub final_norm: Option<LayerNorm>,
    /// The output distribution: tied, a linear layer, or an adaptive log-softmax.
    pub output: OutputLayer,
    /// Dropout on embeddings and final output.
    pub dropout: Dropout,
    /// Configuration of every kNN layer's memory.
    #[module(skip)]
    pub knn_memory: KnnMemoryConfig,
    /// Model width.
    pub d_model: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Positions kept as memory after each segment.
    pub mem_len: usize,
    /// Every query sees exactly `mem_len` keys.
    pub same_length: bool,
    /// Pairs each kNN layer retrieves per query.
    pub top_k: usize,
    /// Rows starting a document hide their XL memory and clear their kNN memories.
    pub document_resets: bool,
    /// Seed of the LSH layers' rotations (layer `l` uses `lsh_seed + l`).
    pub lsh_seed: u64,
    /// Factor of a plain embedding (`sqrt(d_model)` or 1; an adaptive one applies its own).
    #[module(skip)]
    pub scale: f64,
    /// A sequence starts from `mem_len` zero vectors per layer (HF's `init_mems`).
    pub zero_first_memory: bool,
    /// One residual stream or two reversible ones.
    #[module(skip)]
    pub residual: Residual,
    /// Dropout on the final hidden states.
    pub final_dropout: bool,
    /// Device or seeded randomness.
    #[module(skip)]
    pub randomness: Randomness,
    /// Base seed of seeded training steps.
    #[module(skip)]
    pub train_seed: u64,
    /// What the head reads from a reversible stack's two streams.
    #[module(skip)]
    pub head_input: HeadInput,
    /// Hash rounds of every LSH layer in seeded evaluation passes (`None`: the configured
    /// `n_rounds`); see [`TransformerXl::with_eval_rounds`].
    #[module(skip)]
    pub eval_rounds: Option<usize>,
    /// Seeded training steps taken (each draws fresh rotations and masks).
    #[module(skip)]
    pub steps: StepCounter,
    /// A device stack's training passes draw their dropout masks from this seed instead of
    /// the device's generator ([`with_dropout_seed`](TransformerXl::with_dropout_seed)).
    #[module(skip)]
    pub dropout_seed: Option<u64>,
}

/// The input embedding of the stack.
///
/// # Shapes
/// - `tokens`: `[batch, len]` → `[batch, len, d_model]`
#[derive(Module, Debug)]
pub enum InputEmbedding {
    /// One `[vocab, d_model]` table.
    Plain(Embedding),
    /// Adaptive input embedding (Baevski & Auli 2019), its `sqrt(d_model)` scale inside.
    Adaptive(AdaptiveEmbedding),
}

impl InputEmbedding {
    /// The plain table, if the embedding is one.
    pub fn plain(&self) -> Option<&Embedding> {
        match self {
            InputEmbedding::Plain(e) => Some(e),
            InputEmbedding::Adaptive(_) => None,
        }
    }

    /// The adaptive embedding, if the embedding is one.
    pub fn adaptive(&self) -> Option<&AdaptiveEmbedding> {
        match self {
            InputEmbedding::Plain(_) => None,
            InputEmbedding::Adaptive(e) => Some(e),
        }
    }

    /// The device of the parameters.
    pub fn device(&self) -> Device {
        match self {
            InputEmbedding::Plain(e) => e.weight.val().device(),
            InputEmbedding::Adaptive(e) => e.tables()[0].val().device(),
        }
    }

    /// `s · E[tokens]` for a plain table (`scale` = `s`: `sqrt(d_model)` or 1); the adaptive
    /// embedding applies its own scale and ignores `scale`.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, len]` → `[batch, len, d_model]`
    pub fn embed(&self, tokens: Tensor<2, Int>, scale: f64) -> Tensor<3> {
        match self {
            InputEmbedding::Plain(e) => {
                let x = e.forward(tokens);
                if scale == 1.0 { x } else { x.mul_scalar(scale) }
            }
            InputEmbedding::Adaptive(e) => e.forward(tokens),
        }
    }
}

/// Sinusoidal absolute position encodings of positions `0..len` (Vaswani et al. 2017, sec.
/// 3.5: `PE(p, 2k) = sin(p / 10000^(2k/d))`, `PE(p, 2k+1) = cos(...)`, here laid out as the
/// XL sinusoid is, sines in the first half and cosines in the second).
///
/// # Shapes
/// - output: `[len, d_model]`
pub fn absolute_positions(len: usize, d_model: usize, device: &Device) -> Tensor<2> {
    let mut data = Vec::with_capacity(len * d_model);
    for p in 0..len {
        memzoo_relative::positions::sinusoid(p as i64, d_model, &mut data);
    }
    Tensor::from_data(TensorData::new(data, [len, d_model]), device)
}

/// The output distribution of the stack.
#[derive(Module, Debug)]
pub enum OutputLayer {
    /// Logits `h Eᵀ + b` against the plain embedding table; holds `b`, `[vocab]`.
    Tied(Param<Tensor<1>>),
    /// A separate linear layer `d_model -> vocab`.
    Linear(Linear),
    /// Projected adaptive log-softmax (Grave et al. 2017), its tied tables and projections
    /// read from the adaptive embedding.
    Adaptive(AdaptiveLogSoftmax),
}

impl TransformerXl {
    /// The same model with another memory length (e.g. longer for evaluation, as the paper).
    pub fn with_mem_len(mut self, mem_len: usize) -> Self {
        self.mem_len = mem_len;
        // kNN layers fed from the XL memory's evictions follow its length.
        for layer in self.layers.iter_mut() {
            if let LayerAttention::Knn(a) = &mut layer.attention
                && a.evicted_feed().is_some()
            {
                a.set_evicted_feed(Some(mem_len));
            }
        }
        self
    }

    /// Options of a seeded evaluation pass: rotations fixed by `lsh.seed`, no dropout (and
    /// [`with_eval_rounds`](Self::with_eval_rounds)'s hash rounds).
    pub fn eval_options(&self) -> ForwardOptions {
        let opts = ForwardOptions::eval(self.lsh_seed);
        match self.eval_rounds {
            Some(r) => opts.with_rounds(r),
            None => opts,
        }
    }

    /// The same model evaluated (seeded passes) with `n_rounds` hash rounds in every LSH layer
    /// (more rounds: fewer (query, key) pairs missed by the hashing; the Reformer paper
    /// evaluates a model trained with few rounds with more).
    pub fn with_eval_rounds(mut self, n_rounds: usize) -> Self {
        self.eval_rounds = Some(n_rounds);
        self
    }

    /// Options of the next seeded training step: a fresh seed (from `train_seed` and a step
    /// counter) for rotations and dropout masks.
    pub fn next_train_options(&self) -> ForwardOptions {
        ForwardOptions::train(mix(self.train_seed, self.steps.next()))
    }

    /// The same model with a step counter of its own at `count`: its next seeded training
    /// step draws from `mix(train_seed, count)` (see [`StepCounter`]).
    pub fn with_step_count(mut self, count: u64) -> Self {
        self.steps = StepCounter::at(count);
        self
    }

    /// The same model whose training passes, in a device stack ([`Randomness::Device`]), draw
    /// every dropout mask from `seed` instead of the device's generator (`None`: from the
    /// generator again): the masks of embeddings, attention (output and probabilities),
    /// feed-forward and final output, at the sites and rates the generator would have drawn
    /// them, each from `seed`, the layer and the site. A pass is then one function of its seed,
    /// whichever thread runs it and whatever was drawn before (replicas on threads, a resumed
    /// run). LSH layers keep their fixed rotations. A seeded stack ignores it (its step counter
    /// seeds it, [`with_step_count`](Self::with_step_count)).
    pub fn with_dropout_seed(mut self, seed: Option<u64>) -> Self {
        self.dropout_seed = seed;
        self
    }

    /// Options of the next training pass: a seeded stack's fresh ones
    /// ([`next_train_options`](Self::next_train_options)), a device stack's from its dropout
    /// seed ([`with_dropout_seed`](Self::with_dropout_seed)); `None`: the device's generator
    /// draws (a device stack without a dropout seed).
    pub fn train_options(&self) -> Option<ForwardOptions> {
        match self.randomness {
            Randomness::Seeded => Some(self.next_train_options()),
            Randomness::Device => self.dropout_seed.map(ForwardOptions::train),
        }
    }

    /// The kind of every layer, bottom to top.
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        self.layers.iter().map(|l| l.attention.kind()).collect()
    }

    /// The model family the stack is, by its layers (the label checkpoints carry): `memorizing`
    /// with kNN layers, `reformer` with LSH or local attention layers (and no kNN ones), `xl`
    /// otherwise. The randomness does not enter: an XL stack with `randomness = "seeded"` is
    /// still `xl`.
    pub fn stack_family(&self) -> &'static str {
        LayerKind::family_of(&self.layer_kinds())
    }

    /// The label checkpoints written before [`stack_family`](Self::stack_family) looked at the
    /// layers gave this stack: `memorizing` with kNN layers, else `reformer` with seeded
    /// randomness, else `xl`. Loading accepts it beside the current one, so older runs still
    /// resume and generate.
    pub fn legacy_family(&self) -> &'static str {
        if self.n_knn_layers() > 0 {
            "memorizing"
        } else if self.randomness == Randomness::Seeded {
            "reformer"
        } else {
            "xl"
        }
    }

    /// Number of kNN layers.
    pub fn n_knn_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.attention, LayerAttention::Knn(_)))
            .count()
    }

    /// The kNN attention of every kNN layer, bottom to top.
    pub fn knn_attentions(&self) -> impl Iterator<Item = &KnnAttention> {
        self.layers.iter().filter_map(|l| match &l.attention {
            LayerAttention::Knn(a) => Some(a),
            _ => None,
        })
    }

    /// The attention mask the model uses by default: causal, and with `same_length` a window
    /// of `mem_len` keys.
    pub fn default_mask(&self) -> AttentionMask {
        AttentionMask::Causal {
            window: self.same_length.then_some(self.mem_len),
        }
    }

    /// Empty kNN memories (one per kNN layer) for `batch` rows, and no XL memory.
    pub fn new_state(&self, batch: usize, device: &Device) -> Result<XlState, XlError> {
        let knn = (0..self.n_knn_layers())
            .map(|_| self.knn_memory.init(batch, device))
            .collect::<Result<_, _>>()?;
        Ok(XlState {
            xl: XlMemory::empty(),
            knn,
            xl_valid: Vec::new(),
        })
    }

    /// With `zero_first_memory`, the memory a sequence starts from when `memory` is empty:
    /// `mem_len` zero vectors per layer (HF's `init_mems`); `None` otherwise.
    fn first_memory(&self, memory: &XlMemory, batch: usize, device: &Device) -> Option<XlMemory> {
        (self.zero_first_memory && memory.is_empty() && self.mem_len > 0)
            .then(|| XlMemory::zeros(self.layers.len(), batch, self.mem_len, self.d_model, device))
    }

    /// Reads one segment with the model's default (causal) mask.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`; every `memory` layer `[batch, mlen, d_model]`
    pub fn forward(&self, tokens: Tensor<2, Int>, memory: &XlMemory) -> Result<XlOutput, XlError> {
        self.forward_masked(tokens, memory, &self.default_mask())
    }

    /// Reads one segment with an explicit mask over its `mlen + qlen` keys (a stack without
    /// kNN layers; see [`forward_state`](Self::forward_state) for those).
    pub fn forward_masked(
        &self,
        tokens: Tensor<2, Int>,
        memory: &XlMemory,
        mask: &AttentionMask,
    ) -> Result<XlOutput, XlError> {
        if self.n_knn_layers() > 0 {
            return Err(XlError::Input(format!(
                "this stack has kNN layers ({:?}): read it with forward_state and an XlState",
                self.layer_kinds()
            )));
        }
        let first = self.first_memory(memory, tokens.dims()[0], &tokens.device());
        let memory = first.as_ref().unwrap_or(memory);
        let opts = (self.randomness == Randomness::Seeded).then(|| self.eval_options());
        let (hidden, inputs) = self.run(tokens, memory, mask, &mut [], opts.as_ref())?;
        Ok(XlOutput {
            hidden,
            memory: memory.update(&inputs, self.mem_len),
        })
    }

    /// Reads one segment; returns the final hidden states and updates `state` (the XL memory
    /// and, in kNN layers, retrieval from and then addition to their kNN memories).
    /// `reset[b]`: row `b` starts a new document here (with `document_resets`: its kNN
    /// memories are cleared and its XL memory hidden). A seeded stack reads with its
    /// evaluation options ([`eval_options`](Self::eval_options): fixed rotations, no dropout).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`
    pub fn forward_state(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<3>, XlError> {
        let opts = (self.randomness == Randomness::Seeded).then(|| self.eval_options());
        self.forward_state_with(tokens, state, reset, opts.as_ref())
    }

    /// [`forward_state`](Self::forward_state) under explicit seeded options (`None`: the
    /// device's randomness), with a graph for plain autodiff.
    pub fn forward_state_with(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        let qlen = tokens.dims()[1];
        let mask = self.prepare(&tokens, state, reset)?;
        let (hidden, inputs) = self.run(tokens, &state.xl, &mask, &mut state.knn, opts)?;
        self.advance(state, &inputs, qlen);
        Ok(hidden)
    }

    /// Checks `state` against the segment, clears the rows that start a document, and returns
    /// the attention mask over `mlen + qlen` keys.
    fn prepare(
        &self,
        tokens: &Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<AttentionMask, XlError> {
        let [batch, qlen] = tokens.dims();
        let device = tokens.device();
        if reset.len() != batch {
            return Err(XlError::Input(format!(
                "reset has {} flags for a batch of {batch}",
                reset.len()
            )));
        }
        let n_knn = self.n_knn_layers();
        if state.knn.is_empty() && n_knn > 0 {
            state.knn = self.new_state(batch, &device)?.knn;
        }
        if state.knn.len() != n_knn {
            return Err(XlError::Input(format!(
                "state has {} kNN memories, the model {n_knn} kNN layers",
                state.knn.len()
            )));
        }
        if let Some(m) = state.knn.iter().find(|m| m.batch() != batch) {
            return Err(XlError::Input(format!(
                "kNN memory has {} rows, tokens have batch {batch}",
                m.batch()
            )));
        }
        if let Some(zeros) = self.first_memory(&state.xl, batch, &device) {
            state.xl = zeros;
        }
        let mlen = state.xl.len();
        Ok(if self.document_resets {
            let rows: Vec<usize> = (0..batch).filter(|&b| reset[b]).collect();
            for m in state.knn.iter_mut() {
                m.clear(&rows)?;
            }
            if state.xl_valid.len() != batch {
                state.xl_valid = vec![mlen; batch];
            }
            for (v, &r) in state.xl_valid.iter_mut().zip(reset) {
                if r {
                    *v = 0;
                }
            }
            document_mask(
                &state.xl_valid,
                qlen,
                mlen,
                self.same_length.then_some(self.mem_len),
                &device,
            )
        } else {
            self.default_mask()
        })
    }

    /// Moves the XL memory on past a segment of `qlen` whose layers read `inputs`.
    fn advance(&self, state: &mut XlState, inputs: &[Tensor<3>], qlen: usize) {
        state.xl = state.xl.update(inputs, self.mem_len);
        if self.document_resets {
            let new_mlen = state.xl.len();
            for v in state.xl_valid.iter_mut() {
                *v = (*v + qlen).min(new_mlen);
            }
        }
    }

    /// One position context per position scheme in use (most stacks use one), checked
    /// against the mask.
    fn contexts(
        &self,
        batch: usize,
        qlen: usize,
        mlen: usize,
        mask: &AttentionMask,
        device: &Device,
    ) -> Result<Vec<ContextEntry<'_>>, XlError> {
        let mut contexts: Vec<ContextEntry<'_>> = Vec::new();
        for (layer, p) in self
            .layers
            .iter()
            .filter_map(|l| Some((l, l.attention.positions()?)))
        {
            let key = self.shared_t5_key(layer, p);
            if !contexts.iter().any(|(q, k, _)| *q == p && *k == key) {
                let ctx = RelativeContext::new(p, self.d_model, qlen, mlen, mask, device);
                // With `shared_t5`: the model's table of this kind of layer.
                let ctx = match (key, &self.shared_t5) {
                    (Some(knn), Some(t)) => match t.table(knn) {
                        Some(table) => ctx.with_t5_table(table.val()),
                        None => ctx,
                    },
                    _ => ctx,
                };
                contexts.push((p, key, ctx));
            }
        }
        if let Some(m) = contexts.first().and_then(|(_, _, c)| c.mask.as_ref()) {
            let [mb, mq, mk] = m.dims();
            if (mb != 1 && mb != batch) || mq != qlen || mk != qlen + mlen {
                return Err(XlError::Input(format!(
                    "mask has shape [{mb}, {mq}, {mk}], expected [1 or {batch}, {qlen}, {}]",
                    qlen + mlen
                )));
            }
        }
        Ok(contexts)
    }

    /// Which shared T5 table a layer with positions `p` reads (`shared_t5`): `Some(true)` the
    /// kNN layers', `Some(false)` the T5 layers'; `None`: its own (no sharing, or not T5).
    fn shared_t5_key(&self, layer: &XlLayer, p: &PositionConfig) -> Option<bool> {
        (self.shared_t5.is_some() && p.kind == PositionKind::T5)
            .then_some(matches!(layer.attention, LayerAttention::Knn(_)))
    }

    /// What layer `l` reads besides its input: its position context, the shared biases, its
    /// kNN memory (`knn`) and its seeded options.
    fn layer_context<'a>(
        &'a self,
        l: usize,
        contexts: &'a [ContextEntry<'a>],
        knn: Option<&'a mut (dyn KnnIndex + 'static)>,
        opts: Option<&ForwardOptions>,
    ) -> LayerContext<'a> {
        let layer = &self.layers[l];
        let positions = layer
            .attention
            .positions()
            .and_then(|p| {
                let key = self.shared_t5_key(layer, p);
                contexts.iter().find(|(q, k, _)| *q == p && *k == key)
            })
            .map(|(_, _, ctx)| ctx);
        LayerContext {
            positions,
            shared: self.shared_biases.as_ref(),
            knn: knn.map(|s| (s, self.top_k)),
            seed: self.lsh_seed.wrapping_add(l as u64),
            opts: opts.map(|o| o.child(TAG_LAYER + l as u64)),
            randomness: self.randomness,
        }
    }

    /// `h_0`: the token embedding (times `sqrt(d_model)` unless off; adaptive:
    /// `Σ_i 1[t in cluster i] E_i P_i · sqrt(d_model)`), plus axial positions, with dropout.
    fn embed(
        &self,
        tokens: Tensor<2, Int>,
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        let qlen = tokens.dims()[1];
        let device = tokens.device();
        let mut h = self.embedding.embed(tokens, self.scale);
        if let Some(axial) = &self.axial {
            h = h + axial.forward(qlen)?;
        }
        if self.absolute_positions() {
            h = h + absolute_positions(qlen, self.d_model, &device).unsqueeze_dim::<3>(0);
        }
        Ok(match opts {
            Some(o) => seeded_dropout(h, self.dropout.prob, o, TAG_EMBED),
            None => self.dropout.forward(h),
        })
    }

    /// The head's input from the last layer's output(s): the final norm (where there is one)
    /// and dropout.
    fn finish(&self, h: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        let h = match &self.final_norm {
            Some(norm) => norm.forward(h),
            None => h,
        };
        if !self.final_dropout {
            return h;
        }
        match opts {
            Some(o) => seeded_dropout(h, self.dropout.prob, o, TAG_FINAL),
            None => self.dropout.forward(h),
        }
    }

    /// The layers over one segment: final hidden states (after the final norm and dropout)
    /// and every layer's memory material (its input; reversible: its `x_2` stream). `knn`:
    /// one memory per kNN layer.
    fn run(
        &self,
        tokens: Tensor<2, Int>,
        memory: &XlMemory,
        mask: &AttentionMask,
        knn: &mut [Box<dyn KnnIndex>],
        opts: Option<&ForwardOptions>,
    ) -> Result<(Tensor<3>, Vec<Tensor<3>>), XlError> {
        let [batch, qlen] = tokens.dims();
        self.check_memory(batch, memory)?;
        let device = tokens.device();
        let contexts = self.contexts(batch, qlen, memory.len(), mask, &device)?;
        let h = self.embed(tokens, opts)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut stores = knn.iter_mut();
        let mut next_store = |layer: &XlLayer| match layer.attention {
            LayerAttention::Knn(_) => stores
                .next()
                .map(|s| Some(s.as_mut()))
                .ok_or_else(|| XlError::Input("fewer kNN memories than kNN layers".into())),
            _ => Ok(None),
        };
        let h = match self.residual {
            Residual::Sequential => {
                let mut h = h;
                for (l, layer) in self.layers.iter().enumerate() {
                    // The layer's input, or its keys/values (`memory_keys_values`).
                    let cached = match self.memory_keys_values {
                        true => layer.cache_entry(h.clone()).ok_or_else(|| {
                            XlError::Input(format!("layer {l} caches no keys/values"))
                        })?,
                        false => h.clone(),
                    };
                    inputs.push(cached);
                    let cx = self.layer_context(l, &contexts, next_store(layer)?, opts);
                    h = layer.forward(h, memory.layer(l).cloned(), cx)?;
                }
                h
            }
            Residual::Reversible => {
                let (mut x1, mut x2) = (h.clone(), h);
                for (l, layer) in self.layers.iter().enumerate() {
                    inputs.push(x2.clone());
                    let cx = self.layer_context(l, &contexts, next_store(layer)?, opts);
                    let (y1, y2, _) =
                        layer.forward_reversible(x1, x2, memory.layer(l).cloned(), cx)?;
                    (x1, x2) = (y1, y2);
                }
                self.merge_streams(x1, x2)
            }
        };
        Ok((self.finish(h, opts), inputs))
    }

    /// The head's input from a reversible stack's streams: `(y_1 + y_2) / 2`, or
    /// `cat(y_1, y_2)` (`[batch, len, 2 d_model]`) with a `concat` head.
    fn merge_streams(&self, y1: Tensor<3>, y2: Tensor<3>) -> Tensor<3> {
        match self.head_input {
            HeadInput::Mean => (y1 + y2).mul_scalar(0.5),
            HeadInput::Concat => Tensor::cat(vec![y1, y2], 2),
        }
    }

    /// Whether the stack's layers are absolute ([`LayerKind::Absolute`]): its embeddings then
    /// carry sinusoidal positions of the segment.
    pub fn absolute_positions(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.attention.kind() == LayerKind::Absolute)
    }

    fn check_memory(&self, batch: usize, memory: &XlMemory) -> Result<(), XlError> {
        if memory.is_empty() {
            return Ok(());
        }
        if self.absolute_positions() {
            return Err(XlError::Input(format!(
                "a memory of {} positions reaches a stack with absolute positions, which index \
                 one segment (the memory's keys would share the segment's positions): read it \
                 with mem_len 0",
                memory.len()
            )));
        }
        if self.axial.is_some() {
            return Err(XlError::Input(format!(
                "a memory of {} positions reaches a stack with axial positions, which index one \
                 segment (the memory's keys would share the segment's positions): read it with \
                 mem_len 0",
                memory.len()
            )));
        }
        if memory.n_layers() != self.layers.len() {
            return Err(XlError::Input(format!(
                "memory has {} layers, the model {}",
                memory.n_layers(),
                self.layers.len()
            )));
        }
        let [mb, _, md] = memory.layer(0).expect("non-empty").dims();
        // Layer inputs, or cached keys/values of 2 kv heads x d_head.
        let width = match (self.memory_keys_values, self.layers[0].attention.relative()) {
            (true, Some(a)) => 2 * a.n_kv_heads * a.d_head,
            _ => self.d_model,
        };
        if mb != batch || md != width {
            return Err(XlError::Input(format!(
                "memory is [{mb}, _, {md}], tokens need [{batch}, _, {width}]"
            )));
        }
        Ok(())
    }

    /// Output logits from hidden states: `h Eᵀ + b` (tied) or a separate linear layer; for an
    /// adaptive output the full log-probabilities (which are their own logits:
    /// `log_softmax(log p) = log p`).
    ///
    /// # Shapes
    /// - `hidden`: `[batch, qlen, d_model]` → `[batch, qlen, vocab]`
    ///
    /// # Panics
    /// If `hidden` is not `d_model` wide, or the output is tied to an embedding it does not
    /// fit (a hand-assembled model; [`XlConfig::init`] and the importer build matching ones).
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        let [b, q, d] = hidden.dims();
        match (&self.output, &self.embedding) {
            (OutputLayer::Linear(output), _) => linear_rows(output, hidden),
            (OutputLayer::Tied(bias), InputEmbedding::Plain(embedding)) => {
                let w = embedding.weight.val(); // [vocab, d]
                let logits = hidden.reshape([b * q, d]).matmul(w.transpose());
                let logits = logits + bias.val().unsqueeze_dim(0);
                logits.reshape([b, q, self.vocab_size])
            }
            (OutputLayer::Adaptive(softmax), InputEmbedding::Adaptive(embedding)) => softmax
                .log_probs(hidden.reshape([b * q, d]), embedding)
                .expect("the adaptive softmax is built for its embedding and d_model")
                .reshape([b, q, self.vocab_size]),
            (OutputLayer::Tied(_), InputEmbedding::Adaptive(_))
            | (OutputLayer::Adaptive(_), InputEmbedding::Plain(_)) => {
                panic!("the output is tied to another kind of embedding")
            }
        }
    }

    /// The device of the parameters.
    pub fn device(&self) -> Device {
        self.embedding.device()
    }

    /// Mean next-token cross-entropy (nats) of one segment, and the next memory.
    ///
    /// # Shapes
    /// - `tokens`, `targets`: `[batch, qlen]`; loss: `[1]`
    pub fn forward_loss(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        memory: &XlMemory,
    ) -> Result<(Tensor<1>, XlMemory), XlError> {
        check_targets(&tokens, &targets)?;
        let out = self.forward(tokens, memory)?;
        Ok((self.loss(out.hidden, targets)?, out.memory))
    }

    /// Mean next-token cross-entropy (nats) of one segment read with
    /// [`forward_state`](Self::forward_state); updates `state`.
    ///
    /// # Shapes
    /// - `tokens`, `targets`: `[batch, qlen]`; loss: `[1]`
    pub fn forward_loss_state(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<1>, XlError> {
        check_targets(&tokens, &targets)?;
        let hidden = self.forward_state(tokens, state, reset)?;
        self.loss(hidden, targets)
    }

    /// Mean cross-entropy; an adaptive output computes each tail cluster only for the targets
    /// in it (`AdaptiveLogSoftmax::nll`), never the `[n, vocab]` log-probabilities.
    fn loss(&self, hidden: Tensor<3>, targets: Tensor<2, Int>) -> Result<Tensor<1>, XlError> {
        let device = targets.device();
        let [b, q] = targets.dims();
        if let (OutputLayer::Adaptive(softmax), InputEmbedding::Adaptive(embedding)) =
            (&self.output, &self.embedding)
        {
            let d = hidden.dims()[2];
            let nll = softmax.nll(
                hidden.reshape([b * q, d]),
                targets.reshape([b * q]),
                embedding,
            )?;
            return Ok(nll.mean());
        }
        let logits = self.logits(hidden).reshape([b * q, self.vocab_size]);
        Ok(CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets.reshape([b * q])))
    }
}

impl TransformerXl {
    /// Logits of one segment read on its own (no memory; seeded stacks: evaluation options),
    /// as the Reformer reads a window. For stacks with kNN layers use
    /// [`forward_state`](Self::forward_state).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, len]` → `[batch, len, vocab]`
    pub fn forward_window(&self, tokens: Tensor<2, Int>) -> Result<Tensor<3>, XlError> {
        let out = self.forward(tokens, &XlMemory::empty())?;
        Ok(self.logits(out.hidden))
    }

    /// Cross-entropy of one segment read on its own under explicit seeded options, with a
    /// graph (plain autodiff), weighted per position when `weights` are given.
    ///
    /// # Shapes
    /// - `tokens`, `targets`, `weights`: `[batch, len]`; loss: `[1]`
    pub fn forward_loss_with(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        weights: Option<Tensor<2>>,
        opts: &ForwardOptions,
    ) -> Result<Tensor<1>, XlError> {
        check_targets(&tokens, &targets)?;
        let batch = tokens.dims()[0];
        let mut state = self.new_state(batch, &tokens.device())?;
        let hidden =
            self.forward_state_with(tokens, &mut state, &vec![false; batch], Some(opts))?;
        Ok(weighted_nll(self.logits(hidden), targets, weights))
    }

    /// One seeded training step on a segment read on its own: loss and parameter gradients
    /// under `opts` (see [`train_step_state`](Self::train_step_state)).
    pub fn train_step_with(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        weights: Option<Tensor<2>>,
        opts: &ForwardOptions,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        let batch = tokens.dims()[0];
        let mut state = self.new_state(batch, &tokens.device())?;
        self.train_step_state(
            tokens,
            targets,
            weights,
            &mut state,
            &vec![false; batch],
            opts,
        )
    }

    /// [`train_step_with`](Self::train_step_with) with fresh options
    /// ([`next_train_options`](Self::next_train_options)).
    pub fn train_step(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        let opts = self.next_train_options();
        self.train_step_with(tokens, targets, None, &opts)
    }

    /// Loss and parameter gradients of one segment under seeded options `opts`, updating
    /// `state` as [`forward_state`](Self::forward_state) does; the loss is weighted per
    /// position when `weights` are given, and returned detached.
    ///
    /// A reversible stack runs its layers forward on a `valid()` copy (no graph), keeping only
    /// the top activations and what each layer drew (LSH buckets, retrieved kNN pairs), then
    /// walks back layer by layer ([`XlLayer::reverse`]), rebuilding each layer's inputs from
    /// its outputs: activation memory does not grow with depth (the replayed bucket ids do, by
    /// `batch x heads x rounds x len` integers per LSH layer). A sequential stack uses one
    /// `backward()`. The model must live on an autodiff device.
    ///
    /// # Shapes
    /// - `tokens`, `targets`, `weights`: `[batch, qlen]`
    #[allow(clippy::too_many_arguments)]
    pub fn train_step_state(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        weights: Option<Tensor<2>>,
        state: &mut XlState,
        reset: &[bool],
        opts: &ForwardOptions,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        if !self.device().is_autodiff() {
            return Err(XlError::Input(
                "train_step needs the model on an autodiff device (device.autodiff())".into(),
            ));
        }
        check_targets(&tokens, &targets)?;
        if let Some(w) = &weights
            && w.dims() != targets.dims()
        {
            return Err(XlError::Input(format!(
                "weights {:?} do not match targets {:?}",
                w.dims(),
                targets.dims()
            )));
        }
        if self.residual == Residual::Sequential {
            let hidden = self.forward_state_with(tokens, state, reset, Some(opts))?;
            let loss = weighted_nll(self.logits(hidden), targets, weights);
            let grads = GradientsParams::from_grads(loss.backward(), self);
            return Ok((loss.inner(), grads));
        }
        let [batch, qlen] = tokens.dims();
        let mask = self.prepare(&tokens, state, reset)?;
        self.check_memory(batch, &state.xl)?;
        let mlen = state.xl.len();
        let device = tokens.device();
        let mut acc = GradientsAccumulator::<TransformerXl>::new();
        let mut collect = |g: &mut burn::tensor::Gradients| {
            acc.accumulate(self, GradientsParams::from_module(g, self));
        };
        // 1. Embeddings with a (small) graph.
        let e = self.embed(tokens, Some(opts))?;
        // 2. The layers without a graph; only the top activations are kept, with each layer's
        //    memory material and what its attention drew.
        let valid = self.valid();
        let contexts = valid.contexts(batch, qlen, mlen, &mask, &device.clone().inner())?;
        let memory = |l: usize| state.xl.layer(l).cloned();
        let (mut y1, mut y2) = (e.clone().inner(), e.clone().inner());
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut replays = Vec::with_capacity(self.layers.len());
        let memories: Vec<Option<Tensor<3>>> = (0..self.layers.len())
            .map(|l| memory(l).map(|m| m.inner()))
            .collect();
        {
            let mut stores = state.knn.iter_mut();
            for (l, layer) in valid.layers.iter().enumerate() {
                inputs.push(y2.clone());
                let store = match layer.attention {
                    LayerAttention::Knn(_) => Some(
                        stores
                            .next()
                            .ok_or_else(|| {
                                XlError::Input("fewer kNN memories than kNN layers".into())
                            })?
                            .as_mut(),
                    ),
                    _ => None,
                };
                let cx = valid.layer_context(l, &contexts, store, Some(opts));
                let (a, b, replay) = layer.forward_reversible(y1, y2, memories[l].clone(), cx)?;
                (y1, y2) = (a.inner(), b.inner());
                replays.push(replay);
            }
        }
        drop(contexts);
        drop(valid);
        // 3. Head and loss on fresh leaves.
        let y1t = y1.clone().autodiff().require_grad();
        let y2t = y2.clone().autodiff().require_grad();
        let h = self.finish(self.merge_streams(y1t.clone(), y2t.clone()), Some(opts));
        let loss = weighted_nll(self.logits(h), targets, weights);
        let mut g = loss.clone().backward();
        let mut dy1 = y1t.grad(&g).expect("leaf requires grad").inner();
        let mut dy2 = y2t.grad(&g).expect("leaf requires grad").inner();
        collect(&mut g);
        // 4. Walk back through the layers, rebuilding inputs from outputs.
        let contexts = self.contexts(batch, qlen, mlen, &mask, &device)?;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let replay = replays.pop().unwrap_or_default();
            let cx = self.layer_context(l, &contexts, None, Some(opts));
            (y1, y2, dy1, dy2) = layer.reverse(
                y1,
                y2,
                dy1,
                dy2,
                memories[l].clone(),
                cx,
                replay,
                &mut collect,
            )?;
        }
        // 5. Into the embeddings.
        let mut g = (e * (dy1 + dy2)).sum().backward();
        collect(&mut g);
        self.advance(state, &inputs, qlen);
        Ok((loss.inner(), acc.grads()))
    }
}

/// Mean next-token cross-entropy from logits, weighted per position when `weights` are given:
/// `Σ_i w_i (-log p(y_i)) / Σ_i w_i`.
///
/// # Shapes
/// - `logits`: `[batch, len, vocab]`; `targets`, `weights`: `[batch, len]`
pub fn weighted_nll(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    weights: Option<Tensor<2>>,
) -> Tensor<1> {
    let [b, l, _] = logits.dims();
    let picked = log_softmax(logits, 2)
        .gather(2, targets.unsqueeze_dim::<3>(2))
        .reshape([b, l]);
    match weights {
        None => picked.mean().neg(),
        Some(w) => (picked * w.clone()).sum().neg() / w.sum().clamp_min(1e-9),
    }
}

fn check_targets(tokens: &Tensor<2, Int>, targets: &Tensor<2, Int>) -> Result<(), XlError> {
    if tokens.dims() != targets.dims() {
        return Err(XlError::Input(format!(
            "tokens {:?} and targets {:?} differ in shape",
            tokens.dims(),
            targets.dims()
        )));
    }
    Ok(())
}

/// The causal mask over `mlen + qlen` keys that also hides, per row, the XL memory positions
/// older than the row's document (`valid[b]` most recent ones are kept), and with a `window`
/// (`same_length`) every key but the `window` most recent of each query (`j > mlen + i - w`).
fn document_mask(
    valid: &[usize],
    qlen: usize,
    mlen: usize,
    window: Option<usize>,
    device: &Device,
) -> AttentionMask {
    if valid.iter().all(|&v| v >= mlen) {
        return AttentionMask::Causal { window };
    }
    let klen = qlen + mlen;
    let mut hidden = Vec::with_capacity(valid.len() * qlen * klen);
    for &v in valid {
        let first = mlen - v.min(mlen);
        for i in 0..qlen {
            hidden.extend(
                (0..klen).map(|j| {
                    j > mlen + i || j < first || window.is_some_and(|w| j + w <= mlen + i)
                }),
            );
        }
    }
    AttentionMask::Explicit(Tensor::<3, Bool>::from_data(
        TensorData::new(hidden, [valid.len(), qlen, klen]),
        device,
    ))
}
