//! [`XlConfig`]: the configuration of the layer stack, its papers' presets, and the configs it
//! derives for its parts.

use burn::config::Config;
use burn::nn::{
    DropoutConfig, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::Device;
use memzoo_knn::KnnAttentionConfig;
use memzoo_memory::KnnMemoryConfig;
use memzoo_reformer::{
    AttentionKind as ReformerKind, AxialPositionalEmbeddingConfig, LshConfig,
    ReformerAttentionConfig,
};
use memzoo_relative::{PositionConfig, PositionKind, RelativeAttentionConfig, XlBiases};

use super::*;
use crate::adaptive::{AdaptiveEmbeddingConfig, AdaptiveLogSoftmaxConfig};
use crate::error::XlError;

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
    /// Dropout on embeddings, attention output, feed-forward and final output (each site can be
    /// turned off: `embedding_dropout`, `attention_output_dropout`, `ff_inner_dropout`,
    /// `ff_output_dropout`, `final_dropout`). Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// In training on `flex`, the fused attention kernel keeps no attention probabilities for
    /// the backward pass and computes them again there: the same gradients in
    /// `4 · batch · n_heads · tgt_len · (mem_len + tgt_len)` bytes less per layer, for a second
    /// computation of the scores (see `RelativeAttentionConfig::recompute_probabilities`).
    /// Worth it for long memories. Needs `dropatt = 0` (an error otherwise); on other
    /// backends, which run attention as tensor ops, it changes nothing. Default: false.
    #[config(default = false)]
    pub recompute_attention: bool,
    /// Positions of earlier segments kept as memory (0: no recurrence). Default: 128.
    #[config(default = 128)]
    pub mem_len: usize,
    /// Training with varied memory lengths: each training step reads only the most recent
    /// `m` positions of the XL memory, `m` drawn per step from this list (from the step's
    /// seed, so a run replays and resumes exactly); the memory still keeps `mem_len`, and
    /// evaluation reads all of it (a length beyond `mem_len` reads the whole memory, so the
    /// same model evaluates with any `mem_len`). Empty: every step reads the whole memory.
    /// Sequential XL stacks only (not compressive, RMT, Block-Recurrent or reversible).
    /// Default: empty.
    #[config(default = "Vec::new()")]
    pub train_memory_lengths: Vec<usize>,
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
    /// softmax. Any cutoff makes input and output adaptive (see `memzoo_stack::adaptive`).
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
    /// The normalisation of every block and of the final norm: LayerNorm or RMSNorm (see
    /// [`NormKind`]; the Block-Recurrent layer's own norms stay LayerNorms). Default: layer.
    #[config(default = "NormKind::Layer")]
    pub norm: NormKind,
    /// Absolute layers add a learned table of this many positions (rows `0..len` for a
    /// segment of `len` tokens, `len <=` this) to the token embedding instead of sinusoids
    /// (recurrent-memory-transformer-pytorch's `pos_emb`, `seq_len` rows). Needs absolute
    /// layers. Default: none (sinusoids).
    #[config(default = "None")]
    pub learned_positions: Option<usize>,
    /// Epsilon of every LayerNorm (or RMSNorm). Default: 1e-5 (HF's `layer_norm_epsilon`).
    #[config(default = 1e-5)]
    pub layer_norm_epsilon: f64,
    /// XL's `u`/`v` biases per layer instead of shared across layers. Default: false (shared).
    #[config(default = false)]
    pub untie_rel_bias: bool,
    /// Key/value heads of relative and kNN layers, each shared by `n_heads / kv_heads` query
    /// heads; `Some(1)`: multi-query attention (Shazeer 2019; memorizing-transformers-pytorch).
    /// Default: none (a key and value per head).
    #[config(default = "None")]
    pub kv_heads: Option<usize>,
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
    /// The LSH and local layers' chunking and hashing (unused without them; each default is
    /// [`LshConfig`]'s).
    #[config(default = "LshConfig::new()")]
    pub lsh: LshConfig,
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
    /// Residual streams: 1, the one residual stream `h + f(h)`; `s > 1`, hyper-connections
    /// (Zhu et al. 2024; recurrent-memory-transformer-pytorch's `num_residual_streams`): `s`
    /// streams mixed into each branch's input and receiving its output by learned weights
    /// (see [`HyperConnection`]). Needs `pre_ln`, sequential residuals and `mem_len = 0`.
    /// Default: 1.
    #[config(default = 1)]
    pub residual_streams: usize,
    /// The feed-forward's activation. Default: relu (Transformer-XL; the Reformer: gelu).
    #[config(default = "Activation::Relu")]
    pub ff_activation: Activation,
    /// Dropout between the feed-forward's two layers as well as after it (Transformer-XL);
    /// false: after it only (the Reformer). Default: true.
    #[config(default = true)]
    pub ff_inner_dropout: bool,
    /// Dropout on the feed-forward's output, before the residual sum (Transformer-XL, the
    /// Reformer); false: only between its layers, with `ff_inner_dropout` (the lucidrains
    /// peers' `ff_dropout`). Default: true.
    #[config(default = true)]
    pub ff_output_dropout: bool,
    /// Dropout on each attention's output, before the residual sum (Transformer-XL,
    /// compressive-transformer-pytorch's `attn_layer_dropout`); false: none
    /// (recurrent-memory-transformer-pytorch). `dropatt` is separate. Default: true.
    #[config(default = true)]
    pub attention_output_dropout: bool,
    /// Dropout on the input embedding (with its positions) before the first layer
    /// (Transformer-XL); false: none (the lucidrains peers). Default: true.
    #[config(default = true)]
    pub embedding_dropout: bool,
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
    /// qk-RMSNorm in the Block-Recurrent layer or in every layer (see [`QkNormConfig`]).
    /// Default: none.
    #[config(default = "None")]
    pub qk_norm: Option<QkNormConfig>,
    /// Switches that reproduce a PyTorch peer's numerics (`[model.compat]`; see [`PeerCompat`]),
    /// set by `memzoo import`. Default: memzoo's own choices.
    #[config(default = "PeerCompat::new()")]
    pub compat: PeerCompat,
    /// The Compressive Transformer (Rae et al. 2019): a compressed memory per layer beside
    /// the XL memory (see [`CompressiveConfig`](crate::CompressiveConfig)). Default: none.
    #[config(default = "None")]
    pub compressive: Option<crate::compressive::CompressiveConfig>,
    /// The Recurrent Memory Transformer (Bulatov et al. 2022): memory tokens read before and
    /// written after every segment, carried to the next (see [`RmtConfig`](crate::RmtConfig)).
    /// Default: none.
    #[config(default = "None")]
    pub rmt: Option<crate::rmt::RmtConfig>,
    /// The Block-Recurrent Transformer (Hutchins et al. 2022): one recurrent layer carrying a
    /// state of `S` vectors from segment to segment (see
    /// [`BlockRecurrentConfig`](crate::BlockRecurrentConfig)). Default: none.
    #[config(default = "None")]
    pub block_recurrent: Option<crate::block_recurrent::BlockRecurrentConfig>,
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

    /// The fixed score scale of layer `l`'s qk-RMSNorm ([`QkNormConfig`]), where it has one:
    /// every layer with `all_layers`, else the Block-Recurrent recurrent layer.
    pub fn qk_norm_scale(&self, l: usize) -> Option<f64> {
        let q = self.qk_norm.as_ref()?;
        let recurrent = self.block_recurrent.as_ref().is_some_and(|r| r.layer == l);
        (q.all_layers || recurrent).then_some(q.scale)
    }

    /// The width of one head.
    pub fn head_width(&self) -> usize {
        self.d_head.unwrap_or(self.d_model / self.n_heads.max(1))
    }

    /// LSH or local layers: the model's heads, `lsh` (chunking, hashing, causal), the model's
    /// dropatt and initialiser.
    pub(crate) fn reformer_attention(&self, kind: LayerKind) -> ReformerAttentionConfig {
        ReformerAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_kind(match kind {
                LayerKind::Local => ReformerKind::Local,
                _ => ReformerKind::Lsh,
            })
            .with_lsh(self.lsh.clone())
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
        if self.compressive.is_some() {
            return "compressive";
        }
        if self.rmt.is_some() {
            return "rmt";
        }
        if self.block_recurrent.is_some() {
            return "block-recurrent";
        }
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
            .with_scoring(self.knn.scoring)
    }

    /// kNN layers: T5 local attention (the model's `positions` when they are T5, else T5's
    /// defaults), the model's dropouts and initialiser.
    pub(crate) fn knn_attention(&self) -> KnnAttentionConfig {
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
            .with_memory_gradients(self.compat.memory_gradients)
            .with_memory_keys_values(self.compat.memory_keys_values)
            .with_initializer(self.initializer())
    }

    pub(crate) fn initializer(&self) -> Initializer {
        Initializer::Normal {
            mean: 0.0,
            std: self.init_std,
        }
    }

    /// The dropout relative and kNN attention apply to their own output: the model's, except
    /// in seeded passes, where the block applies it with a replayable mask.
    pub(crate) fn attention_dropout(&self) -> f64 {
        match self.randomness {
            Randomness::Device if self.attention_output_dropout => self.dropout,
            Randomness::Device | Randomness::Seeded => 0.0,
        }
    }

    /// Relative attention of `kind`, with the parameters of `positions` (clamp length, table
    /// size, buckets).
    pub(crate) fn attention(&self, kind: PositionKind) -> RelativeAttentionConfig {
        RelativeAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_positions(self.positions.clone().with_kind(kind))
            .with_dropout(self.attention_dropout())
            .with_dropatt(self.dropatt)
            .with_own_biases(self.untie_rel_bias)
            .with_value_output_bias(self.compat.value_output_bias)
            .with_output_bias(self.compat.attention_output_bias)
            .with_n_kv_heads(self.kv_heads)
            .with_memory_gradients(self.compat.memory_gradients)
            .with_memory_keys_values(self.compat.memory_keys_values)
            .with_null_key_value(self.compat.null_key_value)
            .with_recompute_probabilities(self.recompute_attention)
            .with_initializer(self.initializer())
    }

    /// A linear layer with HF's initialisation: weight ~ N(0, init_std), bias 0.
    pub(crate) fn init_linear(&self, d_in: usize, d_out: usize, device: &Device) -> Linear {
        let mut linear = LinearConfig::new(d_in, d_out)
            .with_initializer(self.initializer())
            .init(device);
        linear.bias = linear
            .bias
            .map(|_| Initializer::Zeros.init([d_out], device));
        linear
    }

    /// A block's or the final norm ([`NormKind`]: LayerNorm or RMSNorm), `width` wide, with
    /// the gains of [`init_norm`](Self::init_norm).
    pub fn init_stack_norm(&self, width: usize, device: &Device) -> Norm {
        let std = self.norm_gain_std.unwrap_or(self.init_std);
        let gain = match std > 0.0 {
            true => Initializer::Normal { mean: 1.0, std },
            false => Initializer::Ones,
        };
        let mut norm = Norm::new(self.norm, width, self.layer_norm_epsilon, gain, device);
        if !self.compat.norm_bias {
            norm.beta = None;
        }
        norm
    }

    /// A LayerNorm with HF's initialisation: gain ~ N(1, init_std), bias 0 (gain 1 with
    /// `norm_gain_std = Some(0.0)`).
    pub fn init_norm(&self, device: &Device) -> LayerNorm {
        self.init_norm_of(self.d_model, device)
    }

    /// [`init_norm`](Self::init_norm) of another width (the final norm of a `concat` head).
    pub(crate) fn init_norm_of(&self, width: usize, device: &Device) -> LayerNorm {
        let mut norm = LayerNormConfig::new(width)
            .with_epsilon(self.layer_norm_epsilon)
            .with_bias(self.compat.norm_bias)
            .init(device);
        let std = self.norm_gain_std.unwrap_or(self.init_std);
        if std > 0.0 {
            norm.gamma = Initializer::Normal { mean: 1.0, std }.init([width], device);
        }
        norm
    }

    /// The width the final norm and the output read: `2 d_model` with a `concat` head.
    pub fn hidden_width(&self) -> usize {
        match self.compat.head_input {
            HeadInput::Concat => 2 * self.d_model,
            HeadInput::Mean => self.d_model,
        }
    }

    /// The residual block (LayerNorms and feed-forward) of one layer, for any attention.
    pub fn init_block(&self, device: &Device) -> XlBlock {
        // GEGLU's first layer yields the value and the gate, `d_inner` each.
        let ff_width = match self.ff_activation {
            Activation::Geglu => 2 * self.d_inner,
            _ => self.d_inner,
        };
        let linear = |d_in, d_out| {
            let mut l = self.init_linear(d_in, d_out, device);
            if !self.compat.ff_bias {
                l.bias = None;
            }
            l
        };
        XlBlock {
            norm_attention: self.init_stack_norm(self.d_model, device),
            ff_in: linear(self.d_model, ff_width),
            ff_out: linear(self.d_inner, self.d_model),
            norm_ff: self.init_stack_norm(self.d_model, device),
            // The attention branch reads stream 0 at first, the feed-forward stream 1.
            hyper_attention: (self.residual_streams > 1)
                .then(|| HyperConnection::new(self.residual_streams, self.d_model, 0, device)),
            hyper_ff: (self.residual_streams > 1)
                .then(|| HyperConnection::new(self.residual_streams, self.d_model, 1, device)),
            activation: self.ff_activation,
            dropout: DropoutConfig::new(self.dropout).init(),
            pre_ln: self.pre_ln,
            ff_inner_dropout: self.ff_inner_dropout,
            ff_output_dropout: self.ff_output_dropout,
            ff_chunk_len: self.ff_chunk_len,
            memory_gradients: self.compat.memory_gradients,
            memory_keys_values: self.compat.memory_keys_values,
            drops_attention: self.randomness == Randomness::Seeded && self.attention_output_dropout,
        }
    }

    /// Validates the config and initialises the model.
    pub fn init(&self, device: &Device) -> Result<TransformerXl, XlError> {
        self.validate()?;
        let init = self.initializer();
        let kinds = self.layer_kinds();
        let layers = kinds
            .iter()
            .enumerate()
            .map(|(l, &kind)| {
                let attention = match (kind, kind.positions()) {
                    // Value residuals: every layer but the first has a gate.
                    (_, Some(p)) => LayerAttention::Relative(
                        self.attention(p)
                            .with_value_gate(self.compat.value_residual && l > 0)
                            .with_qk_norm(self.qk_norm_scale(l))
                            .init(device)?,
                    ),
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
                let mut out = self.init_linear(self.hidden_width(), self.vocab_size, device);
                if !self.compat.output_bias {
                    out.bias = None;
                }
                OutputLayer::Linear(out)
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
            shared_t5: self.compat.shared_t5.then(|| {
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
            final_norm: (self.pre_ln && self.compat.final_norm)
                .then(|| self.init_stack_norm(self.hidden_width(), device)),
            position_embedding: self.learned_positions.map(|len| {
                EmbeddingConfig::new(len, self.d_model)
                    .with_initializer(Initializer::Normal {
                        mean: 0.0,
                        std: self.embedding_std.unwrap_or(self.init_std),
                    })
                    .init(device)
            }),
            embedding_gradient_scale: self.compat.embedding_gradient_scale,
            residual_streams: self.residual_streams,
            output,
            dropout: DropoutConfig::new(self.dropout).init(),
            knn_memory: self.knn_memory(),
            d_model: self.d_model,
            vocab_size: self.vocab_size,
            mem_len: self.mem_len,
            train_memory_lengths: self.train_memory_lengths.clone(),
            same_length: self.same_length,
            top_k: self.knn.top_k,
            document_resets: self.document_resets,
            lsh_seed: self.lsh.seed,
            scale: if self.scale_embedding {
                (self.d_model as f64).sqrt()
            } else {
                1.0
            },
            zero_first_memory: self.compat.zero_first_memory,
            memory_keys_values: self.compat.memory_keys_values,
            position_table: None,
            memory_holds_segment: false,
            residual: self.residual,
            final_dropout: self.final_dropout,
            embedding_dropout: self.embedding_dropout,
            randomness: self.randomness,
            train_seed: self.train_seed,
            head_input: self.compat.head_input,
            eval_rounds: None,
            steps: StepCounter::default(),
            dropout_seed: None,
            compressive: self
                .compressive
                .as_ref()
                .map(|c| c.init(self.n_layers, self.d_model, device)),
            rmt: self
                .rmt
                .as_ref()
                .map(|r| r.init(self.d_model, self.init_std, device)),
            block_recurrent: self.block_recurrent.as_ref().map(|r| r.init(self, device)),
        })
    }
}
