//! memzoo: transformers that remember beyond their context window, on Burn.
//!
//! This facade re-exports every library crate of the model zoo:
//! - [`backend`]: choose the Burn backend at run time from a device string;
//! - [`relative`]: relative multi-head attention (Transformer-XL, learned, T5 bias);
//! - [`stack`]: the one layer stack every family is built on (Transformer-XL, the Reformer and
//!   the Memorizing Transformer are its presets), with segment-level recurrence;
//! - [`reformer`]: the Reformer's components (LSH attention, reversible coupling, chunked
//!   feed-forward, axial positions); the Reformer itself is a preset of the stack
//!   (`stack::ReformerConfig`, `stack::ReformerLm`);
//! - [`memory`]: the kNN key-value memory (exact search or usearch HNSW);
//! - [`knn`]: kNN-augmented attention over that memory (the Memorizing Transformer's layer; the
//!   model is a preset of the stack, `stack::MemorizingConfig`);
//! - [`fused`]: fused multi-threaded CPU kernels (relative, LSH and kNN attention) behind Burn's
//!   backend extension;
//! - [`data`]: tokenizer, corpora, ordered batches, data set downloads, generated corpus;
//! - [`train`]: the segment-recurrence trainer, and generation for every family;
//!
//! and holds the `memzoo` command line ([`commands`], [`config`]).

#![warn(missing_docs)]

pub use memzoo_backend as backend;
pub use memzoo_data as data;
pub use memzoo_fused as fused;
/// Reading and writing the PyTorch peers' checkpoints (`memzoo-import`).
pub use memzoo_import as interop;
/// kNN-augmented attention (`memzoo_knn`), and the Memorizing Transformer's preset where it was
/// before it moved to the stack's presets (`memzoo::knn::MemorizingConfig` is
/// `memzoo_stack::MemorizingConfig`).
pub mod knn {
    pub use memzoo_knn::*;
    pub use memzoo_stack::{MemorizingConfig, MemorizingState, MemorizingTransformer};
}
pub use memzoo_memory as memory;
pub use memzoo_reformer as reformer;
pub use memzoo_relative as relative;
pub use memzoo_stack as stack;
pub use memzoo_train as train;

pub mod commands;
pub mod config;
pub mod data_setup;
pub mod error;
pub use error::CliError;
pub mod import;
pub mod inspect;
pub mod preset;
pub mod recl;
pub mod tokenizer_import;

/// The types most programs need.
pub mod prelude {
    pub use memzoo_backend::{Device, parse_device};
    pub use memzoo_stack::{LayerKind, Step, TransformerXl, XlConfig, XlMemory, XlState};
    pub use memzoo_train::{GenerateConfig, SampleConfig, generate};
}
