//! The Reformer (Kitaev, Kaiser, Levskaya, ICLR 2020): LSH attention, reversible residual
//! layers, chunked feed-forward and axial position embeddings.
//!
//! - [`ReformerAttention`]: LSH (shared-QK, hashed, sorted, chunked) or local attention;
//!   the tensor-level [`lsh_attention`] / [`local_attention`] / [`hash_buckets`].
//! - [`ReformerBlock`]: `y_1 = x_1 + F(x_2)`, `y_2 = x_2 + G(y_1)` with a layer-by-layer
//!   reversible backward ([`ReformerBlock::reverse`]).
//! - [`ReformerLm`] / [`ReformerConfig`]: the language model; `train_step` returns the loss
//!   and `GradientsParams` computed with the reversible backward.
//! - [`duplication`]: the `0 w 0 w` copy task of the paper; [`bench`]: timing helpers.

pub mod attention;
pub mod bench;
pub mod duplication;
pub mod error;
pub mod feedforward;
pub mod model;
pub mod rng;

pub use attention::{
    AttentionKind, ChunkParams, ForwardOptions, LshScores, ReformerAttention,
    ReformerAttentionConfig, hash_buckets, local_attention, lsh_attention,
};
pub use error::ReformerError;
pub use feedforward::{
    AxialPositionalEmbedding, AxialPositionalEmbeddingConfig, ChunkedFeedForward,
    ChunkedFeedForwardConfig,
};
pub use model::{ReformerBlock, ReformerConfig, ReformerLm, cross_entropy};

#[cfg(test)]
mod tests;
