//! Transformer-XL (Dai et al. 2019) for memzoo: segment-level recurrence with an explicit,
//! typed memory ([`XlMemory`]) and the XL language model ([`TransformerXl`]).
//!
//! ```no_run
//! use burn::tensor::{Int, Tensor};
//! use memzoo_xl::{XlConfig, XlMemory};
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

pub mod adaptive;
pub mod error;
pub mod memory;
pub mod model;

pub use adaptive::{
    AdaptiveEmbedding, AdaptiveEmbeddingConfig, AdaptiveLogSoftmax, AdaptiveLogSoftmaxConfig,
    AdaptiveLogSoftmaxTensors,
};
pub use error::XlError;
pub use memory::XlMemory;
pub use model::{TransformerXl, XlBlock, XlConfig, XlLayer, XlOutput};
