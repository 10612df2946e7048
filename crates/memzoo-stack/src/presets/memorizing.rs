//! The Memorizing Transformer (Wu et al., ICLR 2022) as a preset of the layer stack
//! ([`TransformerXl`]): Transformer-XL layers with kNN-augmented attention
//! (`memzoo_knn::KnnAttention`, [`LayerKind::Knn`]) at chosen depths, and the reference models
//! of the long-range recall comparison ([`recall_reference`]).

use burn::config::Config;
use burn::tensor::Device;
use memzoo_memory::{IndexKind, KnnMemoryConfig};
use memzoo_relative::{PositionConfig, PositionKind};

use crate::error::XlError;
use crate::memory::XlState;
use crate::stack::{KnnLayerConfig, LayerKind, TransformerXl, XlConfig};

/// Configuration of a [`MemorizingTransformer`]. Defaults: Memorizing-small (6 layers,
/// d_model 256, 8 heads x 32, T5 relative positions, XL memory 512, the kNN layer 4th of 6,
/// top-32 over 16,384 memories per row).
#[derive(Config, Debug)]
pub struct MemorizingConfig {
    /// The XL backbone: `n_layers` counts every layer, kNN ones included; `mem_len` is the
    /// XL memory. Default: XL-small with T5 positions, `mem_len` 512, pre-LN residual blocks
    /// and an untied output layer, as the reference implementation
    /// (memorizing-transformers-pytorch; the paper's decoder is pre-LN too), and weights and
    /// embedding drawn from N(0, 0.05): the scale of PyTorch's default initialisation that the
    /// reference keeps (kaiming-uniform, std `1/sqrt(3 fan_in)` = 0.051 at a fan-in of 128).
    /// With HF's 0.02 the model learnt more slowly at first (`cargo xtask bench quality`:
    /// 4.18 bpc at step 50 against the reference's 4.00; 3.99 with 0.05, and level or ahead at
    /// every later step).
    #[config(
        default = "XlConfig::new().with_positions(PositionConfig::new().with_kind(PositionKind::T5)).with_mem_len(512).with_pre_ln(true).with_tie_weights(false).with_init_std(0.05)"
    )]
    pub xl: XlConfig,
    /// 0-based depths of the kNN layers (the paper: the 9th of 12, i.e. `[8]`). Empty: plain
    /// XL with the same layers. Default: `[3]` (the 4th of 6).
    #[config(default = "vec![3]")]
    pub knn_layers: Vec<usize>,
    /// The kNN layers' retrieval and memory (the stack's `knn`; each default is
    /// [`KnnLayerConfig`]'s: top-32, as the paper, over 16,384 memories per row and head).
    #[config(default = "KnnLayerConfig::new()")]
    pub knn: KnnLayerConfig,
    /// Keep the XL memory (segment recurrence); false: `mem_len` 0. Default: true.
    #[config(default = true)]
    pub xl_memory: bool,
}

impl MemorizingConfig {
    /// Memorizing-small, memzoo's reference for CPU-sized runs (= [`MemorizingConfig::new`]).
    pub fn small() -> Self {
        Self::new()
    }

    /// The configuration of Wu et al. 2022 (sec. 4): a 12-layer decoder, embedding 1024, 8
    /// heads of 128, feed-forward 4096, T5 relative positions, XL cache 512, the kNN layer 9th
    /// of 12, top-32 over 65,536 memories per head, a 32K sentencepiece vocabulary (memzoo's
    /// byte tokenizer needs `vocab_size` 256 instead). Their recipe: segments of 512 tokens.
    pub fn paper() -> Self {
        Self::new()
            .with_xl(super::meliad_decoder(Self::new().xl))
            .with_knn_layers(vec![8])
            .with_knn(
                KnnLayerConfig::new()
                    .with_top_k(32)
                    .with_max_memories(65_536),
            )
    }

    /// The layer stack this preset stands for: `xl` with `knn` layers at `knn_layers` (the
    /// other layers keep the `xl.positions` scheme), document resets on, and `mem_len` 0
    /// without `xl_memory`.
    pub fn stack(&self) -> XlConfig {
        let base = LayerKind::of_positions(self.xl.positions.kind);
        let layers = (0..self.xl.n_layers)
            .map(|l| {
                if self.knn_layers.contains(&l) {
                    LayerKind::Knn
                } else {
                    base
                }
            })
            .collect();
        let mem_len = if self.xl_memory { self.xl.mem_len } else { 0 };
        self.xl
            .clone()
            .with_layers(layers)
            .with_mem_len(mem_len)
            .with_document_resets(true)
            .with_knn(self.knn.clone())
    }

    /// The configuration of every kNN layer's memory.
    pub fn memory(&self) -> KnnMemoryConfig {
        self.stack().knn_memory()
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), XlError> {
        if !self.xl.layers.is_empty() {
            return Err(XlError::Config(format!(
                "xl.layers ({:?}) is set by the preset from knn_layers: leave it empty, or \
                 describe the whole stack in the stack config's layers",
                self.xl.layers
            )));
        }
        if self.xl.same_length {
            // Every layer (the kNN one's local attention too) attends under a plain causal
            // mask; accepting the flag would silently train another model than asked for.
            return Err(XlError::Config(
                "xl.same_length = true is not supported by the Memorizing Transformer (its \
                 layers use a plain causal mask): set it to false"
                    .into(),
            ));
        }
        let n = self.xl.n_layers;
        let mut seen = vec![false; n];
        for &l in &self.knn_layers {
            if l >= n {
                return Err(XlError::Config(format!(
                    "knn_layers contains {l}, but there are only {n} layers (0-based)"
                )));
            }
            if std::mem::replace(&mut seen[l], true) {
                return Err(XlError::Config(format!("knn_layers lists layer {l} twice")));
            }
        }
        if self.knn_layers.len() == n {
            return Err(XlError::Config(format!(
                "all {n} layers are kNN layers; at least one must be a plain XL layer"
            )));
        }
        self.stack().validate()?;
        Ok(())
    }

    /// Validates the config and initialises the model (the stack of [`stack`](Self::stack)).
    pub fn init(&self, device: &Device) -> Result<MemorizingTransformer, XlError> {
        self.validate()?;
        self.stack().init(device)
    }
}

/// The Memorizing Transformer is the layer stack with kNN layers.
pub type MemorizingTransformer = TransformerXl;

/// Its recurrence state: the XL memory and one kNN memory per kNN layer.
pub type MemorizingState = XlState;

/// The reference model of the long-range recall comparison (`memzoo recall`; the task is
/// `memzoo_data::tasks::recall`, passages recalled across gaps far beyond the XL memory, the
/// training `memzoo_train::tasks::recall`): 2 pre-LN layers, d_model 64, 4 heads x 16, T5
/// positions, XL memory of 32, a vocabulary of `vocab_size`; with `knn`, layer 1 is a kNN layer
/// (top-8 of up to 1,024 exact memories per row and head), without it the same model is a plain
/// Transformer-XL.
pub fn recall_reference(knn: bool, vocab_size: usize) -> MemorizingConfig {
    let xl = XlConfig::new()
        .with_vocab_size(vocab_size)
        .with_d_model(64)
        .with_n_layers(2)
        .with_n_heads(4)
        .with_d_inner(128)
        .with_dropout(0.0)
        .with_mem_len(32)
        .with_pre_ln(true)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5));
    MemorizingConfig::new()
        .with_xl(xl)
        .with_knn_layers(if knn { vec![1] } else { vec![] })
        .with_knn(
            KnnLayerConfig::new()
                .with_top_k(8)
                .with_max_memories(1024)
                .with_index(IndexKind::Exact),
        )
}
