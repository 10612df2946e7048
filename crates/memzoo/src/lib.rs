//! memzoo: transformers that remember beyond their context window, on Burn.
//!
//! This facade re-exports the model zoo's crates:
//! - [`backend`]: choose the Burn backend at run time from a device string;
//! - [`relative`]: relative multi-head attention (Transformer-XL, learned, T5 bias);
//! - [`xl`]: Transformer-XL with segment-level recurrence;
//! - [`data`]: tokenizer, corpora, ordered batches, data set downloads, generated corpus;
//! - [`train`]: the segment-recurrence trainer, and generation for every family;
//!
//! and holds the `memzoo` command line ([`commands`], [`config`]).

pub use memzoo_backend as backend;
pub use memzoo_data as data;
pub use memzoo_relative as relative;
pub use memzoo_train as train;
pub use memzoo_xl as xl;

pub mod commands;
pub mod config;
pub mod data_setup;
pub mod import;

/// The types most programs need.
pub mod prelude {
    pub use memzoo_backend::{Device, parse_device};
    pub use memzoo_train::{GenerateConfig, SampleConfig, generate};
    pub use memzoo_xl::{LayerKind, TransformerXl, XlConfig, XlMemory, XlState};
}
