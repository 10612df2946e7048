//! kNN-augmented attention (Wu et al., "Memorizing Transformers", ICLR 2022) for memzoo.
//!
//! [`KnnAttention`] adds, to local attention over the segment and its XL memory (T5-biased
//! relative attention, `memzoo_relative`), attention over the top-k (key, value) pairs
//! retrieved for each query from everything the model has read before in the document (a
//! [`memzoo_memory::KnnIndex`]), mixed per head by a learned gate ([`KnnMixing`]). The read of
//! the retrieved pairs runs as a fused CPU kernel where it can ([`fused`]).
//!
//! The Memorizing Transformer itself is a preset of the layer stack that puts such layers at
//! chosen depths: `memzoo_stack::MemorizingConfig` (`memzoo_stack::presets::memorizing`).
//!
//! ```no_run
//! use burn::tensor::{Device, Tensor};
//! use memzoo_knn::KnnAttentionConfig;
//! use memzoo_memory::KnnMemoryConfig;
//! use memzoo_relative::{AttentionMask, RelativeContext};
//!
//! let device = Device::flex();
//! let config = KnnAttentionConfig::new(64, 4, 16);
//! let layer = config.init(&device).unwrap();
//! let mut memory = KnnMemoryConfig::new(4, 16).init(2, &device).unwrap();
//! let x = Tensor::<3>::zeros([2, 8, 64], &device);
//! let ctx = RelativeContext::new(&config.positions, 64, 8, 0, &AttentionMask::causal(), &device);
//! // Attends to the segment and to the 32 best pairs stored so far, then stores the segment's.
//! let _out = layer.forward_and_store(x, None, &ctx, memory.as_mut(), 32).unwrap();
//! ```

#![warn(missing_docs)]

pub mod attention;
pub mod error;
pub mod fused;
pub mod probe;

pub use attention::{
    KnnAttention, KnnAttentionConfig, KnnAttentionOutput, KnnMixing, l2_normalize,
};
pub use error::KnnError;
