//! Transformer-XL (Dai et al. 2019) for memzoo: segment-level recurrence with an explicit,
//! typed memory ([`XlMemory`]) and the layer stack ([`TransformerXl`]): one embedding, a list
//! of layers of any attention kind ([`LayerKind`]: `xl`, `learned`, `t5`, `knn`, `lsh`,
//! `local`) in one residual block, one output. The Memorizing Transformer is this stack with
//! `knn` layers (`memzoo_knn::MemorizingConfig` is its preset; [`XlState`] carries its kNN
//! memories); the Reformer is this stack with `lsh` / `local` layers, reversible residuals and
//! axial positions ([`ReformerConfig`] is its preset, [`ReformerLm`] its name).
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
pub mod compressive;
/// The errors of the layer stack.
pub mod error;
pub mod legacy;
pub mod memory;
pub mod recurrent;
pub mod reformer;
pub mod rmt;
pub mod stack;
pub mod unroll;

pub use adaptive::{
    AdaptiveEmbedding, AdaptiveEmbeddingConfig, AdaptiveLogSoftmax, AdaptiveLogSoftmaxConfig,
    AdaptiveLogSoftmaxTensors,
};
pub use compressive::{CompressedMemory, Compression, CompressionKind, CompressiveConfig};
pub use error::XlError;
pub use memory::{XlMemory, XlState};
pub use recurrent::RecurrentModel;
pub use reformer::{ReformerConfig, ReformerLm};
pub use rmt::{Rmt, RmtConfig, RmtMemory};
pub use stack::{
    Activation, AxialConfig, FfMasks, HeadInput, InputEmbedding, KnnFeed, KnnLayerConfig,
    LayerAttention, LayerContext, LayerKind, LshLayerConfig, OutputLayer, Randomness, Replay,
    Residual, SharedT5, Step, StepCounter, TargetScores, TransformerXl, XlBlock, XlConfig, XlLayer,
    XlOutput, absolute_positions, mean_nll, target_nll,
};
pub use stack::{LayerTrace, Trace, TraceSlot};
pub use unroll::UnrollSegment;
