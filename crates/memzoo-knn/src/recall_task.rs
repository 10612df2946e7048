//! A long-range copy task that separates a kNN memory from an XL memory.
//!
//! A document is a passage of `passage` distinct tokens, a gap of cyclic filler, a marker
//! `Q`, then the passage again. Inside the repeat, each token predicts the next one only
//! through *recall*: find the earlier occurrence of the current token and read what
//! followed it (an induction head: a previous-token head below, a match above).
//!
//! Gaps come from two ranges. Short gaps keep the first copy inside the segment or its XL
//! memory, so ordinary local attention can learn the induction mechanism; long gaps put it
//! far beyond `mem_len + seg_len`, where only the kNN memory still holds it. Because the
//! Memorizing Transformer's kNN attention shares its query/key projections with its local
//! attention (Wu et al. 2022, sec. 3), a head that learned recall locally also retrieves from
//! the memory. Evaluation uses long gaps only: plain XL can at best guess the next passage
//! token among those not yet repeated, the Memorizing model can copy it.
//!
//! [`run`] trains a model with the ordinary next-token loss on every position and reports
//! the validation loss on all positions and on the long-gap recall positions.

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::error::KnnError;
use crate::model::{MemorizingConfig, MemorizingState, MemorizingTransformer};

/// The task's shape. Vocabulary: `n_values` passage tokens, `n_filler` filler tokens, one
/// marker `Q`.
#[derive(Debug, Clone)]
pub struct RecallTask {
    /// Distinct passage tokens (the passage draws `passage` of them without repeats).
    pub n_values: usize,
    /// Passage length.
    pub passage: usize,
    /// Filler tokens; the filler cycles through them in order from a random phase (easy to
    /// predict locally, so the loss is dominated by the passages).
    pub n_filler: usize,
    /// Short gaps (inclusive range of filler tokens), within local reach.
    pub short_gap: (usize, usize),
    /// Long gaps (inclusive range), far beyond the XL memory.
    pub long_gap: (usize, usize),
    /// Fraction of documents with a long gap.
    pub long_fraction: f64,
    /// Times the passage is repeated (each after a marker `Q`). Only the first repeat is
    /// a long-range recall; later ones are within local reach and give the model dense
    /// practice at the recall mechanism.
    pub repeats: usize,
    /// Segment length; documents are padded with filler to a multiple of it.
    pub seg_len: usize,
}

impl RecallTask {
    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.n_values + self.n_filler + 1
    }

    /// Checks the task, naming the bad value.
    pub fn validate(&self) -> Result<(), KnnError> {
        let bad = |m: String| Err(KnnError::Config(m));
        if self.passage < 2 || self.passage > self.n_values {
            return bad(format!(
                "passage must be in 2..={} (n_values), got {}",
                self.n_values, self.passage
            ));
        }
        if self.n_filler == 0 || self.seg_len == 0 || self.repeats == 0 {
            return bad(format!(
                "n_filler, seg_len and repeats must be positive, got {}, {} and {}",
                self.n_filler, self.seg_len, self.repeats
            ));
        }
        for (name, (lo, hi)) in [("short_gap", self.short_gap), ("long_gap", self.long_gap)] {
            if lo > hi {
                return bad(format!("{name} range {lo}..={hi} is empty"));
            }
        }
        if !(0.0..=1.0).contains(&self.long_fraction) {
            return bad(format!(
                "long_fraction must be in [0, 1], got {}",
                self.long_fraction
            ));
        }
        Ok(())
    }

    /// One document: tokens, and per position what its *next* token is: [`Target::Long`]
    /// for the first repeat after a long gap, [`Target::Short`] for the other repeats
    /// (after each repeat's first token), [`Target::Other`] elsewhere.
    pub fn document(&self, rng: &mut u64) -> (Vec<i64>, Vec<Target>) {
        let mut next = |n: usize| {
            *rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*rng >> 33) % n as u64) as usize
        };
        let (filler, marker) = (self.n_values, self.n_values + self.n_filler);
        let mut seq: Vec<usize> = (0..self.n_values).collect();
        for i in 0..self.passage {
            let j = i + next(self.n_values - i);
            seq.swap(i, j);
        }
        let long = (next(1 << 20) as f64) < self.long_fraction * (1 << 20) as f64;
        let (lo, hi) = if long { self.long_gap } else { self.short_gap };
        let gap = lo + next(hi - lo + 1);
        let mut phase = next(self.n_filler);
        let mut fill = |toks: &mut Vec<usize>, targets: &mut Vec<Target>, n: usize| {
            for _ in 0..n {
                toks.push(filler + phase);
                targets.push(Target::Other);
                phase = (phase + 1) % self.n_filler;
            }
        };
        let mut toks: Vec<usize> = seq[..self.passage].to_vec();
        let mut targets = vec![Target::Other; self.passage];
        fill(&mut toks, &mut targets, gap);
        for r in 0..self.repeats {
            if r > 0 {
                // A fresh short gap before every later repeat: the offset to the previous
                // copy varies, so no fixed-offset (positional) head can do the recall.
                let gap = self.short_gap.0 + next(self.short_gap.1 - self.short_gap.0 + 1);
                fill(&mut toks, &mut targets, gap);
            }
            let kind = if r == 0 && long {
                Target::Long
            } else {
                Target::Short
            };
            toks.push(marker);
            targets.push(Target::Other);
            for (i, &tok) in seq.iter().enumerate().take(self.passage) {
                // The repeat's seq[i] predicts seq[i + 1].
                toks.push(tok);
                targets.push(if i + 1 < self.passage {
                    kind
                } else {
                    Target::Other
                });
            }
        }
        let padded = toks.len().div_ceil(self.seg_len) * self.seg_len;
        let pad = padded - toks.len();
        fill(&mut toks, &mut targets, pad);
        (toks.into_iter().map(|t| t as i64).collect(), targets)
    }
}

/// What a position's next token is in a [`RecallTask`] document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A passage token recalled across a long gap (only the kNN memory holds the passage).
    Long,
    /// A passage token recalled within local reach.
    Short,
    /// Filler, marker or the first statement of the passage.
    Other,
}

/// Rows of documents read segment by segment (each row its own document stream; documents
/// start at segment boundaries).
#[derive(Debug)]
pub struct RecallStream {
    task: RecallTask,
    rows: Vec<Row>,
    rng: u64,
}

#[derive(Debug)]
struct Row {
    tokens: Vec<i64>,
    targets: Vec<Target>,
    pos: usize,
}

/// One segment of a [`RecallStream`].
#[derive(Debug, Clone)]
pub struct RecallSegment {
    /// `[batch, seg_len]` tokens.
    pub tokens: Vec<i64>,
    /// `[batch, seg_len]` next tokens (the last position of a document: its own filler).
    pub targets: Vec<i64>,
    /// `[batch, seg_len]`: 1.0 where the target is a [`Target::Long`] recall.
    pub long_recall: Vec<f32>,
    /// `[batch, seg_len]`: 1.0 where the target is a [`Target::Short`] recall.
    pub short_recall: Vec<f32>,
    /// Rows whose document starts with this segment.
    pub reset: Vec<bool>,
}

impl RecallStream {
    /// `batch` rows, seeded; row `b` starts `b` segments into its first document so that
    /// segments mix document phases.
    pub fn new(task: RecallTask, batch: usize, seed: u64) -> Result<Self, KnnError> {
        task.validate()?;
        let mut rng = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        let rows = (0..batch)
            .map(|b| {
                let (tokens, mut targets) = task.document(&mut rng);
                let segs = tokens.len() / task.seg_len;
                let pos = (b % segs) * task.seg_len;
                if pos > 0 {
                    // The row never read this document's passage: nothing to recall.
                    targets.fill(Target::Other);
                }
                Row {
                    tokens,
                    targets,
                    pos,
                }
            })
            .collect();
        Ok(Self { task, rows, rng })
    }

    /// The next segment of every row.
    pub fn next_segment(&mut self) -> RecallSegment {
        let l = self.task.seg_len;
        let mut seg = RecallSegment {
            tokens: Vec::new(),
            targets: Vec::new(),
            long_recall: Vec::new(),
            short_recall: Vec::new(),
            reset: Vec::new(),
        };
        for row in self.rows.iter_mut() {
            if row.pos >= row.tokens.len() {
                (row.tokens, row.targets) = self.task.document(&mut self.rng);
                row.pos = 0;
            }
            seg.reset.push(row.pos == 0);
            for i in row.pos..row.pos + l {
                seg.tokens.push(row.tokens[i]);
                // The next document's first token is unknowable: predict filler (the
                // document's own continuation) instead; never a recall target.
                let fallback = row.tokens[i];
                seg.targets
                    .push(row.tokens.get(i + 1).copied().unwrap_or(fallback));
                let t = row.targets[i];
                seg.long_recall
                    .push(if t == Target::Long { 1.0 } else { 0.0 });
                seg.short_recall
                    .push(if t == Target::Short { 1.0 } else { 0.0 });
            }
            row.pos += l;
        }
        seg
    }
}

/// Result of [`run`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecallResult {
    /// Training loss over all positions, mean of the last 10% of steps (nats).
    pub train_loss: f64,
    /// Validation loss over all positions (nats), long gaps only.
    pub valid_loss: f64,
    /// Validation loss on the recall targets (nats).
    pub recall_loss: f64,
    /// Validation accuracy (argmax) on the recall targets.
    pub recall_accuracy: f64,
    /// Recall targets scored in validation.
    pub recall_targets: usize,
    /// Training curve: (step, mean loss on long-gap recall targets, the same on short-gap
    /// ones, over the preceding `report_every` steps).
    pub curve: Vec<(usize, f64, f64)>,
    /// Wall seconds of training.
    pub train_s: f64,
}

/// Per-position NLL `[batch * qlen]` and argmax hits of one segment.
fn nll(
    model: &MemorizingTransformer,
    hidden: Tensor<3>,
    targets: &[i64],
    device: &Device,
) -> (Tensor<1>, Tensor<1>) {
    let [b, l, _] = hidden.dims();
    let v = model.vocab_size;
    let logp = log_softmax(model.logits(hidden).reshape([b * l, v]), 1);
    let targets = Tensor::<1, Int>::from_data(TensorData::new(targets.to_vec(), [b * l]), device);
    let nll = logp
        .clone()
        .gather(1, targets.clone().reshape([b * l, 1]))
        .reshape([b * l])
        .neg();
    let hits = logp.argmax(1).reshape([b * l]).equal(targets).float();
    (nll, hits)
}

/// `Σ w·x` and `Σ w` on the host.
fn weighted_sum(x: &[f32], w: &[f32]) -> (f64, f64) {
    x.iter().zip(w).fold((0.0, 0.0), |(s, n), (&x, &w)| {
        (s + (x * w) as f64, n + w as f64)
    })
}

/// Trains `config` (vocabulary set to the task's) on `steps` segments of `batch` rows with
/// AdamW at `lr` and the next-token loss on every position, then validates on
/// `eval_segments` segments of fresh long-gap documents. `progress` is called every
/// `report_every` steps with (step, long-gap recall loss, short-gap recall loss) over those
/// steps.
#[allow(clippy::too_many_arguments)]
pub fn run(
    config: &MemorizingConfig,
    task: &RecallTask,
    batch: usize,
    steps: usize,
    eval_segments: usize,
    lr: f64,
    seed: u64,
    device: &Device,
    report_every: usize,
    mut progress: impl FnMut(usize, f64, f64),
) -> Result<RecallResult, KnnError> {
    let config = MemorizingConfig {
        xl: config.xl.clone().with_vocab_size(task.vocab()),
        ..config.clone()
    };
    let mut model = config.init(device)?;
    let mut optim = AdamWConfig::new().init();
    let mut stream = RecallStream::new(task.clone(), batch, seed)?;
    let mut state = MemorizingState::new();
    let start = std::time::Instant::now();
    let (mut tail, mut curve) = ((0.0, 0.0), Vec::new());
    let (mut long, mut short) = ((0.0, 0.0), (0.0, 0.0));
    for step in 0..steps {
        let seg = stream.next_segment();
        let tokens = Tensor::<2, Int>::from_data(
            TensorData::new(seg.tokens.clone(), [batch, task.seg_len]),
            device,
        );
        let hidden = model.forward_state(tokens, &mut state, &seg.reset)?;
        let (nll, _) = nll(&model, hidden, &seg.targets, device);
        let loss = nll.clone().mean();
        let per_pos = nll
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        let (s, n) = weighted_sum(&per_pos, &seg.long_recall);
        long = (long.0 + s, long.1 + n);
        let (s, n) = weighted_sum(&per_pos, &seg.short_recall);
        short = (short.0 + s, short.1 + n);
        if step >= steps - steps / 10 {
            tail.0 += per_pos.iter().map(|&x| x as f64).sum::<f64>();
            tail.1 += per_pos.len() as f64;
        }
        if report_every > 0 && (step + 1) % report_every == 0 {
            let (l, s) = (long.0 / long.1.max(1.0), short.0 / short.1.max(1.0));
            curve.push((step + 1, l, s));
            progress(step + 1, l, s);
            (long, short) = ((0.0, 0.0), (0.0, 0.0));
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
    }
    let train_s = start.elapsed().as_secs_f64();

    let model = model.valid();
    let inner = device.clone().without_autodiff();
    let eval_task = RecallTask {
        long_fraction: 1.0,
        ..task.clone()
    };
    let mut stream = RecallStream::new(eval_task, batch, seed ^ 0xabcdef)?;
    let mut state = MemorizingState::new();
    let (mut all, mut recall, mut hits) = ((0.0, 0.0), (0.0, 0.0), 0.0);
    for _ in 0..eval_segments {
        let seg = stream.next_segment();
        let tokens = Tensor::<2, Int>::from_data(
            TensorData::new(seg.tokens.clone(), [batch, task.seg_len]),
            &inner,
        );
        let hidden = model.forward_state(tokens, &mut state, &seg.reset)?;
        let (nll, hit) = nll(&model, hidden, &seg.targets, &inner);
        let nll = nll
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        let hit = hit
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        all.0 += nll.iter().map(|&x| x as f64).sum::<f64>();
        all.1 += nll.len() as f64;
        let (s, n) = weighted_sum(&nll, &seg.long_recall);
        recall = (recall.0 + s, recall.1 + n);
        hits += weighted_sum(&hit, &seg.long_recall).0;
    }
    Ok(RecallResult {
        train_loss: tail.0 / tail.1.max(1.0),
        valid_loss: all.0 / all.1.max(1.0),
        recall_loss: recall.0 / recall.1.max(1.0),
        recall_accuracy: hits / recall.1.max(1.0),
        recall_targets: recall.1 as usize,
        curve,
        train_s,
    })
}

/// The reference comparison run by `memzoo recall` (and the ignored test
/// `long_range_recall`): passages of 6 of 16 tokens, repeated 4 times; 20% of the documents
/// put a gap of 128–192 filler tokens before the first repeat, far beyond the XL reach of
/// `mem_len + seg_len` = 64 tokens; the others a gap of 0–16.
pub fn reference_task() -> RecallTask {
    RecallTask {
        n_values: 16,
        passage: 6,
        n_filler: 8,
        short_gap: (0, 16),
        long_gap: (128, 192),
        long_fraction: 0.2,
        repeats: 4,
        seg_len: 32,
    }
}

/// The reference model: 2 pre-LN layers, d_model 64, 4 heads x 16, T5 positions, XL memory
/// of 32; with `knn`, layer 1 is a kNN layer (top-8 of up to 1,024 exact memories per row and
/// head), without it the same model is a plain Transformer-XL.
pub fn reference_config(knn: bool) -> MemorizingConfig {
    use memzoo_memory::IndexKind;
    use memzoo_relative::{PositionConfig, PositionKind};
    use memzoo_xl::XlConfig;
    let xl = XlConfig::new()
        .with_d_model(64)
        .with_n_layers(2)
        .with_n_heads(4)
        .with_d_inner(128)
        .with_dropout(0.0)
        .with_mem_len(32)
        .with_pre_ln(true)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5));
    MemorizingConfig::new()
        .with_xl(xl)
        .with_knn_layers(if knn { vec![1] } else { vec![] })
        .with_top_k(8)
        .with_max_memories(1024)
        .with_index(IndexKind::Exact)
}
