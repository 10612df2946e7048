//! Relative-position multi-head attention for memzoo.
//!
//! One module, [`RelativeMultiHeadAttention`], four position schemes ([`PositionKind`]):
//! Transformer-XL's sinusoidal encodings with `u`/`v` biases, learned relative embeddings
//! (the labml variant), T5's bucketed bias, and none (absolute positions in the input, the
//! vanilla Transformer). Memory keys (cached hidden states of earlier
//! segments) are prepended to the segment's keys; the causal mask is offset by the memory
//! length. Positions are computed once per forward pass in a [`RelativeContext`] and shared by
//! every layer; [`shift::relative_shift`] re-indexes distance-major scores by key with one copy
//! (exact on every key the mask leaves visible; on every key without a causal mask).
//!
//! The kNN-augmented attention of the Memorizing Transformer (`memzoo_knn::KnnAttention`) is
//! this attention with retrieval added; the layer stack (`memzoo-stack`) holds any of them per
//! layer.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use memzoo_relative::{AttentionMask, RelativeAttentionConfig, RelativeContext};
//!
//! let device = Device::flex();
//! // d_model 64, 4 heads of width 16, Transformer-XL positions (the default).
//! let config = RelativeAttentionConfig::new(64, 4, 16);
//! let layer = config.init(&device).unwrap();
//! let segment = Tensor::<3>::zeros([2, 8, 64], &device);
//! // The hidden states of the previous segment, attended to before the segment's own.
//! let memory = Tensor::<3>::zeros([2, 16, 64], &device);
//! // Positions for 8 queries over 16 memory slots and the segment, shared by every layer.
//! let ctx = RelativeContext::new(&config.positions, 64, 8, 16, &AttentionMask::causal(), &device);
//! let out = layer.forward(segment, Some(memory), &ctx, None).unwrap();
//! assert_eq!(out.dims(), [2, 8, 64]);
//! ```

#![warn(missing_docs)]

pub mod attention;
/// The errors of relative attention.
pub mod error;
pub mod fused;
pub mod positions;
pub mod probe;
pub mod rotary;
pub mod rows;
pub mod shift;

pub use attention::{
    AbsolutePositionParams, LearnedPositionParams, PeerAttentionParams, PositionParams,
    ProjectionTap, Projections, RelativeAttentionConfig, RelativeMultiHeadAttention,
    T5PositionParams, ValueResidual, XlBiases, XlPositionParams,
};
pub use error::RelativeError;
pub use positions::{
    AttentionMask, PositionConfig, PositionIndex, PositionKind, RelativeContext, t5_bucket,
};
pub use probe::{AttentionProbe, KeySplit, RetrievedProbe};
pub use rotary::{QkNorm, RotarySpec, RotaryTables, l2norm};
pub use rows::linear_rows;
