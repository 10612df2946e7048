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
//! the memory. Evaluation uses long gaps only (`long_fraction` 1): plain XL can at best guess
//! the next passage token among those not yet repeated, the Memorizing model can copy it.
//!
//! A [`RecallStream`] trains on every position (the ordinary next-token loss); its batches'
//! `target_mask` selects the long-gap recall targets ([`Target::Long`]), which evaluation
//! scores separately (loss and accuracy).

use serde::{Deserialize, Serialize};

use crate::tasks::Task;
use crate::{Batch, DataError};

/// The task's shape. Vocabulary: `n_values` passage tokens, `n_filler` filler tokens, one
/// marker `Q`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub fn validate(&self) -> Result<(), DataError> {
        if self.passage < 2 || self.passage > self.n_values {
            return Err(DataError::invalid(
                "recall passage",
                self.passage,
                format!("must be in 2..={} (n_values)", self.n_values),
            ));
        }
        for (name, v) in [
            ("recall n_filler", self.n_filler),
            ("recall seg_len", self.seg_len),
            ("recall repeats", self.repeats),
        ] {
            if v == 0 {
                return Err(DataError::invalid(name, v, "must be positive"));
            }
        }
        for (name, (lo, hi)) in [
            ("recall short_gap", self.short_gap),
            ("recall long_gap", self.long_gap),
        ] {
            if lo > hi {
                return Err(DataError::invalid(
                    name,
                    format!("{lo}..={hi}"),
                    "the range is empty",
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.long_fraction) {
            return Err(DataError::invalid(
                "recall long_fraction",
                self.long_fraction,
                "must be in [0, 1]",
            ));
        }
        Ok(())
    }

    /// The reference comparison run by `memzoo recall`: passages of 6 of 16 tokens, repeated
    /// 4 times; 20% of the documents put a gap of 128–192 filler tokens before the first
    /// repeat, far beyond the XL reach of `mem_len + seg_len` = 64 tokens of the reference
    /// models; the others a gap of 0–16.
    pub fn reference() -> Self {
        Self {
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
/// start at segment boundaries, where the row's `reset` is set).
#[derive(Clone, Debug)]
pub struct RecallStream {
    task: RecallTask,
    rows: Vec<Row>,
    rng: u64,
}

#[derive(Clone, Debug)]
struct Row {
    tokens: Vec<i64>,
    targets: Vec<Target>,
    pos: usize,
}

impl RecallStream {
    /// `batch` rows, seeded; row `b` starts `b` segments into its first document so that
    /// segments mix document phases.
    pub fn new(task: RecallTask, batch: usize, seed: u64) -> Result<Self, DataError> {
        task.validate()?;
        if batch == 0 {
            return Err(DataError::invalid("recall batch", 0, "must be at least 1"));
        }
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
}

impl Task for RecallStream {
    fn seg_len(&self) -> usize {
        self.task.seg_len
    }

    /// The next segment of every row; `target_mask` marks the [`Target::Long`] recalls.
    fn draw(&mut self) -> Batch {
        let l = self.task.seg_len;
        let (mut inputs, mut targets, mut long, mut reset) = (vec![], vec![], vec![], vec![]);
        for row in self.rows.iter_mut() {
            if row.pos >= row.tokens.len() {
                (row.tokens, row.targets) = self.task.document(&mut self.rng);
                row.pos = 0;
            }
            reset.push(row.pos == 0);
            for i in row.pos..row.pos + l {
                inputs.push(row.tokens[i]);
                // The next document's first token is unknowable: predict filler (the
                // document's own continuation) instead; never a recall target.
                let fallback = row.tokens[i];
                targets.push(row.tokens.get(i + 1).copied().unwrap_or(fallback));
                long.push(row.targets[i] == Target::Long);
            }
            row.pos += l;
        }
        Batch::new(self.rows.len(), l, inputs, targets)
            .and_then(|b| b.with_reset(reset))
            .and_then(|b| b.with_target_mask(long))
            .expect("shapes built to fit")
    }
}
