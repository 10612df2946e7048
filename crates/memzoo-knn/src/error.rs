//! Errors of the kNN attention crate.

use memzoo_memory::MemoryError;
use memzoo_relative::RelativeError;

/// Errors of the kNN-augmented attention layer; messages name the bad value.
#[derive(Debug, thiserror::Error)]
pub enum KnnError {
    /// A configuration value is invalid.
    #[error("invalid kNN attention config: {0}")]
    Config(String),
    /// An input (tensor, context, kNN memory) does not fit the layer.
    #[error("bad input to a kNN attention layer: {0}")]
    Input(String),
    /// The kNN memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

impl From<RelativeError> for KnnError {
    fn from(e: RelativeError) -> Self {
        match e {
            RelativeError::Config(m) => KnnError::Config(m),
            RelativeError::Input(m) => KnnError::Input(m),
        }
    }
}
