//! Checkpoints from the PyTorch world, read into memzoo models without executing pickle code.
//!
//! - [`reader::TensorMap`]: a checkpoint file (`*.safetensors`, or a PyTorch `torch.save` file
//!   read by burn-store's pickle *reader*) as a name → tensor map from which the importer takes
//!   each tensor, so that a missing, misshaped or unknown tensor is an error naming it.
//! - [`hf_transfo_xl`]: HF's `TransfoXLLMHeadModel` (transformers ≤ 4.x; removed in 5.0), from
//!   a directory with `config.json` and `model.safetensors` or `pytorch_model.bin`, into
//!   [`memzoo_stack::TransformerXl`] for any shape (`transfo-xl-wt103`'s adaptive input and
//!   softmax included); and back ([`hf_transfo_xl::export`]).
//! - [`labml_xl`]: labml-nn's Transformer-XL language model (`state_dict` of its
//!   `AutoregressiveModel`: learned relative tables, pre-LN, value/output biases), and back.
//! - [`lucidrains_memorizing`]: memorizing-transformers-pytorch's `MemorizingTransformer`
//!   (multi-query T5 layers and a kNN layer with an XL and a kNN memory), and back.
//! - [`hf_reformer`]: HF's `ReformerModelWithLMHead` (transformers 5.x; `google/reformer-enwik8`
//!   and `crime-and-punishment` shapes: axial positions, LSH and local layers, factorised
//!   buckets, HF's concatenating head), optionally with the LSH rotations of one HF pass; and
//!   back.
//! - [`lucidrains_reformer`]: reformer-pytorch's `ReformerLM` (summed axial positions, LSH
//!   layers, the mean of the two streams), optionally with the rotations of one pass; and back.
//! - [`lucidrains_rmt`]: recurrent-memory-transformer-pytorch's `RecurrentMemoryTransformer`
//!   (memory tokens, RMSNorm, GEGLU, a null key/value, value residuals), and back.
//! - [`lucidrains_block_recurrent`], block-recurrent-transformer-pytorch's
//!   `BlockRecurrentTransformer` (a recurrent state, rotary/xPos positions, qk-RMSNorm, a
//!   key/value XL memory, GEGLU, bias-free LayerNorms), and back.
//! - [`format`](mod@format): the one trait every peer implements ([`format::PeerFormat`]: its config
//!   into a stack config, its tensors in, and back out), and the registry of formats by the
//!   name `memzoo import --from` and `memzoo export --to` take ([`format::format`]).
//! - [`hub`] (cargo feature `hub`, on by default): a Hugging Face Hub model id where a
//!   checkpoint directory is accepted, downloaded into the Hugging Face cache shared with Python.
//! - [`mapping`]: the one mapping module the peers share (PyTorch's layers into memzoo's
//!   modules and back, tied copies by name with burn-store's key remapping, the files).
//!
//! ```no_run
//! use std::path::Path;
//!
//! use burn::tensor::Device;
//!
//! let device = Device::flex();
//! // The registry finds a peer's format by the name `memzoo import --from` takes.
//! let format = memzoo_import::format("hf-transfo-xl").unwrap();
//! // A directory with the peer's `config.json` and `model.safetensors` (or `pytorch_model.bin`).
//! let src = Path::new("tests/fixtures/hf-transfo-xl");
//! let (model, stack) = format.import(src, &device).unwrap();
//! println!("{} layers, d_model {}", stack.n_layers, stack.d_model);
//! // And back, into the peer's layout.
//! format.export(&model, &stack, Path::new("exported")).unwrap();
//! ```

#![warn(missing_docs)]

pub mod error;
pub mod format;
pub mod hf_reformer;
pub mod hf_transfo_xl;
#[cfg(feature = "hub")]
pub mod hub;
pub mod labml_xl;
pub mod lucidrains_block_recurrent;
pub mod lucidrains_compressive;
pub mod lucidrains_memorizing;
pub mod lucidrains_reformer;
pub mod lucidrains_rmt;
pub mod mapping;
pub mod reader;

pub use error::ImportError;
pub use format::{FORMATS, Format, PeerFormat, format};
pub use hf_reformer::HfReformerConfig;
pub use hf_transfo_xl::HfTransfoXlConfig;
pub use labml_xl::LabmlXlConfig;
pub use lucidrains_block_recurrent::BlockRecurrentPeerConfig;
pub use lucidrains_compressive::CompressivePeerConfig;
pub use lucidrains_memorizing::MemorizingPeerConfig;
pub use lucidrains_rmt::RmtPeerConfig;
pub use reader::TensorMap;
