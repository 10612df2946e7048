/// Errors of the trainer; each message names the value, file or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Invalid training configuration.
    #[error("invalid config: {0}")]
    Config(String),
    /// Data that does not fit (too short, wrong ids, ...).
    #[error("data: {0}")]
    Data(String),
    /// A batcher or generated task refused its input (memzoo-data's error, as it is).
    #[error("data: {0}")]
    Batches(#[from] memzoo_data::DataError),
    /// Tensor shapes that do not fit.
    #[error("shape: {0}")]
    Shape(String),
    /// The model refused its input.
    #[error("model: {0}")]
    Model(String),
    /// The layer stack (Transformer-XL, Memorizing, Reformer) refused its input or config.
    #[error("model: {0}")]
    Xl(#[from] memzoo_stack::XlError),
    /// The Reformer refused its input or config.
    #[error("model: {0}")]
    Reformer(#[from] memzoo_reformer::ReformerError),
    /// A checkpoint could not be written or read.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// `metrics.jsonl` holds something that is not a record.
    #[error("metrics: {0}")]
    Metrics(String),
    /// Another process works in the run directory (it holds its `.lock`, see
    /// [`crate::lock`]).
    #[error(
        "run directory {} is in use by another process ({holder}): one process per run \
         directory; wait for it to end, or use another run directory",
        dir.display()
    )]
    Busy {
        /// The run directory.
        dir: std::path::PathBuf,
        /// What the lock file says of its holder (`pid 1234 (memzoo train)`).
        holder: String,
    },
    /// File-system trouble (unwritable run directory, ...).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl TrainError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TrainError::Io {
            context: context.into(),
            source,
        }
    }
}
