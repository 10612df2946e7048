//! Transformer-XL (Dai et al. 2019) for memzoo: segment-level recurrence with an explicit,
//! typed memory ([`XlMemory`]) and the layer stack ([`TransformerXl`]): one embedding, a list
//! of layers of any attention kind ([`LayerKind`]: `xl`, `learned`, `t5`, `knn`, `lsh`,
//! `local`) in one residual block, one output. The papers' models are presets of it
//! ([`presets`]): the Memorizing Transformer is this stack with `knn` layers
//! ([`MemorizingConfig`]; [`XlState`] carries its kNN memories), the Reformer this stack with
//! `lsh` / `local` layers, reversible residuals and axial positions ([`ReformerConfig`], its
//! model named [`ReformerLm`]), and the memory families are options of it: the Compressive
//! Transformer ([`CompressiveConfig`]), the Recurrent Memory Transformer ([`RmtConfig`]) and the
//! Block-Recurrent Transformer ([`BlockRecurrentConfig`]). The attention kinds come from their crates: `memzoo_relative`
//! (`xl`, `learned`, `t5`), `memzoo_knn` (`knn`), `memzoo_reformer` (`lsh`, `local`).
//!
//! ```no_run
//! use burn::tensor::{Int, Tensor};
//! use memzoo_stack::{XlConfig, XlMemory};
//!
//! let device = memzoo_backend::parse_device("flex").unwrap();
//! let model = XlConfig::new().with_n_layers(2).init(&device).unwrap();
//! let mut memory = XlMemory::empty();
//! for segment in 0..3 {
//!     let tokens = Tensor::<2, Int>::zeros([4, 128], &device);
//!     let out = model.forward(tokens, &memory).unwrap();
//!     memory = out.memory; // detached: the next segment attends to it, gradients stop there
//! }
//! ```

#![warn(missing_docs)]

pub mod adaptive;
pub mod block_recurrent;
pub mod compressive;
/// The errors of the layer stack.
pub mod error;
pub mod legacy;
pub mod memory;
pub mod presets;
pub mod recurrent;
pub mod rmt;
pub mod stack;
pub mod unroll;

pub use adaptive::{
    AdaptiveEmbedding, AdaptiveEmbeddingConfig, AdaptiveLogSoftmax, AdaptiveLogSoftmaxConfig,
    AdaptiveLogSoftmaxTensors,
};
pub use block_recurrent::{
    BlockRecurrent, BlockRecurrentConfig, GateKind, RecurrentState, StateFeedForward, StateGate,
    StateRead,
};
pub use compressive::{CompressedMemory, Compression, CompressionKind, CompressiveConfig};
pub use error::XlError;
pub use memory::{Carried, XlMemory, XlState};
pub use memzoo_reformer::LshConfig;
pub use presets::memorizing::{
    MemorizingConfig, MemorizingState, MemorizingTransformer, recall_reference,
};
/// The Reformer preset, where it was before [`presets`] (`memzoo_stack::reformer::ReformerConfig`).
pub use presets::reformer;
pub use presets::reformer::{ReformerConfig, ReformerLm};
pub use recurrent::RecurrentModel;
pub use rmt::{Rmt, RmtConfig, RmtMemory};
#[allow(deprecated)]
pub use stack::LshLayerConfig;
pub use stack::{
    Activation, AxialConfig, FfMasks, HeadInput, HyperConnection, InputEmbedding, KnnFeed,
    KnnLayerConfig, LayerAttention, LayerContext, LayerKind, Norm, NormKind, OutputLayer,
    PeerCompat, QkNormConfig, Randomness, Replay, Residual, SharedT5, Step, StepCounter,
    TargetScores, TransformerXl, XlBlock, XlConfig, XlLayer, XlOutput, absolute_positions,
    expand_streams, mean_nll, reduce_streams, target_nll,
};
pub use stack::{LayerTrace, Trace, TraceSlot};
pub use unroll::UnrollSegment;
