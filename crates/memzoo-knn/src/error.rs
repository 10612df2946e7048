//! Errors of the Memorizing Transformer crate.

use memzoo_memory::MemoryError;
use memzoo_relative::RelativeError;
use memzoo_stack::XlError;

/// Errors of the kNN layer and the Memorizing Transformer; messages name the bad value.
#[derive(Debug, thiserror::Error)]
pub enum KnnError {
    /// A configuration value is invalid.
    #[error("invalid Memorizing Transformer config: {0}")]
    Config(String),
    /// An input does not fit the model.
    #[error("bad input to the Memorizing Transformer: {0}")]
    Input(String),
    /// The kNN memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

impl From<XlError> for KnnError {
    fn from(e: XlError) -> Self {
        match e {
            XlError::Config(m) => KnnError::Config(m),
            XlError::Input(m) => KnnError::Input(m),
            XlError::Memory(e) => KnnError::Memory(e),
        }
    }
}

impl From<RelativeError> for KnnError {
    fn from(e: RelativeError) -> Self {
        XlError::from(e).into()
    }
}
