use memzoo_knn::KnnError;
use memzoo_memory::MemoryError;
use memzoo_relative::RelativeError;

/// Errors of the layer stack (Transformer-XL, its kNN and LSH layers, the Reformer preset).
#[derive(Debug, thiserror::Error)]
pub enum XlError {
    /// A configuration value is invalid; the message names it.
    #[error("invalid Transformer-XL config: {0}")]
    Config(String),
    /// An input does not fit the model; the message names the shapes.
    #[error("bad input to Transformer-XL: {0}")]
    Input(String),
    /// A kNN layer's memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

impl From<RelativeError> for XlError {
    fn from(e: RelativeError) -> Self {
        match e {
            RelativeError::Config(m) => XlError::Config(m),
            RelativeError::Input(m) => XlError::Input(m),
        }
    }
}

impl From<KnnError> for XlError {
    fn from(e: KnnError) -> Self {
        match e {
            KnnError::Config(m) => XlError::Config(m),
            KnnError::Input(m) => XlError::Input(m),
            KnnError::Memory(e) => XlError::Memory(e),
        }
    }
}

impl From<memzoo_reformer::ReformerError> for XlError {
    fn from(e: memzoo_reformer::ReformerError) -> Self {
        match e {
            memzoo_reformer::ReformerError::Config(m) => XlError::Config(m),
            memzoo_reformer::ReformerError::Input(m) => XlError::Input(m),
        }
    }
}
