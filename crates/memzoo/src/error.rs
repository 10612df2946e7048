//! The one error type of the `memzoo` command line.
//!
//! Every command returns a [`CliError`]; the binary's `main` prints it (`error: ...` on stderr)
//! and exits with [`CliError::exit_code`], in one place. The libraries' errors come in through
//! `#[from]` with their messages unchanged; the CLI's own errors name the flag, field, file or
//! value at fault.

use std::path::PathBuf;

use memzoo_backend::DeviceError;
use memzoo_data::DataError;
use memzoo_import::ImportError;
use memzoo_reformer::ReformerError;
use memzoo_stack::XlError;
use memzoo_train::TrainError;
use memzoo_train::generate::GenerateError;

/// Everything a `memzoo` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A command-line flag with a value the command cannot use.
    #[error("{flag} {value}: {reason}")]
    Flag {
        /// The flag (`--max-segments`, ...).
        flag: &'static str,
        /// Its value as given.
        value: String,
        /// Why it is refused (and what would be accepted).
        reason: String,
    },
    /// Flags, or a flag and the run it is applied to, that do not go together; the message
    /// names both.
    #[error("{0}")]
    Conflict(String),
    /// A sampling option (`--temperature`, `--top-k`, `--top-p`, `--segment-len`) out of range.
    #[error("{flag}: {source}")]
    Sampler {
        /// The flag.
        flag: &'static str,
        /// The sampler's own error, naming the value.
        #[source]
        source: GenerateError,
    },
    /// The run configuration (`--config`, `--set`, a run's `config.toml`) cannot be read or holds
    /// a bad value; the message names the field or file.
    #[error("{0}")]
    Config(String),
    /// A run directory that already holds a run, for a command that would start a new one.
    #[error("run directory {} already holds a run ({found}): {advice}", dir.display())]
    RunExists {
        /// The run directory.
        dir: PathBuf,
        /// What was found there (checkpoints, metrics.jsonl).
        found: String,
        /// What to do instead.
        advice: &'static str,
    },
    /// A directory without the `config.toml` every run directory has.
    #[error("{} has no config.toml: is it a memzoo run directory?", dir.display())]
    NotARun {
        /// The directory given as `--run-dir`.
        dir: PathBuf,
    },
    /// A run directory with no checkpoint to read.
    #[error("{} has no checkpoint yet", dir.display())]
    NoCheckpoint {
        /// The run directory.
        dir: PathBuf,
    },
    /// A checkpoint of another model family than the command or the run's config needs.
    #[error("{} holds a `{found}` model, {expected}", dir.display())]
    Family {
        /// The checkpoint (or run) directory.
        dir: PathBuf,
        /// The family it holds.
        found: String,
        /// What was expected instead.
        expected: String,
    },
    /// Data with a token id the model has no embedding for.
    #[error(
        "{field} = {vocab}, but the {split} split of {data} holds token id {id} (ids must be below \
         the vocabulary size; byte data needs 256 + data.byte_offset = {})",
        256 + *byte_offset as usize
    )]
    Vocab {
        /// The config field of the vocabulary size.
        field: &'static str,
        /// Its value.
        vocab: usize,
        /// The split holding the id.
        split: &'static str,
        /// The data's name.
        data: String,
        /// The largest id of that split.
        id: u32,
        /// The run's `data.byte_offset` (id of byte 0).
        byte_offset: u16,
    },
    /// A known data set whose file is not downloaded yet.
    #[error(
        "data set `{name}` is not downloaded ({} is missing): run `memzoo data fetch {name}` first",
        path.display()
    )]
    NotDownloaded {
        /// The data set.
        name: String,
        /// The file it would be read from.
        path: PathBuf,
    },
    /// A run that needs more memory than this machine has, with the estimate.
    #[error(
        "{what} needs about {need_gib:.1} GiB, more than this machine's {have_gib:.1} GiB{advice}"
    )]
    TooLarge {
        /// What needs it, with the values that make it large.
        what: String,
        /// The estimate, GiB.
        need_gib: f64,
        /// This machine's memory, GiB.
        have_gib: f64,
        /// What to lower (starting with `; `), or empty.
        advice: String,
    },
    /// An output file that is there already (never overwritten).
    #[error("{} already exists: {advice}", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
        /// What to do instead.
        advice: &'static str,
    },
    /// An import source or export target memzoo does not know.
    #[error("unknown source `{name}`{planned}: supported are {supported}")]
    UnknownFormat {
        /// The name given to `--from` / `--to`.
        name: String,
        /// ` (planned, not supported yet)` for formats that are coming, else empty.
        planned: &'static str,
        /// The supported names, comma-separated.
        supported: String,
    },
    /// A file-system operation that failed, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The trainer, evaluation, checkpoints or a task run.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The layer stack (Transformer-XL, Memorizing Transformer).
    #[error(transparent)]
    Xl(#[from] XlError),
    /// The Reformer.
    #[error(transparent)]
    Reformer(#[from] ReformerError),
    /// Reading or writing a PyTorch-world checkpoint.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// Data files, data sets, batchers and downloads.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The `--device` string.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A device that started but failed while working (its backend's error).
    #[error("device `{device}` failed {doing}: {message}")]
    DeviceFailed {
        /// The device string.
        device: String,
        /// What it was doing.
        doing: &'static str,
        /// The backend's own error.
        message: String,
    },
    /// Generation (a token outside the vocabulary, an empty prompt, the model).
    #[error(transparent)]
    Generate(GenerateError),
    /// The memory inspector (`memzoo inspect`).
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
}

/// The flag of a sampling option, so that its error names it; other generation errors as
/// they are.
impl From<GenerateError> for CliError {
    fn from(e: GenerateError) -> Self {
        let flag = match e {
            GenerateError::Temperature(_) => "--temperature",
            GenerateError::TopK(_) => "--top-k",
            GenerateError::TopP(_) => "--top-p",
            GenerateError::SegmentLen(_) => "--segment-len",
            _ => return CliError::Generate(e),
        };
        CliError::Sampler { flag, source: e }
    }
}

impl CliError {
    /// A [`CliError::Flag`].
    pub fn flag(flag: &'static str, value: impl ToString, reason: impl Into<String>) -> Self {
        CliError::Flag {
            flag,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// A [`CliError::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CliError::Io {
            context: context.into(),
            source,
        }
    }

    /// The process's exit status for this error: 2 for a usage error, a flag's value or a
    /// combination of flags refused before the command does anything (as for clap's own parse
    /// errors), `--device` included (a device that exists but fails to start is 1); 1 for
    /// everything else (configs, data, checkpoints, models).
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Flag { .. }
            | CliError::Conflict(_)
            | CliError::Sampler { .. }
            | CliError::UnknownFormat { .. } => 2,
            CliError::Device(e) if !matches!(e, DeviceError::Init { .. }) => 2,
            _ => 1,
        }
    }
}
