//! The segment-recurrence training loop.

use std::path::PathBuf;
use std::time::Instant;

use burn::config::Config;
use burn::optim::{AdamWConfig, GradientsAccumulator, ModuleOptimizer};
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::TrainerState;
use crate::error::TrainError;
use crate::grads::scale_and_clip;
use crate::metrics::Reporter;
use crate::model::SegmentModel;
use crate::schedule::ScheduleConfig;
use crate::segment::{Segment, SegmentSource};

/// Configuration of a training run.
#[derive(Config, Debug)]
pub struct TrainConfig {
    /// Optimizer steps. Default: 1000.
    #[config(default = 1000)]
    pub steps: usize,
    /// Rows per segment. Default: 8.
    #[config(default = 8)]
    pub batch: usize,
    /// Tokens per row and segment (`tgt_len`). Default: 128.
    #[config(default = 128)]
    pub tgt_len: usize,
    /// Learning-rate schedule (peak lr, warm-up, cosine floor).
    #[config(default = "ScheduleConfig::new()")]
    pub schedule: ScheduleConfig,
    /// AdamW weight decay (decoupled, on every parameter, as `torch.optim.AdamW` over
    /// `model.parameters()`). Default: 0.01.
    #[config(default = 0.01)]
    pub weight_decay: f64,
    /// AdamW's moment decays and epsilon. Default: PyTorch's (0.9, 0.999, 1e-8).
    #[config(default = "AdamConfig::new()")]
    pub adam: AdamConfig,
    /// Clip the global gradient norm to this value. Default: 0.25 (Transformer-XL).
    #[config(default = "Some(0.25)")]
    pub clip_norm: Option<f64>,
    /// Data-parallel model replicas, each training on its share of the batch's rows at the same
    /// time (see [`crate::parallel`]); at most `batch`. `None`: one per CPU thread on `flex`, 1
    /// on every other backend. A resumed run keeps its checkpoint's count. Validation splits its
    /// rows the same way (`memzoo eval` too). Default: none.
    #[config(default = "None")]
    pub replicas: Option<usize>,
    /// Segments whose gradients are summed per optimizer step. Default: 1.
    #[config(default = 1)]
    pub grad_accum: usize,
    /// Seed of every random choice (initialisation, dropout). Before each training step the
    /// trainer reseeds the devices' generators from (seed, step) and sets the model's own
    /// seeded stream from the step ([`crate::parallel::seed_devices`],
    /// [`crate::RecurrentModel::with_train_stream`]): what a step draws depends on nothing
    /// before it, so a resumed run is the straight one. Default: 42.
    #[config(default = 42)]
    pub seed: u64,
    /// Log training metrics every N steps. Default: 10.
    #[config(default = 10)]
    pub log_every: usize,
    /// Evaluate on the validation split every N steps (0: only at the end). Default: 200.
    #[config(default = 200)]
    pub eval_every: usize,
    /// Segments per periodic evaluation (`None`: the whole split). Default: none.
    #[config(default = "None")]
    pub eval_segments: Option<usize>,
    /// Memory length at evaluation (`None`: the training one). Default: none.
    #[config(default = "None")]
    pub eval_mem_len: Option<usize>,
    /// Checkpoint every N steps (0: only at the end). Default: 200.
    #[config(default = 200)]
    pub checkpoint_every: usize,
    /// Checkpoints kept on disk. Default: 2.
    #[config(default = 2)]
    pub keep_checkpoints: usize,
    /// Stop after the step that ends past this many seconds of training (evaluating and
    /// checkpointing as at the last step); `None`: no limit. Default: none.
    #[config(default = "None")]
    pub max_seconds: Option<f64>,
}

impl TrainConfig {
    /// `steps` optimizer steps on batches of `batch` rows of `tgt_len` tokens; every other
    /// field at its default.
    pub fn sized(steps: usize, batch: usize, tgt_len: usize) -> Self {
        Self::new()
            .with_steps(steps)
            .with_batch(batch)
            .with_tgt_len(tgt_len)
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Config(m));
        for (name, v) in [
            ("train.steps", self.steps),
            ("train.batch", self.batch),
            ("train.tgt_len", self.tgt_len),
            ("train.grad_accum", self.grad_accum),
            ("train.log_every", self.log_every),
            ("train.keep_checkpoints", self.keep_checkpoints),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        if let Some(r) = self.replicas {
            crate::parallel::check_replicas(r, self.batch)?;
        }
        if self.eval_segments == Some(0) {
            return bad(
                "train.eval_segments must be positive (leave it unset for the whole split), got 0"
                    .into(),
            );
        }
        if let Some(c) = self.clip_norm
            && !(c.is_finite() && c > 0.0)
        {
            return bad(format!("train.clip_norm must be positive, got {c}"));
        }
        if let Some(t) = self.max_seconds
            && !(t.is_finite() && t > 0.0)
        {
            return bad(format!("train.max_seconds must be positive, got {t}"));
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return bad(format!(
                "train.weight_decay must be >= 0, got {}",
                self.weight_decay
            ));
        }
        self.adam.validate().map_err(TrainError::Config)?;
        self.schedule.validate().map_err(TrainError::Config)
    }

    /// AdamW with this run's weight decay, betas and epsilon.
    pub fn optimizer(&self) -> ModuleOptimizer {
        AdamWConfig::new()
            .with_beta_1(self.adam.beta_1 as f32)
            .with_beta_2(self.adam.beta_2 as f32)
            .with_epsilon(self.adam.epsilon as f32)
            .with_weight_decay(self.weight_decay as f32)
            .init()
    }
}

/// AdamW's moment decays and epsilon (`torch.optim.AdamW`'s `betas` and `eps`):
///
/// `m_t = β₁ m + (1-β₁) g`, `v_t = β₂ v + (1-β₂) g²`,
/// `θ ← θ (1 - lr λ) - lr (m_t / (1-β₁ᵗ)) / (sqrt(v_t / (1-β₂ᵗ)) + ε)`.
///
/// PyTorch's ε = 1e-8, not Burn's default 1e-5: with gradients clipped to a global norm of
/// 0.25 over millions of weights, most `sqrt(v)` are ~1e-5 or smaller, and ε = 1e-5 then
/// halves (or less) the step of most weights.
#[derive(Config, Debug, PartialEq)]
pub struct AdamConfig {
    /// Decay of the first moment. Default: 0.9.
    #[config(default = 0.9)]
    pub beta_1: f64,
    /// Decay of the second moment. Default: 0.999.
    #[config(default = 0.999)]
    pub beta_2: f64,
    /// Added to `sqrt(v̂)` in the denominator. Default: 1e-8 (PyTorch's).
    #[config(default = 1e-8)]
    pub epsilon: f64,
}

impl AdamConfig {
    /// Checks the values, naming the bad one.
    pub fn validate(&self) -> Result<(), String> {
        for (name, b) in [("beta_1", self.beta_1), ("beta_2", self.beta_2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(format!("train.adam.{name} must be in [0, 1), got {b}"));
            }
        }
        if !(self.epsilon.is_finite() && self.epsilon > 0.0) {
            return Err(format!(
                "train.adam.epsilon must be positive, got {}",
                self.epsilon
            ));
        }
        Ok(())
    }
}

/// Evaluation result over a split.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct EvalResult {
    /// Mean cross-entropy per token, nats.
    pub loss: f64,
    /// Bits per character (= loss / ln 2 for byte-level data).
    pub bpc: f64,
    /// Perplexity (= exp(loss)).
    pub ppl: f64,
    /// Tokens scored.
    pub tokens: u64,
    /// Mean cross-entropy (nats) over the targets selected by the data's target mask (e.g. the
    /// recallable positions of the long-range corpus), when it has one.
    pub selected_loss: Option<f64>,
    /// Targets selected by the mask.
    pub selected_tokens: u64,
    /// Share of the selected targets that are the model's most likely token (argmax), when
    /// the data has a target mask.
    #[serde(default)]
    pub selected_accuracy: Option<f64>,
}

impl EvalResult {
    fn from_sum(nats: f64, tokens: u64) -> Self {
        let loss = nats / tokens.max(1) as f64;
        Self {
            loss,
            bpc: loss / std::f64::consts::LN_2,
            ppl: loss.exp(),
            tokens,
            selected_loss: None,
            selected_tokens: 0,
            selected_accuracy: None,
        }
    }

    /// Mean cross-entropy (nats) over the counted targets the mask does not select, when it
    /// selects some but not all.
    pub fn unselected_loss(&self) -> Option<f64> {
        let sel = self.selected_loss?;
        let rest = self
            .tokens
            .checked_sub(self.selected_tokens)
            .filter(|&n| n > 0)?;
        Some((self.loss * self.tokens as f64 - sel * self.selected_tokens as f64) / rest as f64)
    }
}

/// Evaluates `model` over `source` in order, carrying state across segments, its rows split
/// over as many replicas as [`crate::parallel::auto_replicas`] gives (one per thread on `flex`);
/// see [`evaluate_sharded`].
///
/// `max_segments` limits the number of segments (`None`: the whole split). The model runs
/// without autodiff.
pub fn evaluate<M: SegmentModel>(
    model: &M,
    source: &mut dyn SegmentSource,
    len: usize,
    max_segments: Option<usize>,
) -> Result<EvalResult, TrainError> {
    evaluate_sharded(model, source, len, max_segments, None)
}

/// [`evaluate`] with each segment's rows split over `replicas` model replicas that run at the
/// same time (`None`: [`crate::parallel::auto_replicas`]), each carrying the memories of its
/// rows, as training steps do ([`crate::parallel::eval_step_sharded`]). Rows are independent,
/// so the result is the same for every replica count, up to float rounding.
pub fn evaluate_sharded<M: SegmentModel>(
    model: &M,
    source: &mut dyn SegmentSource,
    len: usize,
    max_segments: Option<usize>,
    replicas: Option<usize>,
) -> Result<EvalResult, TrainError> {
    if max_segments == Some(0) {
        return Err(TrainError::Config(
            "evaluating 0 segments: the segment limit must be positive".into(),
        ));
    }
    let model = model.valid();
    let device = model_device(&model)?;
    source.rewind();
    let mut states: Vec<M::State> = Vec::new();
    let mut sums = crate::parallel::EvalSums::default();
    let mut n = 0;
    while let Some(seg) = source.next_segment(len) {
        check_token_ids(&seg, model.vocab_size(), "evaluation")?;
        if states.is_empty() {
            let r = replicas.unwrap_or_else(|| crate::parallel::auto_replicas(&device, seg.batch));
            crate::parallel::check_replicas(r, seg.batch)?;
            states = (0..r).map(|_| M::State::default()).collect();
        }
        sums = sums + crate::parallel::eval_step_sharded(&model, &device, &seg, &mut states)?;
        n += 1;
        if max_segments.is_some_and(|m| n >= m) {
            break;
        }
    }
    if sums.tokens == 0 {
        return Err(TrainError::Data(format!(
            "the evaluation split holds no full segment of {len} tokens"
        )));
    }
    let mut result = EvalResult::from_sum(sums.nats, sums.tokens);
    if sums.selected_tokens > 0 {
        let sel = sums.selected_tokens as f64;
        result.selected_loss = Some(sums.selected_nats / sel);
        result.selected_tokens = sums.selected_tokens;
        result.selected_accuracy = Some(sums.selected_hits / sel);
    }
    Ok(result)
}

/// Every input id and every target but padding must index the model's vocabulary: the first
/// one that does not is named (an embedding lookup or a gather past the table panics in the
/// backend).
fn check_token_ids(seg: &Segment, vocab: usize, split: &str) -> Result<(), TrainError> {
    let targets = seg
        .targets
        .iter()
        .filter(|&&t| seg.pad.is_none_or(|p| t != p));
    match seg
        .inputs
        .iter()
        .chain(targets)
        .find(|&&t| t < 0 || t as usize >= vocab)
    {
        Some(bad) => Err(TrainError::Data(format!(
            "the {split} data holds token id {bad}, outside the model's vocabulary of {vocab} \
             (vocab_size must exceed every id; byte data needs 256)"
        ))),
        None => Ok(()),
    }
}

/// The error that stops a run whose gradient norm is not finite, before the update: it names
/// the parameters whose gradient holds a NaN or an infinity.
fn non_finite_gradient<M: SegmentModel>(
    model: &M,
    grads: &burn::optim::GradientsParams,
    norm: f64,
    step: usize,
) -> TrainError {
    let bad = crate::grads::non_finite(model, grads);
    let names: Vec<String> = bad
        .iter()
        .take(5)
        .map(|(name, n)| format!("`{name}` ({n})"))
        .collect();
    let more = match bad.len() {
        0..=5 => String::new(),
        n => format!(" and {} more", n - 5),
    };
    TrainError::Model(format!(
        "the gradient norm is {norm} at step {step} (before the update; the parameters are \
         unchanged): the gradient of {}{more} is not finite, while the loss was finite: the \
         backward pass produced it",
        if names.is_empty() {
            "the sum of squares overflowed; no single parameter".to_string()
        } else {
            names.join(", ")
        }
    ))
}

/// The error that stops a run whose loss is not finite at `step`, naming its cause where it
/// can be told: parameters that hold NaN or infinities (damaged or imported weights: updates
/// are checked before they are made), or, before any update (`first`), the initial weights
/// (e.g. too large an `init_std`); otherwise the learning rate.
fn non_finite_loss<M: SegmentModel>(model: &M, loss: f64, step: usize, first: bool) -> TrainError {
    let bad = crate::grads::non_finite_params(model);
    if !bad.is_empty() {
        let names: Vec<String> = bad
            .iter()
            .take(5)
            .map(|(name, v)| format!("`{name}` ({v})"))
            .collect();
        let more = match bad.len() {
            0..=5 => String::new(),
            n => format!(" and {} more", n - 5),
        };
        return TrainError::Model(format!(
            "loss is {loss} at step {step}: the parameters {}{more} hold non-finite values \
             (the checkpoint or imported weights are damaged; updates are checked before they \
             are made), not the learning rate",
            names.join(", ")
        ));
    }
    if first {
        return TrainError::Model(format!(
            "loss is {loss} at step {step}, before any update: the initial weights give it \
             (too large an init_std or embedding_std?), not the learning rate"
        ));
    }
    TrainError::Model(format!(
        "loss became {loss} at step {step}; lower train.schedule.lr"
    ))
}

/// The gradient norms (before clipping) of the steps of one logged window: what
/// `metrics.jsonl` records as `grad_norm` (their mean), `grad_norm_max` and `clipped` (the share
/// of the window's steps that `clip_norm` scaled down).
///
/// A window's mean, not its last step's norm: data with a period (documents of one length,
/// every row in phase) makes the norm of single steps periodic, and a last step that falls on
/// the same phase of every period reads as a constant, which an epoch boundary (one step fewer
/// than a multiple of the period) then shifts, as in the default run: the last step's norm went
/// from 0.002 to 2.0 at the epoch boundary (step 3,125) while the loss, the validation and the
/// window's mean (0.15) stayed put.
#[derive(Debug, Default)]
struct NormWindow {
    sum: f64,
    max: f64,
    steps: usize,
    clipped: usize,
}

impl NormWindow {
    fn add(&mut self, norm: f64, clip: Option<f64>) {
        self.sum += norm;
        self.max = self.max.max(norm);
        self.steps += 1;
        if clip.is_some_and(|c| norm > c) {
            self.clipped += 1;
        }
    }

    fn mean(&self) -> f64 {
        self.sum / self.steps.max(1) as f64
    }

    fn clipped_share(&self) -> f64 {
        self.clipped as f64 / self.steps.max(1) as f64
    }
}

/// Result of a training run.
pub struct TrainOutcome<M: SegmentModel> {
    /// The trained model.
    pub model: M,
    /// Steps done in total (including before a resume).
    pub steps: usize,
    /// Last validation result, if any evaluation ran.
    pub valid: Option<EvalResult>,
    /// Every validation result of this run (not those before a resume), with its step.
    pub evaluations: Vec<(usize, EvalResult)>,
    /// Mean training loss (nats, over the counted targets) of the last logged window of steps.
    pub train_loss: Option<f64>,
    /// Whether the user interrupted the run (a checkpoint was saved).
    pub interrupted: bool,
    /// The signal (SIGINT 2, SIGTERM 15) that interrupted the run, if one did.
    pub signal: Option<i32>,
    /// The carried state (memories) of each replica at the end, replica `r` holding the rows
    /// [`crate::parallel::shard_rows`]`(batch, replicas)[r]`, on its device.
    pub states: Vec<M::State>,
}

/// Options of [`train`] beyond the config.
pub struct RunOptions {
    /// Run directory (metrics.jsonl, checkpoints/).
    pub run_dir: PathBuf,
    /// Continue from the latest checkpoint in `run_dir`.
    pub resume: bool,
    /// Nothing on stdout: no dashboard, no log lines (`metrics.jsonl` is written all the same;
    /// notes such as an interruption go to stderr). Otherwise burn-train's dashboard on a
    /// terminal, one plain line per record when stdout is not one.
    pub quiet: bool,
}

/// Trains `model` (on an autodiff device) on `train_data`, evaluating on `valid_data`.
///
/// Memory is carried across steps per batch row and detached every step (truncated BPTT); a
/// model with [`bptt_segments`](crate::RecurrentModel::bptt_segments) `k > 1` (the RMT) reads
/// `k` consecutive segments per micro-step, its memory in the graph across them
/// ([`crate::unroll`]).
/// Checkpoints (model, optimizer, schedule position, data position, carried state) are
/// written atomically every `checkpoint_every` steps and at the end; with `resume`, the run
/// continues from the latest one and loses nothing else.
pub fn train<M: SegmentModel>(
    model: M,
    config: &TrainConfig,
    train_data: &mut dyn SegmentSource,
    valid_data: Option<&mut dyn SegmentSource>,
    options: &RunOptions,
) -> Result<TrainOutcome<M>, TrainError> {
    train_on_devices(model, config, &[], train_data, valid_data, options)
}

/// [`train`] on several devices of one backend (`devices`, autodiff devices; empty or one
/// device: [`train`] on the model's device): each step splits the batch's rows over the
/// devices, one replica per device carrying its rows' memories there, and sums their gradients
/// on the first device, the model's, where the optimizer makes one update (see "Several
/// devices" in [`crate::parallel`]). `train.replicas` is then the number of devices (unset, or
/// equal to it); a run resumes on as many devices (or on one, with as many replicas) as it
/// was trained on. Validation runs on the first device.
pub fn train_on_devices<M: SegmentModel>(
    mut model: M,
    config: &TrainConfig,
    devices: &[Device],
    train_data: &mut dyn SegmentSource,
    mut valid_data: Option<&mut dyn SegmentSource>,
    options: &RunOptions,
) -> Result<TrainOutcome<M>, TrainError> {
    config.validate()?;
    if !options.resume
        && let Some(found) = crate::checkpoint::existing_run(&options.run_dir)
    {
        // A second run there would append to metrics.jsonl and prune the first run's
        // checkpoints together with its own: two runs are never mixed.
        return Err(TrainError::Config(format!(
            "run directory {} already holds a run ({found}): continue it with --resume, train \
             into a new --run-dir, or pass --overwrite to replace it",
            options.run_dir.display()
        )));
    }
    std::fs::create_dir_all(&options.run_dir).map_err(|e| {
        TrainError::io(
            format!("cannot create run directory {}", options.run_dir.display()),
            e,
        )
    })?;
    let device = model_device(&model)?;
    if let Some(first) = devices.first()
        && *first != device
    {
        return Err(TrainError::Config(format!(
            "the model is on {device:?}, but the first of the training devices is {first:?}: \
             the model lives on the first device (where the gradients are summed and the \
             optimizer runs)"
        )));
    }
    // Several devices: one replica each, in the list's order.
    let spread = devices.len() > 1;
    if spread {
        let n = devices.len();
        if config.replicas.is_some_and(|r| r != n) || n > config.batch {
            return Err(TrainError::Config(format!(
                "training on {n} devices runs one replica per device, each on its share of the \
                 batch's rows: train.replicas must be unset or {n} (got {:?}), and train.batch \
                 at least {n} (got {})",
                config.replicas, config.batch
            )));
        }
    }
    let mut optim = config.optimizer();
    let mut replicas = match spread {
        true => devices.len(),
        false => config
            .replicas
            .unwrap_or_else(|| crate::parallel::auto_replicas(&device, config.batch)),
    };
    let mut states: Vec<M::State> = Vec::new();
    let mut start = 0;
    let mut dropped_records = 0;
    let mut tokens: u64 = 0;
    let ckpt_dir = options.run_dir.join("checkpoints");

    if options.resume {
        match crate::checkpoint::latest(&ckpt_dir)? {
            Some(dir) => {
                let state_devices = match spread {
                    true => devices.to_vec(),
                    false => vec![device.clone()],
                };
                let restored = crate::checkpoint::load_on(&dir, model, optim, &state_devices)?;
                if !restored.model.accepts_family(&restored.trainer.family) {
                    return Err(TrainError::Checkpoint(format!(
                        "{} holds a `{}` model, this run trains `{}`",
                        dir.display(),
                        restored.trainer.family,
                        restored.model.family()
                    )));
                }
                // A step-0 checkpoint (an import) has consumed no data and carries no memory:
                // its batch, row layout and replica count bind nothing yet.
                let fresh = restored.trainer.step == 0;
                if spread && !fresh && restored.trainer.replicas != devices.len() {
                    return Err(TrainError::Config(format!(
                        "{} was trained with {} replicas (each carries the memories of its \
                         rows), which cannot be spread over {} devices: resume it on {} devices, \
                         or on one",
                        dir.display(),
                        restored.trainer.replicas,
                        devices.len(),
                        restored.trainer.replicas
                    )));
                }
                if let Some(asked) = config.replicas
                    && asked != restored.trainer.replicas
                    && !fresh
                {
                    return Err(TrainError::Config(format!(
                        "train.replicas = {asked}, but {} was trained with {} replicas (each \
                         carries the memories of its rows): leave train.replicas unset or set \
                         it to {}",
                        dir.display(),
                        restored.trainer.replicas,
                        restored.trainer.replicas
                    )));
                }
                model = restored.model;
                optim = restored.optim;
                if !fresh {
                    replicas = restored.trainer.replicas;
                    states = restored.states;
                    train_data.restore(&restored.trainer.data_position)?;
                }
                start = restored.trainer.step;
                tokens = restored.trainer.tokens;
                dropped_records = crate::metrics::drop_records_after(&options.run_dir, start)?;
            }
            None => {
                return Err(TrainError::Checkpoint(format!(
                    "--resume: no checkpoint in {}",
                    ckpt_dir.display()
                )));
            }
        }
    }

    crate::parallel::check_replicas(replicas, config.batch)?;
    if states.is_empty() {
        states = (0..replicas).map(|_| M::State::default()).collect();
    }
    let mut reporter = Reporter::new(&options.run_dir, config.steps, start, options.quiet)?;
    // Ctrl-C / SIGTERM: finish the step, checkpoint, stop (see `crate::signals`).
    let signals = crate::signals::StopSignals::install()?;
    // Shard `r` runs on `placement[r]`.
    let placement = match spread {
        true => devices.to_vec(),
        false => vec![device.clone(); replicas],
    };
    if spread {
        reporter.note(&format!(
            "{replicas} devices, {} rows each (one replica per device)",
            config.batch / replicas
        ));
    } else if replicas > 1 {
        reporter.note(&format!(
            "{replicas} data-parallel replicas of {} rows",
            config.batch / replicas
        ));
    }
    if start > 0 {
        reporter.note(&format!("resumed at step {start}"));
    }
    if dropped_records > 0 {
        reporter.note(&format!(
            "dropped {dropped_records} lines of metrics.jsonl past step {start} (the steps \
             after the checkpoint are trained again)"
        ));
    }
    let mut valid = None;
    let (mut evaluations, mut train_loss) = (Vec::new(), None);
    let started = Instant::now();
    let mut window = (0.0, 0usize, 0u64, Instant::now());
    // Gradient norms of the logged window of steps (before clipping).
    let mut norms = NormWindow::default();
    let mut step = start;
    let mut interrupted = false;
    while step < config.steps {
        let mut acc = GradientsAccumulator::<M>::new();
        let mut loss_sum = 0.0;
        for micro in 0..config.grad_accum {
            // What this micro-step draws (Burn's dropout masks from the devices' generators,
            // the model's seeded masks and rotations) is a function of (train.seed, step,
            // micro-step) alone: a resumed run draws what the straight run did.
            let stream = (step * config.grad_accum + micro) as u64;
            crate::parallel::seed_devices(&placement, config.seed, stream);
            // `k` consecutive segments (backpropagation through `k`, `bptt_segments`; 1 for
            // every family but the RMT). An epoch that ends inside them restarts them.
            let k = model.bptt_segments().max(1);
            let mut segs: Vec<Segment> = Vec::with_capacity(k);
            while segs.len() < k {
                match train_data.next_segment(config.tgt_len) {
                    Some(seg) => segs.push(seg),
                    None => {
                        // A new epoch: rows restart, so memories restart too.
                        train_data.rewind();
                        states.iter_mut().for_each(|s| *s = M::State::default());
                        segs.clear();
                        segs.push(train_data.next_segment(config.tgt_len).ok_or_else(|| {
                            TrainError::Data(format!(
                                "the training split holds no full segment of {} x {} tokens",
                                config.batch, config.tgt_len
                            ))
                        })?);
                    }
                }
            }
            for seg in &segs {
                check_token_ids(seg, model.vocab_size(), "training")?;
            }
            let (loss, grads) = crate::unroll::train_unroll_streamed(
                &model,
                &device,
                &placement,
                &segs,
                &mut states,
                Some(crate::parallel::TrainStream {
                    seed: config.seed,
                    stream,
                }),
            )?;
            if !loss.is_finite() {
                return Err(non_finite_loss(&model, loss, step + 1, step == 0));
            }
            loss_sum += loss;
            let read: usize = segs.iter().map(|s| s.batch * s.len).sum();
            tokens += read as u64;
            window.2 += read as u64;
            acc.accumulate(&model, grads);
        }
        let (grads, norm) = scale_and_clip(
            &model,
            acc.grads(),
            1.0 / config.grad_accum as f64,
            config.clip_norm,
        );
        if !norm.is_finite() {
            return Err(non_finite_gradient(&model, &grads, norm, step + 1));
        }
        let lr = config.schedule.lr_at(step, config.steps);
        model = optim.step(lr, model, grads);
        step += 1;
        window.0 += loss_sum / config.grad_accum as f64;
        window.1 += 1;
        norms.add(norm, config.clip_norm);
        let out_of_time = config
            .max_seconds
            .is_some_and(|t| started.elapsed().as_secs_f64() > t);
        let last = step == config.steps || out_of_time;

        if step % config.log_every == 0 || last {
            let loss = window.0 / window.1 as f64;
            train_loss = Some(loss);
            let tps = window.2 as f64 / window.3.elapsed().as_secs_f64();
            let mut values = vec![
                ("loss", loss),
                ("bpc", loss / std::f64::consts::LN_2),
                ("lr", lr),
                ("tokens_per_s", tps),
                ("grad_norm", norms.mean()),
                ("grad_norm_max", norms.max),
                ("clipped", norms.clipped_share()),
            ];
            values.extend(crate::metrics::allocator_mib(&placement));
            reporter.record(step, "train", &values)?;
            window = (0.0, 0, 0, Instant::now());
            norms = NormWindow::default();
        }
        let eval_now = (config.eval_every > 0 && step % config.eval_every == 0) || last;
        if eval_now && let Some(v) = valid_data.as_deref_mut() {
            let eval_model = match config.eval_mem_len {
                Some(m) => model.clone().with_eval_mem_len(m),
                None => model.clone(),
            };
            // Sharded as the training steps are (a fresh memory per shard).
            let r = evaluate_sharded(
                &eval_model,
                v,
                config.tgt_len,
                config.eval_segments,
                Some(replicas),
            )?;
            let mut values = vec![("loss", r.loss), ("bpc", r.bpc), ("ppl", r.ppl)];
            if let Some(sel) = r.selected_loss {
                values.push(("selected_bpc", sel / std::f64::consts::LN_2));
            }
            if let Some(acc) = r.selected_accuracy {
                values.push(("selected_accuracy", acc));
            }
            reporter.record(step, "valid", &values)?;
            valid = Some(r);
            evaluations.push((step, r));
            window.3 = Instant::now();
        }
        interrupted = reporter.interrupter.should_stop() || signals.caught().is_some();
        let ckpt_now = (config.checkpoint_every > 0 && step % config.checkpoint_every == 0)
            || last
            || interrupted;
        if ckpt_now {
            let trainer = TrainerState {
                family: model.family().to_string(),
                step,
                tokens,
                data_position: train_data.position(),
                schedule: config.schedule.clone(),
                total_steps: config.steps,
                replicas,
            };
            crate::checkpoint::save(
                &ckpt_dir,
                &model,
                &optim,
                &states,
                &trainer,
                config.keep_checkpoints,
            )?;
            // A run this one replaces (`--overwrite`) was kept aside until now.
            crate::replace::drop_set_aside(&options.run_dir)?;
            window.3 = Instant::now();
        }
        if interrupted {
            let by = match signals.caught() {
                Some(crate::signals::SIGINT) => " by SIGINT".to_string(),
                Some(crate::signals::SIGTERM) => " by SIGTERM".to_string(),
                Some(s) => format!(" by signal {s}"),
                None => String::new(),
            };
            reporter.note(&format!(
                "interrupted{by} at step {step}; checkpoint saved (continue with --resume)"
            ));
            break;
        }
        if out_of_time && step < config.steps {
            reporter.note(&format!(
                "stopped at step {step} of {}: train.max_seconds ({}) reached",
                config.steps,
                config.max_seconds.unwrap_or_default()
            ));
            break;
        }
    }
    reporter.finish();
    Ok(TrainOutcome {
        model,
        steps: step,
        valid,
        evaluations,
        train_loss,
        interrupted,
        signal: signals.caught(),
        states,
    })
}

/// The device a model's parameters live on (its first), for the tensors fed to it.
pub(crate) fn model_device<M: burn::module::Module>(model: &M) -> Result<Device, TrainError> {
    model
        .devices()
        .into_iter()
        .next()
        .ok_or_else(|| TrainError::Model("model has no parameters".into()))
}
