//! The layer stack: Transformer-XL (Dai et al. 2019) with any attention kind per layer.
//!
//! One embedding, a list of layers — each one attention kind ([`LayerKind`]: XL-relative,
//! learned-relative, T5, kNN) inside one residual block ([`XlBlock`]) — and one output.
//! Transformer-XL is the stack of `xl` layers; the Memorizing Transformer
//! (`memzoo_knn::MemorizingConfig`) is the same stack with `knn` layers at chosen depths.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig,
    Linear, LinearConfig, Relu,
};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_memory::{HnswConfig, IndexKind, KnnIndex, KnnMemoryConfig};
use memzoo_reformer::{
    AttentionKind as ReformerKind, ForwardOptions, ReformerAttention, ReformerAttentionConfig,
};
use memzoo_relative::{
    AttentionMask, KnnAttention, KnnAttentionConfig, PositionConfig, PositionKind,
    RelativeAttentionConfig, RelativeContext, RelativeMultiHeadAttention, XlBiases,
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
}

impl LayerKind {
    /// The relative position scheme of a relative kind (`None` for `knn`, `lsh`, `local`).
    pub fn positions(self) -> Option<PositionKind> {
        match self {
            LayerKind::Xl => Some(PositionKind::Xl),
            LayerKind::Learned => Some(PositionKind::Learned),
            LayerKind::T5 => Some(PositionKind::T5),
            LayerKind::Knn | LayerKind::Lsh | LayerKind::Local => None,
        }
    }

    /// The relative kind of a position scheme.
    pub fn of_positions(kind: PositionKind) -> Self {
        match kind {
            PositionKind::Xl => LayerKind::Xl,
            PositionKind::Learned => LayerKind::Learned,
            PositionKind::T5 => LayerKind::T5,
        }
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
    /// Seed of the LSH rotations. They are drawn once per (layer, seed) and kept, so that a
    /// stack is one function of its parameters (the Reformer draws fresh ones every step).
    /// Default: 0.
    #[config(default = 0)]
    pub seed: u64,
}

/// Settings of the stack's kNN layers (used where [`XlConfig::layers`] lists `knn`).
#[derive(Config, Debug)]
pub struct KnnLayerConfig {
    /// Retrieved pairs per query. Default: 32 (Wu et al. 2022).
    #[config(default = 32)]
    pub top_k: usize,
    /// kNN memories per (batch row, head), oldest evicted first. Default: 16,384.
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
        Ok(())
    }

    /// LSH or local layers: the model's heads, `lsh` chunking, causal, the model's dropatt and
    /// initialiser.
    fn reformer_attention(&self, kind: LayerKind) -> ReformerAttentionConfig {
        let lsh = &self.lsh;
        ReformerAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_kind(match kind {
                LayerKind::Local => ReformerKind::Local,
                _ => ReformerKind::Lsh,
            })
            .with_chunk_len(lsh.chunk_len)
            .with_n_rounds(lsh.n_rounds)
            .with_n_buckets(lsh.n_buckets)
            .with_n_chunks_before(lsh.n_chunks_before)
            .with_causal(true)
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

    /// The configuration of every kNN layer's memory.
    pub fn knn_memory(&self) -> KnnMemoryConfig {
        KnnMemoryConfig::new(self.n_heads, self.head_width())
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
            .with_dropout(self.dropout)
            .with_dropatt(self.dropatt)
            .with_attn_scale_init(self.knn.attn_scale_init)
            .with_initializer(self.initializer())
    }

    fn initializer(&self) -> Initializer {
        Initializer::Normal {
            mean: 0.0,
            std: self.init_std,
        }
    }

    /// Relative attention of `kind`, with the parameters of `positions` (clamp length, table
    /// size, buckets).
    fn attention(&self, kind: PositionKind) -> RelativeAttentionConfig {
        RelativeAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_positions(self.positions.clone().with_kind(kind))
            .with_dropout(self.dropout)
            .with_dropatt(self.dropatt)
            .with_own_biases(self.untie_rel_bias)
            .with_value_output_bias(self.value_output_bias)
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

    /// A LayerNorm with HF's initialisation: gain ~ N(1, init_std), bias 0.
    pub fn init_norm(&self, device: &Device) -> LayerNorm {
        let mut norm = LayerNormConfig::new(self.d_model)
            .with_epsilon(self.layer_norm_epsilon)
            .init(device);
        norm.gamma = Initializer::Normal {
            mean: 1.0,
            std: self.init_std,
        }
        .init([self.d_model], device);
        norm
    }

    /// The residual block (LayerNorms and feed-forward) of one layer, for any attention.
    pub fn init_block(&self, device: &Device) -> XlBlock {
        XlBlock {
            norm_attention: self.init_norm(device),
            ff_in: self.init_linear(self.d_model, self.d_inner, device),
            ff_out: self.init_linear(self.d_inner, self.d_model, device),
            norm_ff: self.init_norm(device),
            activation: Relu::new(),
            dropout: DropoutConfig::new(self.dropout).init(),
            pre_ln: self.pre_ln,
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
                        LayerAttention::Knn(self.knn_attention().init(device)?)
                    }
                    (_, None) => LayerAttention::Hashed(
                        self.reformer_attention(kind)
                            .init(device)
                            .map_err(|e| XlError::Config(e.to_string()))?,
                    ),
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
                OutputLayer::Linear(self.init_linear(self.d_model, self.vocab_size, device))
            };
            (InputEmbedding::Plain(embedding), output)
        };
        Ok(TransformerXl {
            embedding,
            layers,
            shared_biases: shares_biases
                .then(|| XlBiases::init(self.n_heads, self.head_width(), &init, device)),
            final_norm: (self.pre_ln && self.final_norm).then(|| self.init_norm(device)),
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
        })
    }
}

/// The residual structure of a layer around any attention: LayerNorms and the position-wise
/// feed-forward (post-LN as Transformer-XL, or pre-LN).
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
    /// ReLU of the feed-forward.
    pub activation: Relu,
    /// Dropout in the feed-forward.
    pub dropout: Dropout,
    /// Pre-LN instead of post-LN.
    pub pre_ln: bool,
}

impl XlBlock {
    /// Applies the block with `attend(x, memory)` as its attention (see the type docs).
    pub fn forward<E>(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        attend: impl FnOnce(Tensor<3>, Option<Tensor<3>>) -> Result<Tensor<3>, E>,
    ) -> Result<Tensor<3>, E> {
        if self.pre_ln {
            // h = x + Attn(LN(cat(m, x)));  out = h + FF(LN(h))
            let norm = |t: Tensor<3>| self.norm_attention.forward(t);
            let a = attend(norm(x.clone()), memory.map(norm))?;
            let h = x + a;
            let f = self.feed_forward(self.norm_ff.forward(h.clone()));
            Ok(h + f)
        } else {
            // h = LN(x + Attn(cat(m, x)));  out = LN(h + FF(h))
            let a = attend(x.clone(), memory)?;
            let h = self.norm_attention.forward(x + a);
            let f = self.feed_forward(h.clone());
            Ok(self.norm_ff.forward(h + f))
        }
    }

    /// `FF(x) = Dropout(W_2 Dropout(ReLU(W_1 x)))`
    pub fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self
            .dropout
            .forward(self.activation.forward(self.ff_in.forward(x)));
        self.dropout.forward(self.ff_out.forward(h))
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

impl XlLayer {
    /// Applies the layer (see [`LayerContext`] for what it reads besides `x` and `memory`); a
    /// kNN layer searches its kNN memory and then adds the segment's pairs to it.
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        cx: LayerContext<'_>,
    ) -> Result<Tensor<3>, XlError> {
        let LayerContext {
            positions,
            shared,
            knn,
            seed,
        } = cx;
        let missing = |what: &str| {
            XlError::Input(format!("a {:?} layer needs {what}", self.attention.kind()))
        };
        self.block.forward(x, memory, |x, m| match &self.attention {
            LayerAttention::Relative(a) => {
                let ctx = positions.ok_or_else(|| missing("its position context"))?;
                Ok(a.forward(x, m, ctx, shared)?)
            }
            LayerAttention::Knn(a) => {
                let ctx = positions.ok_or_else(|| missing("its position context"))?;
                let (store, top_k) = knn.ok_or_else(|| {
                    missing("its kNN memory: read with forward_state and an XlState")
                })?;
                Ok(a.forward_and_store(x, m, ctx, store, top_k)?)
            }
            LayerAttention::Hashed(a) => {
                // One causal sequence cat(m, x); the segment's rows of the output.
                let [_, qlen, _] = x.dims();
                let seq = match m {
                    Some(m) => Tensor::cat(vec![m, x], 1),
                    None => x,
                };
                let len = seq.dims()[1];
                let opts = ForwardOptions {
                    seed,
                    train: seq.device().is_autodiff(),
                    n_rounds: None,
                };
                Ok(a.forward(seq, None, &opts).narrow(1, len - qlen, qlen))
            }
        })
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
    /// Seed of the LSH rotations (LSH layers).
    pub seed: u64,
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
    /// The layers, bottom to top.
    pub layers: Vec<XlLayer>,
    /// `u`, `v` shared by all XL layers (unless untied).
    pub shared_biases: Option<XlBiases>,
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
        self
    }

    /// The kind of every layer, bottom to top.
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        self.layers.iter().map(|l| l.attention.kind()).collect()
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
        let (hidden, inputs) = self.run(tokens, memory, mask, &mut [])?;
        Ok(XlOutput {
            hidden,
            memory: memory.update(&inputs, self.mem_len),
        })
    }

    /// Reads one segment; returns the final hidden states and updates `state` (the XL memory
    /// and, in kNN layers, retrieval from and then addition to their kNN memories).
    /// `reset[b]`: row `b` starts a new document here (with `document_resets`: its kNN
    /// memories are cleared and its XL memory hidden).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`
    pub fn forward_state(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<3>, XlError> {
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
        let mask = if self.document_resets {
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
            document_mask(&state.xl_valid, qlen, mlen, &device)
        } else {
            self.default_mask()
        };
        let (hidden, inputs) = self.run(tokens, &state.xl, &mask, &mut state.knn)?;
        state.xl = state.xl.update(&inputs, self.mem_len);
        if self.document_resets {
            let new_mlen = state.xl.len();
            for v in state.xl_valid.iter_mut() {
                *v = (*v + qlen).min(new_mlen);
            }
        }
        Ok(hidden)
    }

    /// The layers over one segment: final hidden states (after the final norm and dropout)
    /// and every layer's input (the next memory's material). `knn`: one memory per kNN layer.
    fn run(
        &self,
        tokens: Tensor<2, Int>,
        memory: &XlMemory,
        mask: &AttentionMask,
        knn: &mut [Box<dyn KnnIndex>],
    ) -> Result<(Tensor<3>, Vec<Tensor<3>>), XlError> {
        let [batch, qlen] = tokens.dims();
        self.check_memory(batch, memory)?;
        let mlen = memory.len();
        let device = tokens.device();
        // One context per position scheme in use (most stacks use one).
        let mut contexts: Vec<(&PositionConfig, RelativeContext)> = Vec::new();
        for p in self.layers.iter().filter_map(|l| l.attention.positions()) {
            if !contexts.iter().any(|(q, _)| *q == p) {
                let ctx = RelativeContext::new(p, self.d_model, qlen, mlen, mask, &device);
                contexts.push((p, ctx));
            }
        }
        if let Some(m) = contexts.first().and_then(|(_, c)| c.mask.as_ref()) {
            let [mb, mq, mk] = m.dims();
            if (mb != 1 && mb != batch) || mq != qlen || mk != qlen + mlen {
                return Err(XlError::Input(format!(
                    "mask has shape [{mb}, {mq}, {mk}], expected [1 or {batch}, {qlen}, {}]",
                    qlen + mlen
                )));
            }
        }

        // h_0 = Dropout(E[tokens] * sqrt(d_model)) (adaptive: Σ_i 1[t in cluster i] E_i P_i · sqrt(d_model))
        let mut h = self
            .dropout
            .forward(self.embedding.embed(tokens, self.scale));
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut stores = knn.iter_mut();
        for (l, layer) in self.layers.iter().enumerate() {
            inputs.push(h.clone());
            let mem = memory.layer(l).cloned();
            let positions = layer
                .attention
                .positions()
                .and_then(|p| contexts.iter().find(|(q, _)| *q == p))
                .map(|(_, ctx)| ctx);
            let knn = match layer.attention {
                LayerAttention::Knn(_) => {
                    let store = stores.next().ok_or_else(|| {
                        XlError::Input("fewer kNN memories than kNN layers".into())
                    })?;
                    Some((store.as_mut(), self.top_k))
                }
                _ => None,
            };
            let cx = LayerContext {
                positions,
                shared: self.shared_biases.as_ref(),
                knn,
                seed: self.lsh_seed.wrapping_add(l as u64),
            };
            h = layer.forward(h, mem, cx)?;
        }
        if let Some(norm) = &self.final_norm {
            h = norm.forward(h);
        }
        Ok((self.dropout.forward(h), inputs))
    }

    fn check_memory(&self, batch: usize, memory: &XlMemory) -> Result<(), XlError> {
        if memory.is_empty() {
            return Ok(());
        }
        if memory.n_layers() != self.layers.len() {
            return Err(XlError::Input(format!(
                "memory has {} layers, the model {}",
                memory.n_layers(),
                self.layers.len()
            )));
        }
        let [mb, _, md] = memory.layer(0).expect("non-empty").dims();
        if mb != batch || md != self.d_model {
            return Err(XlError::Input(format!(
                "memory is [{mb}, _, {md}], tokens need [{batch}, _, {}]",
                self.d_model
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
            (OutputLayer::Linear(output), _) => output.forward(hidden),
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
/// older than the row's document (`valid[b]` most recent ones are kept).
fn document_mask(valid: &[usize], qlen: usize, mlen: usize, device: &Device) -> AttentionMask {
    if valid.iter().all(|&v| v >= mlen) {
        return AttentionMask::causal();
    }
    let klen = qlen + mlen;
    let mut hidden = Vec::with_capacity(valid.len() * qlen * klen);
    for &v in valid {
        let first = mlen - v.min(mlen);
        for i in 0..qlen {
            hidden.extend((0..klen).map(|j| j > mlen + i || j < first));
        }
    }
    AttentionMask::Explicit(Tensor::<3, Bool>::from_data(
        TensorData::new(hidden, [valid.len(), qlen, klen]),
        device,
    ))
}
