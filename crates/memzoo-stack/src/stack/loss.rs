//! The one loss path: where hidden states and targets become negative log-likelihoods, for
//! training ([`TransformerXl::train_step`]), evaluation ([`TransformerXl::eval_step`]) and
//! every caller above them (the trainer, RECL, the study).
//!
//! `ℓ_i = -log p(y_i | h_i)`, per target; a loss is their (weighted) mean
//! ([`mean_nll`]). A plain or tied output scores `log_softmax(logits)` at the targets
//! ([`target_nll`]); an adaptive output computes its head for every target and each tail
//! cluster only for the targets in it ([`crate::AdaptiveLogSoftmax::nll`]), never the `[n, vocab]`
//! log-probabilities. Only a caller that asks for a distribution (generation:
//! [`TransformerXl::logits`]; accuracy: [`Step::hits`]) gets the full one.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};
use memzoo_reformer::ForwardOptions;

use super::*;
use crate::error::XlError;
use crate::memory::XlState;

/// How one segment is read by [`TransformerXl::train_step`] and [`TransformerXl::eval_step`].
/// `Step::default()`: no row starts a document, every target counts once, the model's own
/// randomness, no accuracy.
///
/// # Shapes
/// - `reset`: `batch` flags (or empty); `weights`: `[batch, len]`
#[derive(Debug, Clone, Default)]
pub struct Step {
    /// Per row: it starts a new document at this segment (with `document_resets`: its kNN
    /// memories are cleared and its XL memory hidden). Empty: no row does.
    pub reset: Vec<bool>,
    /// Weight of each target in the mean loss of a training step:
    /// `Σ_i w_i ℓ_i / Σ_i w_i`. `None`: every target counts once. (An evaluation step returns
    /// per-target losses; its caller weights them.)
    pub weights: Option<Tensor<2>>,
    /// Seeded options of the pass (dropout masks, LSH rotations). `None`: a training step
    /// draws the model's next ones ([`TransformerXl::train_options`]), an evaluation step
    /// reads a seeded stack with [`TransformerXl::eval_options`] and a device stack with no
    /// seed (its dropout follows the module's mode).
    pub options: Option<ForwardOptions>,
    /// An evaluation step also reports which targets are the model's most likely token. This
    /// needs the whole distribution: an adaptive output then computes every cluster.
    pub hits: bool,
    /// An evaluation step also records what each layer's attention did ([`Trace`]); `None`:
    /// nothing is computed for it.
    pub trace: Option<Trace>,
}

impl Step {
    /// A step in which the rows flagged in `reset` start a new document.
    pub fn reset(reset: &[bool]) -> Self {
        Self {
            reset: reset.to_vec(),
            ..Self::default()
        }
    }

    /// The same step with per-target weights.
    ///
    /// # Shapes
    /// - `weights`: `[batch, len]`
    pub fn with_weights(mut self, weights: Option<Tensor<2>>) -> Self {
        self.weights = weights;
        self
    }

    /// The same step under explicit seeded options.
    pub fn with_options(mut self, options: ForwardOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// The same step, recording into `trace` ([`Step::trace`]).
    pub fn with_trace(mut self, trace: Trace) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The same step, reporting hits ([`Step::hits`]).
    pub fn with_hits(mut self, hits: bool) -> Self {
        self.hits = hits;
        self
    }

    /// The reset flags for a batch of `batch` rows (none when empty).
    pub(crate) fn resets(&self, batch: usize) -> Vec<bool> {
        if self.reset.is_empty() {
            vec![false; batch]
        } else {
            self.reset.clone()
        }
    }
}

/// Per-target scores of one segment ([`TransformerXl::eval_step`]).
///
/// # Shapes
/// - `nll`, `hits`: `[batch, len]`
#[derive(Debug, Clone)]
pub struct TargetScores {
    /// `ℓ_i = -log p(y_i)` in nats, with the graph where the model has one.
    pub nll: Tensor<2>,
    /// 1 where `y_i` is the most likely token, else 0; only when [`Step::hits`] asked.
    pub hits: Option<Tensor<2>>,
}

impl TargetScores {
    /// Scores `targets` under a full distribution given as logits ([`target_nll`]), with the
    /// hits when `hits` asks (the argmax of the log-probabilities).
    ///
    /// # Shapes
    /// - `logits`: `[batch, len, vocab]`, `targets`: `[batch, len]`
    pub fn from_logits(logits: Tensor<3>, targets: Tensor<2, Int>, hits: bool) -> Self {
        let [b, l] = targets.dims();
        // The argmax of the logits is the argmax of the log-probabilities: no second softmax.
        let hits = hits.then(|| {
            logits
                .clone()
                .argmax(2)
                .reshape([b, l])
                .equal(targets.clone())
                .float()
        });
        Self {
            nll: target_nll(logits, targets),
            hits,
        }
    }
}

/// `-log_softmax(logits)[y]` per target: the scoring of a full distribution (plain and tied
/// outputs, and any model that only has logits).
///
/// # Shapes
/// - `logits`: `[batch, len, vocab]`, `targets`: `[batch, len]` → `[batch, len]`
pub fn target_nll(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<2> {
    let [b, l, _] = logits.dims();
    log_softmax(logits, 2)
        .gather(2, targets.reshape([b, l, 1]))
        .reshape([b, l])
        .neg()
}

/// The mean of per-target losses, weighted when `weights` are given:
/// `Σ_i w_i ℓ_i / Σ_i w_i` (the denominator clamped at 1e-9: all-zero weights give 0).
///
/// # Shapes
/// - `nll`, `weights`: `[batch, len]` → `[1]`
pub fn mean_nll(nll: Tensor<2>, weights: Option<Tensor<2>>) -> Tensor<1> {
    match weights {
        None => nll.mean(),
        Some(w) => (nll * w.clone()).sum() / w.sum().clamp_min(1e-9),
    }
}

impl TransformerXl {
    /// Scores `targets` under the output distribution of `hidden`: the one place the stack's
    /// hidden states become losses. An adaptive output computes only the clusters the targets
    /// fall in, unless `hits` asks for the whole distribution.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, len, d_model]`, `targets`: `[batch, len]`
    pub(crate) fn score(
        &self,
        hidden: Tensor<3>,
        targets: Tensor<2, Int>,
        hits: bool,
    ) -> Result<TargetScores, XlError> {
        let [b, q] = targets.dims();
        if hidden.dims()[..2] != [b, q] {
            return Err(XlError::Input(format!(
                "hidden states {:?} and targets {:?} differ in shape",
                hidden.dims(),
                targets.dims()
            )));
        }
        if let (OutputLayer::Adaptive(softmax), InputEmbedding::Adaptive(embedding), false) =
            (&self.output, &self.embedding, hits)
        {
            let d = hidden.dims()[2];
            let nll = softmax.nll(
                hidden.reshape([b * q, d]),
                targets.reshape([b * q]),
                embedding,
            )?;
            return Ok(TargetScores {
                nll: nll.reshape([b, q]),
                hits: None,
            });
        }
        Ok(TargetScores::from_logits(
            self.logits(hidden),
            targets,
            hits,
        ))
    }

    /// Evaluation step: reads one segment on top of `state` (moving it on, as
    /// [`forward_state`](Self::forward_state) does) and scores its targets, per target
    /// (`-log p(y)`, nats; with the graph when the model is on an autodiff device). Its mean is
    /// the training loss ([`mean_nll`]). An adaptive output never builds `[tokens, vocab]`
    /// log-probabilities here unless [`Step::hits`] asks.
    ///
    /// # Shapes
    /// - `tokens`, `targets`: `[batch, len]` → nll (and hits) `[batch, len]`
    pub fn eval_step(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        step: &Step,
    ) -> Result<TargetScores, XlError> {
        check_targets(&tokens, &targets)?;
        let reset = step.resets(tokens.dims()[0]);
        let opts = step
            .options
            .clone()
            .or_else(|| (self.randomness == Randomness::Seeded).then(|| self.eval_options()));
        let hidden =
            self.forward_state_traced(tokens, state, &reset, opts.as_ref(), step.trace.as_ref())?;
        self.score(hidden, targets, step.hits)
    }
}
