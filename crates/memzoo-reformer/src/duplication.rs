//! The duplication task of the Reformer paper (sec. 5): sequences `0 w 0 w`, where `w` is a
//! random string of symbols `1..vocab`; a model must copy the first half into the second.

use std::time::Instant;

use burn::config::Config;
use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::attention::ForwardOptions;
use crate::error::ReformerError;
use crate::model::{ReformerConfig, ReformerLm};
use crate::rng::mix;

/// A batch of the duplication task as language-model inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct DuplicationBatch {
    /// `[batch, len]` sequences `0 w 0 w`, row-major.
    pub tokens: Vec<i64>,
    /// `[batch, len]` next tokens (the last position repeats its own token).
    pub targets: Vec<i64>,
    /// `[batch, len]` 1 where the target is a symbol of the second copy of `w`, else 0.
    pub weights: Vec<f32>,
    /// Batch size.
    pub batch: usize,
    /// Sequence length `2 (|w| + 1)`.
    pub len: usize,
}

/// Generates `batch` sequences `0 w 0 w` of length `len` (even, >= 4), symbols in `1..vocab`.
pub fn generate(
    batch: usize,
    len: usize,
    vocab: usize,
    seed: u64,
) -> Result<DuplicationBatch, ReformerError> {
    if len < 4 || !len.is_multiple_of(2) || vocab < 2 {
        return Err(ReformerError::Config(format!(
            "duplication needs an even len >= 4 and vocab >= 2, got len {len}, vocab {vocab}"
        )));
    }
    let half = len / 2;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tokens = Vec::with_capacity(batch * len);
    let mut targets = Vec::with_capacity(batch * len);
    let mut weights = Vec::with_capacity(batch * len);
    for _ in 0..batch {
        let w: Vec<i64> = (1..half)
            .map(|_| rng.random_range(1..vocab as i64))
            .collect();
        let mut seq = vec![0i64];
        seq.extend(&w);
        seq.push(0);
        seq.extend(&w);
        for i in 0..len {
            tokens.push(seq[i]);
            targets.push(if i + 1 < len { seq[i + 1] } else { seq[i] });
            // target seq[i + 1] lies in the second w: i + 1 in half + 1 .. len
            weights.push(if i + 1 > half && i + 1 < len {
                1.0
            } else {
                0.0
            });
        }
    }
    Ok(DuplicationBatch {
        tokens,
        targets,
        weights,
        batch,
        len,
    })
}

impl DuplicationBatch {
    /// `(tokens, targets, weights)` as tensors on `device`.
    pub fn tensors(&self, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>, Tensor<2>) {
        let shape = [self.batch, self.len];
        (
            Tensor::from_data(TensorData::new(self.tokens.clone(), shape), device),
            Tensor::from_data(TensorData::new(self.targets.clone(), shape), device),
            Tensor::from_data(TensorData::new(self.weights.clone(), shape), device),
        )
    }
}

/// Settings of [`train`]: a small model trained on the duplication task.
#[derive(Config, Debug)]
pub struct DuplicationConfig {
    /// The model; `max_seq_len` must cover `len`.
    pub model: ReformerConfig,
    /// Sequence length `2 (|w| + 1)`. Default: 64.
    #[config(default = 64)]
    pub len: usize,
    /// Symbols `0..vocab` (0 is the separator); must not exceed the model's vocabulary.
    /// Default: 32.
    #[config(default = 32)]
    pub vocab: usize,
    /// Training steps. Default: 500.
    #[config(default = 500)]
    pub steps: usize,
    /// Stop early after this many seconds (0: no limit). Default: 0.
    #[config(default = 0.0)]
    pub max_seconds: f64,
    /// Sequences per step. Default: 16.
    #[config(default = 16)]
    pub batch: usize,
    /// AdamW learning rate. Default: 1e-3.
    #[config(default = 1e-3)]
    pub lr: f64,
    /// Hash rounds used in training. Default: 2.
    #[config(default = 2)]
    pub train_rounds: usize,
    /// Hash rounds evaluated. Default: [1, 2, 4].
    #[config(default = "vec![1, 2, 4]")]
    pub eval_rounds: Vec<usize>,
    /// Sequences in the evaluation set. Default: 64.
    #[config(default = 64)]
    pub eval_size: usize,
    /// Seed of data and steps. Default: 0.
    #[config(default = 0)]
    pub seed: u64,
    /// Print the loss every this many steps (0: never). Default: 0.
    #[config(default = 0)]
    pub log_every: usize,
}

/// What [`train`] reached.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DuplicationReport {
    /// Steps taken.
    pub steps: usize,
    /// Wall time of training (seconds).
    pub seconds: f64,
    /// Weighted training loss of the last step.
    pub final_loss: f32,
    /// `(hash rounds, accuracy on the second half)` for each evaluated round count.
    pub accuracy: Vec<(usize, f64)>,
}

/// Accuracy of `model` (any device) on the second halves of `batch`, with `rounds` hash rounds.
pub fn accuracy(
    model: &ReformerLm,
    batch: &DuplicationBatch,
    rounds: usize,
    device: &Device,
) -> Result<f64, ReformerError> {
    let (tokens, targets, weights) = batch.tensors(device);
    let opts = model.eval_options().with_rounds(rounds);
    let logits = model.forward_with(tokens, &opts)?;
    let pred = logits.argmax(2).squeeze_dim::<2>(2);
    let hits = pred.equal(targets).float() * weights.clone();
    let hits: f32 = hits.sum().into_scalar();
    let total: f32 = weights.sum().into_scalar();
    Ok(hits as f64 / total.max(1.0) as f64)
}

/// Trains `cfg.model` on the duplication task on `device` (an autodiff device) with AdamW and
/// the model's `train_step_with` (reversible when configured), then evaluates the accuracy on
/// the second halves with each of `cfg.eval_rounds` hash rounds.
pub fn train(cfg: &DuplicationConfig, device: &Device) -> Result<DuplicationReport, ReformerError> {
    if cfg.train_rounds == 0 || cfg.eval_rounds.contains(&0) {
        return Err(ReformerError::Config(format!(
            "hash rounds must be positive: train_rounds {}, eval_rounds {:?}",
            cfg.train_rounds, cfg.eval_rounds
        )));
    }
    if !(cfg.lr.is_finite() && cfg.lr > 0.0) {
        return Err(ReformerError::Config(format!(
            "the learning rate must be positive, got {}",
            cfg.lr
        )));
    }
    if cfg.vocab > cfg.model.vocab_size || cfg.len > cfg.model.max_seq_len {
        return Err(ReformerError::Config(format!(
            "duplication vocab {} / len {} exceed the model's vocab_size {} / max_seq_len {}",
            cfg.vocab, cfg.len, cfg.model.vocab_size, cfg.model.max_seq_len
        )));
    }
    let mut model = cfg.model.init(device)?;
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
    let start = Instant::now();
    let mut final_loss = f32::NAN;
    let mut steps = 0;
    for step in 0..cfg.steps {
        if cfg.max_seconds > 0.0 && start.elapsed().as_secs_f64() > cfg.max_seconds {
            break;
        }
        let data = generate(
            cfg.batch,
            cfg.len,
            cfg.vocab,
            mix(cfg.seed, step as u64 + 1),
        )?;
        let (tokens, targets, weights) = data.tensors(device);
        let opts = ForwardOptions::train(mix(cfg.seed ^ 0xA5A5, step as u64))
            .with_rounds(cfg.train_rounds);
        let (loss, grads) = model.train_step_with(tokens, targets, Some(weights), &opts)?;
        final_loss = loss.into_scalar::<f32>();
        if cfg.log_every > 0 && step % cfg.log_every == 0 {
            eprintln!(
                "duplication step {step}: loss {final_loss:.4} ({:.1}s)",
                start.elapsed().as_secs_f64()
            );
        }
        model = optim.step(cfg.lr, model, grads);
        steps = step + 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let eval = generate(cfg.eval_size, cfg.len, cfg.vocab, mix(cfg.seed, u64::MAX))?;
    let valid = model.valid();
    let inner = device.clone().without_autodiff();
    let accuracy = cfg
        .eval_rounds
        .iter()
        .map(|&r| Ok((r, accuracy(&valid, &eval, r, &inner)?)))
        .collect::<Result<Vec<_>, ReformerError>>()?;
    Ok(DuplicationReport {
        steps,
        seconds,
        final_loss,
        accuracy,
    })
}
