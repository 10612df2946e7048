//! memzoo-data's generated tasks trained by [`train`] and scored by
//! [`evaluate`] on the positions each task selects:
//!
//! - [`duplication`]: the Reformer paper's `0 w 0 w` copy task; accuracy on the second copy
//!   with several numbers of hash rounds;
//! - [`recall`]: the long-range recall comparison of a Memorizing Transformer and the same
//!   Transformer-XL without kNN memory; loss and accuracy on the long-gap recall positions.

use burn::config::Config;
use burn::tensor::Device;
use memzoo_data::{Duplication, RecallStream, RecallTask, TaskStream};
use memzoo_stack::{MemorizingConfig, MemorizingTransformer};
use memzoo_stack::{ReformerConfig, ReformerLm};

use crate::error::TrainError;
use crate::schedule::ScheduleConfig;
use crate::trainer::{AdamConfig, RunOptions, TrainConfig, evaluate, train};

/// Settings of [`duplication`]: a small Reformer trained on the duplication task.
#[derive(Config, Debug)]
pub struct DuplicationConfig {
    /// The model; `max_seq_len` must cover `len`, `vocab_size` must cover `vocab`. Its
    /// `n_rounds` is replaced by `train_rounds`.
    pub model: ReformerConfig,
    /// Sequence length `2 (|w| + 1)`. Default: 64.
    #[config(default = 64)]
    pub len: usize,
    /// Symbols `0..vocab` (0 is the separator). Default: 32.
    #[config(default = 32)]
    pub vocab: usize,
    /// Training steps. Default: 500.
    #[config(default = 500)]
    pub steps: usize,
    /// Stop after the step that ends past this many seconds (0: no limit). Default: 0.
    #[config(default = 0.0)]
    pub max_seconds: f64,
    /// Sequences per step. Default: 16.
    #[config(default = 16)]
    pub batch: usize,
    /// AdamW learning rate, constant. Default: 1e-3.
    #[config(default = 1e-3)]
    pub lr: f64,
    /// Hash rounds used in training. Default: 2.
    #[config(default = 2)]
    pub train_rounds: usize,
    /// Hash rounds evaluated. Default: [1, 2, 4].
    #[config(default = "vec![1, 2, 4]")]
    pub eval_rounds: Vec<usize>,
    /// Sequences in the evaluation set (rounded up to whole batches). Default: 64.
    #[config(default = 64)]
    pub eval_size: usize,
    /// Seed of the data. Default: 0.
    #[config(default = 0)]
    pub seed: u64,
    /// Log the training loss every this many steps (0: at the end only). Default: 0.
    #[config(default = 0)]
    pub log_every: usize,
}

/// What [`duplication`] reached.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DuplicationReport {
    /// Steps taken.
    pub steps: usize,
    /// Wall time of training (seconds).
    pub seconds: f64,
    /// Training loss on the second copies, mean of the last logged window (nats).
    pub final_loss: f64,
    /// `(hash rounds, accuracy on the second copies)` for each evaluated round count.
    pub accuracy: Vec<(usize, f64)>,
}

/// The optimizer of the tasks: AdamW with a constant learning rate, no clipping, and the
/// moments, epsilon (Burn's 1e-5) and `weight_decay` the tasks were tuned with.
fn task_train_config(
    steps: usize,
    batch: usize,
    len: usize,
    lr: f64,
    weight_decay: f64,
) -> TrainConfig {
    TrainConfig::sized(steps, batch, len)
        .with_schedule(ScheduleConfig::cosine(lr, 0, 1.0))
        .with_adam(AdamConfig::new().with_epsilon(1e-5))
        .with_weight_decay(weight_decay)
        .with_clip_norm(None)
        .with_checkpoint_every(0)
        .with_keep_checkpoints(1)
}

/// Trains `cfg.model` (with `train_rounds` hash rounds) on the duplication task on `device`
/// (an autodiff device) with [`train`] into `options.run_dir`, the loss counting the second
/// copies only; then evaluates the accuracy on the second copies of a held-out set with each
/// of `cfg.eval_rounds` hash rounds.
pub fn duplication(
    cfg: &DuplicationConfig,
    device: &Device,
    options: &RunOptions,
) -> Result<DuplicationReport, TrainError> {
    check_duplication(cfg)?;
    let lsh = cfg.model.lsh.clone().with_n_rounds(cfg.train_rounds);
    let model = cfg.model.clone().with_lsh(lsh).init(device)?;
    duplication_from(model, cfg, options)
}

/// [`duplication`]'s settings, refused naming the bad value.
fn check_duplication(cfg: &DuplicationConfig) -> Result<(), TrainError> {
    let bad = |m: String| Err(TrainError::Config(m));
    if cfg.train_rounds == 0 || cfg.eval_rounds.contains(&0) {
        return bad(format!(
            "hash rounds must be positive: train_rounds {}, eval_rounds {:?}",
            cfg.train_rounds, cfg.eval_rounds
        ));
    }
    if cfg.len < 4 || !cfg.len.is_multiple_of(2) || cfg.vocab < 2 {
        return bad(format!(
            "duplication needs an even len >= 4 and vocab >= 2, got len {}, vocab {}",
            cfg.len, cfg.vocab
        ));
    }
    if cfg.vocab > cfg.model.vocab_size || cfg.len > cfg.model.max_seq_len {
        return bad(format!(
            "duplication vocab {} / len {} exceed the model's vocab_size {} / max_seq_len {}",
            cfg.vocab, cfg.len, cfg.model.vocab_size, cfg.model.max_seq_len
        ));
    }
    if cfg.eval_size == 0 {
        return bad("the duplication eval_size must be positive, got 0".into());
    }
    Ok(())
}

/// [`duplication`] from given weights: `model` is `cfg.model` with `cfg.train_rounds` hash
/// rounds, initialised by the caller (e.g. from its own seeded generator).
pub fn duplication_from(
    model: ReformerLm,
    cfg: &DuplicationConfig,
    options: &RunOptions,
) -> Result<DuplicationReport, TrainError> {
    check_duplication(cfg)?;
    let data = |seed| Duplication::new(cfg.batch, cfg.len, cfg.vocab, seed);
    let mut train_data = TaskStream::endless(data(cfg.seed)?);
    let eval_batches = cfg.eval_size.div_ceil(cfg.batch.max(1));
    let mut valid_data = TaskStream::limited(data(!cfg.seed)?, eval_batches)?;
    let config = task_train_config(cfg.steps, cfg.batch, cfg.len, cfg.lr, 0.0)
        .with_log_every(if cfg.log_every == 0 {
            cfg.steps.max(1)
        } else {
            cfg.log_every
        })
        .with_max_seconds((cfg.max_seconds > 0.0).then_some(cfg.max_seconds));
    let start = std::time::Instant::now();
    let out = train(model, &config, &mut train_data, None, options)?;
    let seconds = start.elapsed().as_secs_f64();
    let accuracy = cfg
        .eval_rounds
        .iter()
        .map(|&r| {
            let model = out.model.clone().with_eval_rounds(r);
            let result = evaluate(&model, &mut valid_data, cfg.len, None)?;
            Ok((r, result.selected_accuracy.unwrap_or(f64::NAN)))
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    Ok(DuplicationReport {
        steps: out.steps,
        seconds,
        final_loss: out.train_loss.unwrap_or(f64::NAN),
        accuracy,
    })
}

/// Settings of [`recall`] beyond the model and the task.
#[derive(Config, Debug)]
pub struct RecallConfig {
    /// Rows per batch. Default: 16.
    #[config(default = 16)]
    pub batch: usize,
    /// Training steps. Default: 6000.
    #[config(default = 6000)]
    pub steps: usize,
    /// AdamW learning rate, constant. Default: 3e-3.
    #[config(default = 3e-3)]
    pub lr: f64,
    /// Seed of the training and validation data. Default: 7.
    #[config(default = 7)]
    pub seed: u64,
    /// Segments of the validation set (long gaps only). Default: 60.
    #[config(default = 60)]
    pub eval_segments: usize,
    /// Validations during training (the curve), the last at the end. Default: 10.
    #[config(default = 10)]
    pub evaluations: usize,
}

/// Result of [`recall`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecallResult {
    /// Training loss over all positions, mean of the last tenth of the steps (nats).
    pub train_loss: f64,
    /// Validation loss over all positions (nats), long gaps only.
    pub valid_loss: f64,
    /// Validation loss on the long-gap recall targets (nats).
    pub recall_loss: f64,
    /// Validation accuracy (argmax) on the long-gap recall targets.
    pub recall_accuracy: f64,
    /// Recall targets scored in validation.
    pub recall_targets: u64,
    /// Validation curve: (step, loss over all positions, loss on the recall targets).
    pub curve: Vec<(usize, f64, f64)>,
    /// Wall seconds of training (with the validations).
    pub train_s: f64,
}

/// Trains `model` (its vocabulary must cover `task.vocab()`) on `device` (an autodiff device)
/// on the recall `task` with [`train`] into `options.run_dir`: the next-token loss on every
/// position, AdamW at a constant `lr`; validates `cfg.evaluations` times on
/// `cfg.eval_segments` segments of fresh long-gap documents (memory carried), scoring the
/// long-gap recall targets.
pub fn recall(
    model: &MemorizingConfig,
    task: &RecallTask,
    cfg: &RecallConfig,
    device: &Device,
    options: &RunOptions,
) -> Result<RecallResult, TrainError> {
    recall_from(model.init(device)?, task, cfg, options)
}

/// [`recall`] from given weights (e.g. drawn by the caller from its own seeded generator).
pub fn recall_from(
    model: MemorizingTransformer,
    task: &RecallTask,
    cfg: &RecallConfig,
    options: &RunOptions,
) -> Result<RecallResult, TrainError> {
    if cfg.steps == 0 || cfg.batch == 0 || cfg.eval_segments == 0 || cfg.evaluations == 0 {
        return Err(TrainError::Config(format!(
            "recall steps, batch, eval_segments and evaluations must be positive, got {}, {}, \
             {} and {}",
            cfg.steps, cfg.batch, cfg.eval_segments, cfg.evaluations
        )));
    }
    let mut train_data = TaskStream::endless(RecallStream::new(task.clone(), cfg.batch, cfg.seed)?);
    let eval_task = RecallTask {
        long_fraction: 1.0,
        ..task.clone()
    };
    let eval_stream = RecallStream::new(eval_task, cfg.batch, cfg.seed ^ 0xabcdef)?;
    let mut valid_data = TaskStream::limited(eval_stream, cfg.eval_segments)?;
    let every = (cfg.steps / cfg.evaluations).max(1);
    // Burn's AdamW defaults the task was tuned with: weight decay 1e-4.
    let config = task_train_config(cfg.steps, cfg.batch, task.seg_len, cfg.lr, 1e-4)
        .with_log_every(every)
        .with_eval_every(every);
    let start = std::time::Instant::now();
    let out = train(
        model,
        &config,
        &mut train_data,
        Some(&mut valid_data),
        options,
    )?;
    let train_s = start.elapsed().as_secs_f64();
    let last = out
        .valid
        .ok_or_else(|| TrainError::Data("the recall run evaluated nothing".into()))?;
    let curve = out
        .evaluations
        .iter()
        .map(|(s, r)| (*s, r.loss, r.selected_loss.unwrap_or(f64::NAN)))
        .collect();
    Ok(RecallResult {
        train_loss: out.train_loss.unwrap_or(f64::NAN),
        valid_loss: last.loss,
        recall_loss: last.selected_loss.unwrap_or(f64::NAN),
        recall_accuracy: last.selected_accuracy.unwrap_or(f64::NAN),
        recall_targets: last.selected_tokens,
        curve,
        train_s,
    })
}
