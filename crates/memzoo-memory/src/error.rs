//! Errors of the kNN memory.

use std::path::PathBuf;

/// Errors of the kNN memory; every message names the bad value or file.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A configuration value is invalid.
    #[error("invalid kNN memory config: {0}")]
    Config(String),
    /// An input tensor or argument does not fit the memory.
    #[error("bad input to the kNN memory: {0}")]
    Input(String),
    /// A file could not be read or written.
    #[error("kNN memory file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A saved memory is damaged or does not match what was asked for.
    #[error("kNN memory in {dir} is damaged or mismatched: {message}")]
    Corrupt {
        /// The directory of the saved memory.
        dir: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The usearch index reported an error.
    #[error("usearch index: {0}")]
    Index(String),
}

impl MemoryError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        MemoryError::Io {
            path: path.into(),
            source,
        }
    }
}
