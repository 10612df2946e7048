//! Shared parts of the examples: their common flags (clap), the small models, and training on
//! the copied-text task ([`CopyTask`], from memzoo-data) with memzoo's trainer.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
pub use memzoo::data::{CopyTask, CopyText, TaskStream, copy_text};
use memzoo::prelude::*;
use memzoo::train::{
    AdamConfig, RunOptions, ScheduleConfig, SegmentModel, TrainConfig, evaluate, train,
};

/// Flags every training example takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Device: flex, wgpu, tch, cuda, ... (`memzoo devices` lists them).
    #[arg(long, default_value = "flex")]
    pub device: String,
    /// Run directory for the trainer's metrics.jsonl and checkpoint (must not hold a run);
    /// default: a scratch directory, removed at the end.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
}

impl Common {
    /// The device, after tuning the allocator to keep freed tensor memory
    /// ([`memzoo::backend::tune_allocator`]).
    pub fn device(&self) -> Result<Device, String> {
        memzoo::backend::tune_allocator();
        memzoo::backend::parse_device(&self.device).map_err(|e| e.to_string())
    }

    /// The run directory to train into.
    pub fn run_dir(&self, example: &str) -> RunDir {
        match &self.run_dir {
            Some(dir) => RunDir {
                dir: dir.clone(),
                scratch: false,
            },
            None => RunDir::scratch(example),
        }
    }
}

/// The flags of the copied-text task (defaults: [`CopyTask::default`]).
#[derive(clap::Args, Debug, Clone)]
pub struct CopyArgs {
    /// Letters per passage.
    #[arg(long, default_value_t = 6)]
    pub passage: usize,
    /// Dots before each repeat.
    #[arg(long, default_value_t = 1)]
    pub gap: usize,
    /// Repeats per document.
    #[arg(long, default_value_t = 6)]
    pub repeats: usize,
    /// Tokens per segment.
    #[arg(long, default_value_t = 4)]
    pub seg_len: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
}

impl CopyArgs {
    /// The task these flags describe.
    pub fn task(&self) -> CopyTask {
        CopyTask {
            passage: self.passage,
            gap: self.gap,
            repeats: self.repeats,
            seg_len: self.seg_len,
            batch: self.batch,
        }
    }
}

/// A run directory; a scratch one is removed on drop.
pub struct RunDir {
    dir: PathBuf,
    scratch: bool,
}

impl RunDir {
    /// A fresh directory under the system's temp dir, removed on drop.
    pub fn scratch(example: &str) -> Self {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "memzoo-example-{example}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Self { dir, scratch: true }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.scratch {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The device from `--device` (default `flex`) on the command line, or exit with the error;
/// also keeps freed tensor memory in the process. For the examples that read their flags with
/// [`arg`]; the others use [`Common`].
pub fn device_from_args() -> Device {
    let common = Common {
        device: arg("--device").unwrap_or_else(|| "flex".into()),
        run_dir: None,
    };
    common.device().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    })
}

/// The value of `--name VALUE` on the command line, if given (for the generation examples,
/// which do not use clap yet).
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The parsed value of `--name VALUE`, `default` when absent; exits with a message naming the
/// flag when the value does not parse.
pub fn arg_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match arg(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("error: {name} {v}: not a valid value");
            std::process::exit(2)
        }),
    }
}

/// Nats to bits.
pub fn bits(nats: f64) -> f64 {
    nats / std::f64::consts::LN_2
}

/// The small XL of the examples: 2 layers, d_model 32, 4 heads, d_inner 64, no dropout, the
/// embedding drawn from N(0, 0.1).
pub fn small_xl(mem_len: usize) -> XlConfig {
    XlConfig::new()
        .with_n_layers(2)
        .with_d_model(32)
        .with_n_heads(4)
        .with_d_inner(64)
        .with_mem_len(mem_len)
        .with_dropout(0.0)
        // The tied output's logits start at a scale ~ d_model * embedding_std: HF's 0.02 gives
        // XL-small (d_model 256) ~5, this d_model of 32 only ~0.6, and the copy was then not
        // learnt in 1,000 steps (4.9 bits); 0.1 gives ~3 and learns it (0.3 bits).
        .with_embedding_std(Some(0.1))
}

/// The small Memorizing Transformer of the examples: 3 pre-LN layers (the middle one with
/// kNN attention when `knn`), d_model 32, 4 heads x 8, T5 positions, XL memory 8 (none
/// unless `xl_memory`), top-8 retrieval from up to 1,024 entries per row and head (exact
/// search: `auto` picks it for small memories).
pub fn small_memorizing(knn: bool, xl_memory: bool) -> memzoo::stack::MemorizingConfig {
    use memzoo::relative::{PositionConfig, PositionKind};
    let xl = XlConfig::new()
        .with_n_layers(3)
        .with_d_model(32)
        .with_n_heads(4)
        .with_d_inner(64)
        .with_mem_len(8)
        .with_pre_ln(true)
        .with_dropout(0.0)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5));
    memzoo::stack::MemorizingConfig::new()
        .with_xl(xl)
        .with_knn_layers(if knn { vec![1] } else { vec![] })
        .with_knn(
            memzoo::stack::KnnLayerConfig::new()
                .with_top_k(8)
                .with_max_memories(1024),
        )
        .with_xl_memory(xl_memory)
}

/// How [`train_copy`] trains: AdamW (PyTorch's epsilon, no weight decay, no clipping) at `lr`
/// after a linear warm-up of `warmup` steps; every `log_every` steps (0: at the end only) the
/// trainer prints the training loss and the losses on 32 held-out segments, `selected_bpc`
/// being the repeated letters.
#[derive(Debug, Clone, Copy)]
pub struct CopyTraining {
    /// Optimizer steps (one segment each).
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Log and validate every this many steps (0: at the end only, without validation).
    pub log_every: usize,
}

/// Trains `model` (on an autodiff device) on fresh segments of `task` with memzoo's trainer
/// into `run_dir`, carrying the memory from segment to segment.
pub fn train_copy<M: SegmentModel>(
    model: M,
    task: &CopyTask,
    how: CopyTraining,
    run_dir: &Path,
) -> Result<M, String> {
    let text = |seed| CopyText::new(*task, seed).map_err(|e| e.to_string());
    let mut train_data = TaskStream::endless(text(7)?);
    let mut valid_data = TaskStream::limited(text(99)?, 32).map_err(|e| e.to_string())?;
    let config = TrainConfig::sized(how.steps, task.batch, task.seg_len)
        .with_schedule(ScheduleConfig::cosine(how.lr, how.warmup, 1.0))
        .with_adam(AdamConfig::new())
        .with_weight_decay(0.0)
        .with_clip_norm(None)
        .with_log_every(if how.log_every == 0 {
            how.steps
        } else {
            how.log_every
        })
        .with_eval_every(how.log_every)
        .with_checkpoint_every(0)
        .with_keep_checkpoints(1);
    let valid: Option<&mut dyn memzoo::train::SegmentSource> = match how.log_every {
        0 => None,
        _ => Some(&mut valid_data),
    };
    let options = RunOptions {
        run_dir: run_dir.to_path_buf(),
        resume: false,
        quiet: true,
    };
    train(model, &config, &mut train_data, valid, &options)
        .map(|out| out.model)
        .map_err(|e| e.to_string())
}

/// Mean losses (bits) of `model` on `segments` fresh segments of `task` drawn with `seed`,
/// memory carried: `(repeated letters, the rest)`.
pub fn eval_copy<M: SegmentModel>(
    model: &M,
    task: &CopyTask,
    segments: usize,
    seed: u64,
) -> Result<(f64, f64), String> {
    let text = CopyText::new(*task, seed).map_err(|e| e.to_string())?;
    let mut data = TaskStream::limited(text, segments).map_err(|e| e.to_string())?;
    let r = evaluate(model, &mut data, task.seg_len, None).map_err(|e| e.to_string())?;
    let nan = f64::NAN;
    Ok((
        bits(r.selected_loss.unwrap_or(nan)),
        bits(r.unselected_loss().unwrap_or(nan)),
    ))
}

/// [`train_copy`] of an XL with a warm-up of `warmup` steps into a scratch run directory
/// (for the generation examples).
pub fn train_on_copy_task(
    model: TransformerXl,
    task: &CopyTask,
    steps: usize,
    lr: f64,
    warmup: usize,
    log_every: usize,
) -> Result<TransformerXl, String> {
    let how = CopyTraining {
        steps,
        lr,
        warmup,
        log_every,
    };
    train_copy(model, task, how, RunDir::scratch("xl").path())
}

/// The copied-text task of the Memorizing examples: documents of 49 tokens read in 16 rows of
/// 7-token segments, so that a document starts at a segment boundary (where the row's kNN
/// memory is cleared).
pub fn memorizing_task() -> CopyTask {
    CopyTask {
        seg_len: 7,
        ..CopyTask::default()
    }
}

/// [`train_copy`] of a Memorizing Transformer on [`memorizing_task`] with 20 warm-up steps
/// into a scratch run directory (for the generation examples).
pub fn train_memorizing(
    model: memzoo::stack::MemorizingTransformer,
    steps: usize,
    lr: f64,
    log_every: usize,
) -> Result<memzoo::stack::MemorizingTransformer, String> {
    let how = CopyTraining {
        steps,
        lr,
        warmup: 20,
        log_every,
    };
    train_copy(
        model,
        &memorizing_task(),
        how,
        RunDir::scratch("memorizing").path(),
    )
}

/// Ends the program with `error: <message>` and exit code 1 if `result` is an error.
pub fn exit_on_error(result: Result<(), String>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests;
