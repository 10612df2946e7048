//! The Memorizing Transformer (Wu et al., ICLR 2022) for memzoo.
//!
//! [`KnnAttention`] adds, to local attention over the segment and its XL memory, attention
//! over the top-k (key, value) pairs retrieved for each query from everything the model has
//! read before in the document (a [`memzoo_memory::KnnIndex`]), mixed per head by a learned
//! gate (it lives in `memzoo-relative`, beside the other attention kinds, and is re-exported
//! here). [`MemorizingConfig`] is the preset that puts kNN layers at chosen depths of the
//! layer stack (`memzoo_stack::TransformerXl`, read with `forward_state`); the caller owns the
//! recurrence state ([`MemorizingState`]: the XL memory and the kNN memories) and marks rows
//! whose document starts with `reset`.
//!
//! ```no_run
//! use burn::tensor::{Int, Tensor};
//! use memzoo_knn::{MemorizingConfig, MemorizingState};
//!
//! let device = burn::tensor::Device::flex();
//! let model = MemorizingConfig::new().init(&device).unwrap();
//! let mut state = MemorizingState::new();
//! for segment in 0..3 {
//!     let tokens = Tensor::<2, Int>::zeros([2, 512], &device);
//!     let reset = [segment == 0, segment == 0];
//!     let hidden = model.forward_state(tokens, &mut state, &reset).unwrap();
//!     let _logits = model.logits(hidden);
//! }
//! ```

#![warn(missing_docs)]

pub mod error;
pub mod model;
pub mod recall_task;

pub use error::KnnError;
pub use memzoo_relative::{KnnAttention, KnnAttentionConfig, KnnAttentionOutput, l2_normalize};
pub use model::{MemorizingConfig, MemorizingState, MemorizingTransformer};

#[cfg(test)]
mod tests;
