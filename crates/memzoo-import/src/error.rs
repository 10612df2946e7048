//! Errors of checkpoint import.

use std::path::PathBuf;

use memzoo_stack::XlError;

/// Why a checkpoint could not be imported. Every variant names the file, tensor or value.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file could not be read or parsed.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The directory has neither weight file.
    #[error("{dir} holds no model.safetensors nor pytorch_model.bin")]
    NoWeights {
        /// The directory searched.
        dir: PathBuf,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("tensor {name} is missing from the checkpoint (expected shape {expected:?})")]
    Missing {
        /// The checkpoint's name for it.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
    },
    /// Tensors the importer does not know: nothing may be silently dropped.
    #[error("the checkpoint has tensors this importer does not know: {names:?}")]
    Unknown {
        /// Their names.
        names: Vec<String>,
    },
    /// A tensor has another shape than the config implies.
    #[error("tensor {name} has shape {found:?}, the config implies {expected:?}")]
    Shape {
        /// The checkpoint's name.
        name: String,
        /// Its shape.
        found: Vec<usize>,
        /// The shape the config implies.
        expected: Vec<usize>,
    },
    /// A tensor holds values memzoo cannot represent (a tied copy that differs, a buffer other
    /// than the one memzoo computes, a non-float dtype).
    #[error("tensor {name}: {message}")]
    Value {
        /// The checkpoint's name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// `--from` / `--to` named a format memzoo does not know.
    #[error("unknown source `{name}`: supported are {known}")]
    UnknownFormat {
        /// The name given.
        name: String,
        /// The known names, comma-separated ([`crate::format::FORMATS`]).
        known: String,
    },
    /// The config asks for something memzoo cannot express (yet); the message names the field.
    #[error("unsupported config: {0}")]
    Unsupported(String),
    /// A Hub checkpoint could not be downloaded or found in the cache.
    #[cfg(feature = "hub")]
    #[error(transparent)]
    Hub(#[from] crate::hub::HubError),
    /// The model rejected the config or the tensors.
    #[error(transparent)]
    Model(#[from] XlError),
}
