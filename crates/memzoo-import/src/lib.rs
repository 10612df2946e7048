//! Checkpoints from the PyTorch world, read into memzoo models without executing pickle code.
//!
//! - [`reader::TensorMap`]: a checkpoint file (`*.safetensors`, or a PyTorch `torch.save` file
//!   read by burn-store's pickle *reader*) as a name → tensor map from which the importer takes
//!   each tensor, so that a missing, misshaped or unknown tensor is an error naming it.
//! - [`hf_transfo_xl`]: HF's `TransfoXLLMHeadModel` (transformers ≤ 4.x; removed in 5.0), from
//!   a directory with `config.json` and `model.safetensors` or `pytorch_model.bin`, into
//!   [`memzoo_xl::TransformerXl`] for any shape (`transfo-xl-wt103`'s adaptive input and
//!   softmax included); and back ([`hf_transfo_xl::export`]).

pub mod error;
pub mod hf_transfo_xl;
pub mod reader;

pub use error::ImportError;
pub use hf_transfo_xl::HfTransfoXlConfig;
pub use reader::TensorMap;
