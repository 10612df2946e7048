//! The one error type of the crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading, batching, describing or downloading data.
///
/// Every message names the bad value, file or URL so that a user can act on it without a
/// backtrace.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A data file does not exist.
    #[error("data file {} does not exist", path.display())]
    NotFound {
        /// The path that was asked for.
        path: PathBuf,
    },
    /// A data file (or the archive member read from it) has no bytes.
    #[error("data file {} is empty", path.display())]
    Empty {
        /// The empty file.
        path: PathBuf,
    },
    /// A path that is not a regular file (a FIFO, a device such as `/dev/zero`, a directory,
    /// a socket): memzoo reads only files whose end it can know.
    #[error("{} is {kind}, not a regular file: give a file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is ("a FIFO", "a character device", ...).
        kind: &'static str,
    },
    /// A file (or what it decompresses to) beyond the limit memzoo reads.
    #[error(
        "{} {what} more than {limit} bytes, the most memzoo reads{why}",
        path.display()
    )]
    TooLarge {
        /// The file (or `archive:member`).
        path: PathBuf,
        /// "holds", "decompresses to".
        what: &'static str,
        /// The limit, bytes.
        limit: u64,
        /// Where the limit comes from (starting with `: `), or empty.
        why: String,
    },
    /// An I/O error on a named file.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("cannot read", "cannot create", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A `.gz` or `.zip` file that cannot be decoded, or a zip member that is missing or
    /// ambiguous.
    #[error("archive {}: {message}", path.display())]
    Archive {
        /// The archive.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A token stream too short for even one batch.
    #[error(
        "{what} has {tokens} tokens, but one batch of {batch} rows x {seq_len} tokens needs at \
         least {needed} (batch * (seq_len + 1))"
    )]
    TooShort {
        /// Which corpus or split.
        what: String,
        /// How many tokens it has.
        tokens: usize,
        /// How many one batch needs.
        needed: usize,
        /// Rows per batch.
        batch: usize,
        /// Segment length.
        seq_len: usize,
    },
    /// A parameter with a value it cannot take.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidValue {
        /// The parameter ("batch", "split.valid", ...).
        name: String,
        /// Its value as given.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A token id outside the tokenizer's vocabulary.
    #[error("token id {id} is outside the vocabulary of size {vocab_size}")]
    TokenOutOfRange {
        /// The bad id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A pickle refused or not readable ([`crate::tokenize::pickle`]).
    #[error(transparent)]
    Pickle(#[from] crate::tokenize::pickle::PickleError),
    /// A word vocabulary file that cannot be used (the message names the field).
    #[error("vocabulary {}: {message}", path.display())]
    Vocab {
        /// The vocabulary file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A special token name the tokenizer does not know.
    #[error("unknown special token {name:?}; this tokenizer has {known:?}")]
    UnknownSpecial {
        /// The name asked for.
        name: String,
        /// The special tokens the tokenizer has.
        known: Vec<String>,
    },
    /// A data set name without a manifest.
    #[error("unknown data set {name:?}; known data sets: {}", known.join(", "))]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// The names with a manifest.
        known: Vec<String>,
    },
    /// A manifest that does not parse or is inconsistent.
    #[error("manifest {name}: {message}")]
    Manifest {
        /// Manifest name or file.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A saved batcher position that does not belong to this batcher.
    #[error("cannot restore batcher state: {field} is {saved} in the state but {actual} here")]
    StateMismatch {
        /// The field that differs.
        field: &'static str,
        /// Its value in the saved state.
        saved: u64,
        /// Its value in this batcher.
        actual: u64,
    },
    /// A failed HTTP transfer.
    #[error("download of {url} failed: {message}")]
    Http {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// A downloaded file whose size differs from the manifest.
    #[error("{}: size is {actual} bytes, the manifest says {expected}", path.display())]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// Size from the manifest.
        expected: u64,
        /// Size on disk.
        actual: u64,
    },
    /// A downloaded file whose sha256 differs from the manifest.
    #[error("{}: sha256 is {actual}, the manifest says {expected}", path.display())]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// Checksum from the manifest.
        expected: String,
        /// Checksum of the bytes on disk.
        actual: String,
    },
    /// A crate pinned by the rust-code manifest that no cargo registry source directory holds.
    #[error(
        "crate {name} {version} (pinned by the rust-code manifest) is in none of cargo's registry \
         source directories ({}); it is in memzoo's Cargo.lock: run `cargo fetch` in the memzoo \
         checkout, which downloads and unpacks it",
        if searched.is_empty() { "none found under $CARGO_HOME/registry/src".to_string() } else {
            searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        }
    )]
    CrateMissing {
        /// Crate name.
        name: String,
        /// Crate version.
        version: String,
        /// The registry source directories searched.
        searched: Vec<PathBuf>,
    },
    /// A document whose size or SHA-256 differs from its manifest (a rust-code crate, or the
    /// whole corpus).
    #[error("{what}: {field} is {actual}, the rust-code manifest says {expected}")]
    DocumentMismatch {
        /// The document (`serde-1.0.228` in `/path`) or `the whole corpus`.
        what: String,
        /// `"size"` or `"sha256"`.
        field: &'static str,
        /// Value in the manifest.
        expected: String,
        /// Value of the bytes read.
        actual: String,
    },
    /// A prepared corpus that is absent or damaged.
    #[error("prepared corpus {}: {reason}; run `memzoo data prepare {name}`", path.display())]
    NotPrepared {
        /// The data set (`rust-code`).
        name: &'static str,
        /// The missing or damaged file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl DataError {
    /// An [`DataError::Io`] for `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        DataError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// [`DataError::NotFound`] where `path` does not exist, else an [`DataError::Io`] of
    /// `action` (what was tried on the file).
    pub(crate) fn file(
        action: &'static str,
        path: &std::path::Path,
        source: std::io::Error,
    ) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            DataError::io(action, path, source)
        }
    }

    /// An [`DataError::InvalidValue`].
    pub(crate) fn invalid(
        name: impl Into<String>,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        DataError::InvalidValue {
            name: name.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
