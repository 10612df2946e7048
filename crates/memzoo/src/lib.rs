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
//!
//! ```no_run
//! use std::path::Path;
//!
//! use memzoo::prelude::*;
//!
//! let device = parse_device("flex").unwrap();
//! // A run that `memzoo train` wrote: its config and its latest checkpoint, of any family.
//! let (_config, model) = memzoo::commands::load_xl(Path::new("runs/xl"), &device).unwrap();
//! let prompt: Vec<i64> = "To be, or not".bytes().map(i64::from).collect();
//! // 200 new tokens, read in segments of 64 with the memory carried between them.
//! let sampler = SampleConfig::new().with_temperature(0.8).with_seed(1);
//! let config = GenerateConfig::new(200, 64).with_sampler(sampler);
//! let out = generate(&model, &prompt, &config, &device).unwrap();
//! let text: Vec<u8> = out.tokens.iter().map(|&t| t as u8).collect();
//! println!("{}", String::from_utf8_lossy(&text));
//! ```

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
