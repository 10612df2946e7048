//! Ordered language-model batches for segment-level recurrence (Transformer-XL style).
//!
//! The token stream is cut into `batch` contiguous rows; step `k` of row `r` starts exactly
//! where step `k - 1` of row `r` stopped, so the memory a model carries for row `r` really is
//! that row's own past. Targets are the inputs shifted by one: the last target of a step is
//! the first input of the next step.
//!
//! Two iterators:
//! - [`OrderedBatcher`]: one long stream (enwik8, text8, ...), any segment length per call;
//! - [`DocBatcher`]: whole documents laid out per row, each starting at a segment boundary,
//!   with a per-row `reset` flag on the step where a new document starts.
//!
//! Both expose their position as a small serde-serialisable [`BatcherState`]: after
//! `restore(state)` the next batch is exactly the one that would have come.

use serde::{Deserialize, Serialize};

use crate::{DataError, Token};

/// One step of ordered LM data, row-major `[batch, len]`.
///
/// # Shapes
/// - `inputs`, `targets`: `[batch, len]` (row-major, `inputs[r * len + t]`)
/// - `reset`: `[batch]`
/// - `target_mask`, `counted`: `[batch, len]` when present
///
/// # Ignored targets
/// A target equal to `pad` (when `pad` is `Some`) must not count in the loss: it is the
/// target of a padding position or of the last token of a document. `pad` is a valid
/// vocabulary id, so gathers stay in range; with Burn use
/// `CrossEntropyLossConfig::new().with_pad_tokens(Some(vec![pad as usize]))`, or weight the
/// per-token loss by [`Batch::loss_mask`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Input token ids, `[batch, len]` row-major.
    pub inputs: Vec<i64>,
    /// Target token ids (next token of each input), `[batch, len]` row-major.
    pub targets: Vec<i64>,
    /// Number of rows.
    pub batch: usize,
    /// Segment length of this step (may be shorter than asked for on the last step).
    pub len: usize,
    /// `reset[r]`: row `r` starts something new at this step (a new document, or the stream
    /// restarted at a new epoch); a model must clear row `r`'s memory before this step.
    pub reset: Vec<bool>,
    /// Targets equal to this id are ignored by the loss (padding / document ends).
    pub pad: Option<i64>,
    /// Optional per-target selection, `[batch, len]`: `true` where the target's position in
    /// the stream was selected by the mask given to [`OrderedBatcher::with_target_mask`]
    /// (e.g. the recallable positions of the long-range corpus). Evaluation scores these
    /// targets separately (their loss and argmax accuracy).
    pub target_mask: Option<Vec<bool>>,
    /// Optional `[batch, len]` selection of the targets the loss counts, in training and in
    /// evaluation (e.g. the second copy of the duplication task); `None`: every target. A
    /// target equal to `pad` never counts.
    pub counted: Option<Vec<bool>>,
    /// Epoch of this step (the first pass over the data is epoch 0).
    pub epoch: u64,
    /// Index of this step within its epoch.
    pub step: u64,
}

impl Batch {
    /// A batch of `batch` rows of `len` inputs and next-token targets (row-major), no row
    /// starting anything (`reset` all `false`), no padding, no masks, epoch and step 0; the
    /// `with_*` methods set the rest.
    ///
    /// Errors when `inputs` or `targets` do not hold `batch * len` tokens.
    pub fn new(
        batch: usize,
        len: usize,
        inputs: Vec<i64>,
        targets: Vec<i64>,
    ) -> Result<Self, DataError> {
        for (name, v) in [("inputs", &inputs), ("targets", &targets)] {
            if v.len() != batch * len {
                return Err(DataError::invalid(
                    format!("batch {name} length"),
                    v.len(),
                    format!("must be batch x len = {batch} x {len}"),
                ));
            }
        }
        Ok(Self {
            inputs,
            targets,
            batch,
            len,
            reset: vec![false; batch],
            pad: None,
            target_mask: None,
            counted: None,
            epoch: 0,
            step: 0,
        })
    }

    /// The same batch with per-row `reset` flags (`[batch]`).
    pub fn with_reset(mut self, reset: Vec<bool>) -> Result<Self, DataError> {
        self.check_len("reset", reset.len(), self.batch)?;
        self.reset = reset;
        Ok(self)
    }

    /// The same batch with targets equal to `pad` ignored by the loss.
    pub fn with_pad(mut self, pad: Option<i64>) -> Self {
        self.pad = pad;
        self
    }

    /// The same batch with a `[batch, len]` selection scored separately at evaluation.
    pub fn with_target_mask(mut self, mask: Vec<bool>) -> Result<Self, DataError> {
        self.check_len("target_mask", mask.len(), self.batch * self.len)?;
        self.target_mask = Some(mask);
        Ok(self)
    }

    /// The same batch with only the `[batch, len]` selected targets counted by the loss.
    pub fn with_counted(mut self, counted: Vec<bool>) -> Result<Self, DataError> {
        self.check_len("counted", counted.len(), self.batch * self.len)?;
        self.counted = Some(counted);
        Ok(self)
    }

    fn check_len(&self, name: &str, got: usize, want: usize) -> Result<(), DataError> {
        if got != want {
            return Err(DataError::invalid(
                format!("batch {name} length"),
                got,
                format!(
                    "must be {want} for a batch of {} x {}",
                    self.batch, self.len
                ),
            ));
        }
        Ok(())
    }

    /// `[batch, len]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.batch, self.len]
    }

    /// `[batch, len]`: `true` where the target counts in the loss (selected by `counted`, when
    /// given, and not equal to `pad`).
    pub fn loss_mask(&self) -> Vec<bool> {
        self.targets
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                self.pad.is_none_or(|p| t != p) && self.counted.as_ref().is_none_or(|c| c[i])
            })
            .collect()
    }

    /// Whether every target counts in the loss (no padding target, no `counted` selection
    /// leaving one out).
    pub fn counts_every_target(&self) -> bool {
        self.loss_mask().into_iter().all(|k| k)
    }

    /// Number of targets that count in the loss.
    pub fn counted_targets(&self) -> usize {
        self.loss_mask().into_iter().filter(|&k| k).count()
    }

    /// The rows `rows` of this batch (e.g. the shard of one data-parallel replica).
    ///
    /// Errors when `rows` reaches past `batch`.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Result<Batch, DataError> {
        if rows.start > rows.end || rows.end > self.batch {
            return Err(DataError::invalid(
                "batch rows",
                format!("{rows:?}"),
                format!("must lie in 0..{}", self.batch),
            ));
        }
        let cells = rows.start * self.len..rows.end * self.len;
        let cut = |m: &Option<Vec<bool>>| m.as_ref().map(|m| m[cells.clone()].to_vec());
        Ok(Batch {
            inputs: self.inputs[cells.clone()].to_vec(),
            targets: self.targets[cells.clone()].to_vec(),
            batch: rows.len(),
            len: self.len,
            reset: self.reset[rows].to_vec(),
            pad: self.pad,
            target_mask: cut(&self.target_mask),
            counted: cut(&self.counted),
            epoch: self.epoch,
            step: self.step,
        })
    }
}

/// Position of an ordered batcher, small and serde-serialisable for checkpoints.
///
/// `batch`, `row_len` and `tokens` describe the data the position belongs to; restoring it
/// into a batcher built on other data (or with another batch size) is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BatcherState {
    /// Offset inside each row of the next step's first input.
    pub pos: u64,
    /// Current epoch (0 for the first pass).
    pub epoch: u64,
    /// Index within the epoch of the next step.
    pub step: u64,
    /// Rows per batch of the batcher.
    pub batch: u64,
    /// Tokens per row of the batcher.
    pub row_len: u64,
    /// Tokens the batcher was built on (before trimming to whole rows).
    pub tokens: u64,
}

impl BatcherState {
    /// The first step of the first epoch of a batcher of `batch` rows of `row_len` tokens,
    /// `tokens` in all.
    fn start(batch: usize, row_len: usize, tokens: usize) -> Self {
        BatcherState {
            pos: 0,
            epoch: 0,
            step: 0,
            batch: batch as u64,
            row_len: row_len as u64,
            tokens: tokens as u64,
        }
    }

    /// The first step of the next epoch.
    fn next_epoch(&mut self) {
        self.epoch += 1;
        self.pos = 0;
        self.step = 0;
    }
}

/// `batch` and `seg_len` positive, and `tokens` enough for one batch of `batch` rows of
/// `seg_len` inputs and their targets.
fn check_shape(name: &str, tokens: usize, batch: usize, seg_len: usize) -> Result<(), DataError> {
    check_len("batch", batch)?;
    check_len("seq_len", seg_len)?;
    let needed = batch.saturating_mul(seg_len.saturating_add(1));
    if tokens < needed {
        return Err(DataError::TooShort {
            what: name.to_string(),
            tokens,
            needed,
            batch,
            seq_len: seg_len,
        });
    }
    Ok(())
}

fn check_restore(saved: &BatcherState, here: &BatcherState) -> Result<(), DataError> {
    for (field, s, a) in [
        ("batch", saved.batch, here.batch),
        ("row_len", saved.row_len, here.row_len),
        ("tokens", saved.tokens, here.tokens),
    ] {
        if s != a {
            return Err(DataError::StateMismatch {
                field,
                saved: s,
                actual: a,
            });
        }
    }
    if saved.pos > here.row_len {
        return Err(DataError::StateMismatch {
            field: "pos",
            saved: saved.pos,
            actual: here.row_len,
        });
    }
    Ok(())
}

fn check_len(name: &str, value: usize) -> Result<(), DataError> {
    if value == 0 {
        return Err(DataError::invalid(name, value, "must be at least 1"));
    }
    Ok(())
}

/// Ordered LM iterator over one token stream.
///
/// The stream of `N` tokens is cut into `batch` rows of `row_len = N / batch` contiguous
/// tokens (the last `N % batch` tokens are dropped); row `r` is
/// `tokens[r * row_len .. (r + 1) * row_len]`. A step of length `L` at offset `pos` gives
/// `inputs[r] = row_r[pos .. pos + L]` and `targets[r] = row_r[pos + 1 .. pos + L + 1]`,
/// then `pos += L`. The last step of an epoch may be shorter (unless
/// [`OrderedBatcher::drop_last`]): every target position `1 .. row_len` of every row is
/// seen exactly once per epoch.
///
/// `reset` is `true` for all rows at the first step of each epoch (the stream restarts).
#[derive(Clone, Debug)]
pub struct OrderedBatcher {
    tokens: Vec<Token>,
    mask: Option<Vec<bool>>,
    batch: usize,
    row_len: usize,
    seg_len: usize,
    drop_last: bool,
    state: BatcherState,
}

impl OrderedBatcher {
    /// An iterator over `tokens` with `batch` rows and default segment length `seg_len`.
    ///
    /// Errors when `batch` or `seg_len` is 0, or when the stream is shorter than one batch
    /// (`batch * (seg_len + 1)` tokens).
    pub fn new(tokens: Vec<Token>, batch: usize, seg_len: usize) -> Result<Self, DataError> {
        Self::named("the token stream", tokens, batch, seg_len)
    }

    /// [`OrderedBatcher::new`] with a name ("enwik8 valid split") for the too-short error.
    pub fn named(
        name: &str,
        mut tokens: Vec<Token>,
        batch: usize,
        seg_len: usize,
    ) -> Result<Self, DataError> {
        let n = tokens.len();
        check_shape(name, n, batch, seg_len)?;
        let row_len = n / batch;
        tokens.truncate(row_len * batch);
        let state = BatcherState::start(batch, row_len, n);
        Ok(Self {
            tokens,
            mask: None,
            batch,
            row_len,
            seg_len,
            drop_last: false,
            state,
        })
    }

    /// Attaches a per-token selection mask of the same length as the original stream;
    /// each batch then carries `target_mask[r, t] = mask[position of target (r, t)]`.
    pub fn with_target_mask(mut self, mut mask: Vec<bool>) -> Result<Self, DataError> {
        if mask.len() as u64 != self.state.tokens {
            return Err(DataError::invalid(
                "target mask length",
                mask.len(),
                format!("must equal the number of tokens, {}", self.state.tokens),
            ));
        }
        mask.truncate(self.tokens.len());
        self.mask = Some(mask);
        Ok(self)
    }

    /// With `true`, a step shorter than the asked length is not returned: every batch has
    /// the full length (constant shapes for training).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Rows per batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Default segment length ([`OrderedBatcher::next_batch`]).
    pub fn seg_len(&self) -> usize {
        self.seg_len
    }

    /// Number of steps of length `len` in one epoch.
    pub fn steps_per_epoch(&self, len: usize) -> usize {
        let targets = self.row_len - 1;
        if len == 0 {
            0
        } else if self.drop_last {
            targets / len
        } else {
            targets.div_ceil(len)
        }
    }

    /// Target tokens per epoch over all rows (`batch * (row_len - 1)`, fewer with `drop_last`).
    pub fn targets_per_epoch(&self, len: usize) -> usize {
        if self.drop_last {
            self.batch * self.steps_per_epoch(len) * len
        } else {
            self.batch * (self.row_len - 1)
        }
    }

    /// The current position.
    pub fn state(&self) -> BatcherState {
        self.state
    }

    /// Moves to a position saved by [`OrderedBatcher::state`] on a batcher over the same data
    /// with the same batch size.
    pub fn restore(&mut self, state: BatcherState) -> Result<(), DataError> {
        check_restore(&state, &self.state)?;
        self.state = state;
        Ok(())
    }

    /// Back to the start of the stream, as epoch `epoch + 1`.
    pub fn start_next_epoch(&mut self) {
        self.state.next_epoch();
    }

    /// Whether the current epoch has no step of length `len` left.
    pub fn is_exhausted(&self, len: usize) -> bool {
        let left = (self.row_len - 1).saturating_sub(self.state.pos as usize);
        left == 0 || (self.drop_last && left < len)
    }

    /// Next step with the default segment length; `None` at the end of the epoch.
    pub fn next_batch(&mut self) -> Option<Batch> {
        self.take(self.seg_len)
    }

    /// Next step with segment length `len` (e.g. an evaluation `tgt_len`); `None` at the end
    /// of the epoch. Errors when `len` is 0.
    pub fn next_batch_len(&mut self, len: usize) -> Result<Option<Batch>, DataError> {
        check_len("seq_len", len)?;
        Ok(self.take(len))
    }

    /// Next step with the default segment length, starting the next epoch when this one is
    /// over (for training by number of steps).
    pub fn next_batch_wrapping(&mut self) -> Batch {
        if self.is_exhausted(self.seg_len) {
            self.start_next_epoch();
        }
        // `new` guarantees row_len - 1 >= seg_len, so a fresh epoch always has a full step.
        self.take(self.seg_len)
            .expect("a fresh epoch has at least one full step")
    }

    fn take(&mut self, len: usize) -> Option<Batch> {
        if self.is_exhausted(len) {
            return None;
        }
        let pos = self.state.pos as usize;
        let len = len.min(self.row_len - 1 - pos);
        let b = self.batch;
        let mut inputs = Vec::with_capacity(b * len);
        let mut targets = Vec::with_capacity(b * len);
        let mut mask = self.mask.as_ref().map(|_| Vec::with_capacity(b * len));
        for r in 0..b {
            let start = r * self.row_len + pos;
            let seg = &self.tokens[start..start + len + 1];
            inputs.extend(seg[..len].iter().map(|&t| t as i64));
            targets.extend(seg[1..].iter().map(|&t| t as i64));
            if let (Some(out), Some(m)) = (mask.as_mut(), self.mask.as_ref()) {
                out.extend_from_slice(&m[start + 1..start + len + 1]);
            }
        }
        let batch = Batch {
            inputs,
            targets,
            batch: b,
            len,
            reset: vec![pos == 0; b],
            pad: None,
            target_mask: mask,
            counted: None,
            epoch: self.state.epoch,
            step: self.state.step,
        };
        self.state.pos += len as u64;
        self.state.step += 1;
        Some(batch)
    }
}

impl Iterator for OrderedBatcher {
    type Item = Batch;

    /// [`OrderedBatcher::next_batch`]: the rest of the current epoch.
    fn next(&mut self) -> Option<Batch> {
        self.next_batch()
    }
}

/// Document-aware ordered iterator: documents laid out per row, each starting at a segment
/// boundary, so that a model can clear a row's memory exactly when a new document starts.
///
/// Layout: documents are taken in order; each goes to the row that is currently shortest
/// (lowest index on ties), padded with `pad` to a multiple of `seg_len`. Rows are then padded
/// to the length of the longest. Step `k` covers `row_r[k * seg_len .. (k + 1) * seg_len]`.
///
/// Targets are the inputs shifted by one *within a document*: the target of a document's
/// last token, and of every padding position, is `pad` (ignored, see [`Batch`]).
/// `reset[r]` is `true` on the step where a document starts in row `r`.
///
/// With [`DocBatcher::with_target_masks`], each batch carries the documents' selection masks
/// as its `target_mask` (e.g. the recallable positions of the generated corpus).
#[derive(Clone, Debug)]
pub struct DocBatcher {
    /// `[batch, row_len]` row-major.
    tokens: Vec<Token>,
    /// Where each non-empty document was laid out: `(document index, row, offset in the row,
    /// length)`.
    placements: Vec<(usize, usize, usize, usize)>,
    /// `[batch, row_len]` row-major: the selection mask of the token there (false on padding).
    mask: Option<Vec<bool>>,
    /// `[batch, n_steps]` row-major: a document starts at that step.
    starts: Vec<bool>,
    batch: usize,
    seg_len: usize,
    n_steps: usize,
    pad: Token,
    documents: usize,
    state: BatcherState,
}

impl DocBatcher {
    /// Lays out `documents` (token vectors, e.g. from
    /// [`ByteTokenizer::encode_document`](crate::ByteTokenizer::encode_document)) into `batch`
    /// rows of segments of `seg_len`, padding with `pad`.
    ///
    /// Errors when `batch` or `seg_len` is 0, when a document contains the `pad` id, or when
    /// the documents hold fewer than `batch * (seg_len + 1)` tokens in all.
    pub fn new(
        documents: &[Vec<Token>],
        batch: usize,
        seg_len: usize,
        pad: Token,
    ) -> Result<Self, DataError> {
        Self::named("the documents", documents, batch, seg_len, pad)
    }

    /// [`DocBatcher::new`] with a name for the too-short error.
    pub fn named(
        name: &str,
        documents: &[Vec<Token>],
        batch: usize,
        seg_len: usize,
        pad: Token,
    ) -> Result<Self, DataError> {
        let total: usize = documents.iter().map(Vec::len).sum();
        check_shape(name, total, batch, seg_len)?;
        if let Some(i) = documents.iter().position(|d| d.contains(&pad)) {
            return Err(DataError::invalid(
                format!("document {i}"),
                format!("token {pad}"),
                "contains the pad id, which the loss would ignore",
            ));
        }
        // Row contents and document-start steps, row by row.
        let mut rows: Vec<Vec<Token>> = vec![Vec::new(); batch];
        let mut row_starts: Vec<Vec<usize>> = vec![Vec::new(); batch];
        let mut placements = Vec::new();
        let mut n_docs = 0;
        for (d, doc) in documents.iter().enumerate().filter(|(_, d)| !d.is_empty()) {
            let r = (0..batch).min_by_key(|&r| (rows[r].len(), r)).unwrap_or(0);
            let row = &mut rows[r];
            placements.push((d, r, row.len(), doc.len()));
            row_starts[r].push(row.len() / seg_len);
            row.extend_from_slice(doc);
            let padded = row.len().div_ceil(seg_len) * seg_len;
            row.resize(padded, pad);
            n_docs += 1;
        }
        let row_len = rows.iter().map(Vec::len).max().unwrap_or(0);
        let n_steps = row_len / seg_len;
        let mut tokens = Vec::with_capacity(batch * row_len);
        let mut starts = vec![false; batch * n_steps];
        for (r, row) in rows.iter_mut().enumerate() {
            row.resize(row_len, pad);
            tokens.extend_from_slice(row);
            for &k in &row_starts[r] {
                starts[r * n_steps + k] = true;
            }
        }
        let state = BatcherState::start(batch, row_len, total);
        Ok(Self {
            tokens,
            placements,
            mask: None,
            starts,
            batch,
            seg_len,
            n_steps,
            pad,
            documents: n_docs,
            state,
        })
    }

    /// Attaches a selection mask per document (`masks[d]` as long as document `d` given to
    /// [`DocBatcher::new`]); each batch then carries `target_mask[r, t]` = the mask of the
    /// document token that target `(r, t)` is (false where the target is padding).
    pub fn with_target_masks(mut self, masks: &[Vec<bool>]) -> Result<Self, DataError> {
        let row_len = self.n_steps * self.seg_len;
        let mut mask = vec![false; self.batch * row_len];
        if masks.len() < self.placements.last().map_or(0, |p| p.0 + 1) {
            return Err(DataError::invalid(
                "target masks",
                masks.len(),
                "need one per document",
            ));
        }
        for &(d, r, offset, len) in &self.placements {
            let start = r * row_len + offset;
            if masks[d].len() != len {
                return Err(DataError::invalid(
                    format!("target mask of document {d}"),
                    format!("{} entries", masks[d].len()),
                    format!("must have one per token of the document, {len}"),
                ));
            }
            mask[start..start + len].copy_from_slice(&masks[d]);
        }
        self.mask = Some(mask);
        Ok(self)
    }

    /// Rows per batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Segment length (fixed: the layout depends on it).
    pub fn seg_len(&self) -> usize {
        self.seg_len
    }

    /// The padding id; targets equal to it are ignored.
    pub fn pad(&self) -> Token {
        self.pad
    }

    /// Steps per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        self.n_steps
    }

    /// Non-empty documents laid out.
    pub fn documents(&self) -> usize {
        self.documents
    }

    /// Fraction of the laid-out positions that are padding.
    pub fn pad_fraction(&self) -> f64 {
        if self.tokens.is_empty() {
            return 0.0;
        }
        self.tokens.iter().filter(|&&t| t == self.pad).count() as f64 / self.tokens.len() as f64
    }

    /// The current position.
    pub fn state(&self) -> BatcherState {
        self.state
    }

    /// Moves to a position saved by [`DocBatcher::state`] on a batcher with the same
    /// documents, batch size and segment length.
    pub fn restore(&mut self, state: BatcherState) -> Result<(), DataError> {
        check_restore(&state, &self.state)?;
        if !state.pos.is_multiple_of(self.seg_len as u64) {
            return Err(DataError::StateMismatch {
                field: "pos % seg_len",
                saved: state.pos,
                actual: 0,
            });
        }
        self.state = state;
        Ok(())
    }

    /// Back to the first step, as epoch `epoch + 1`.
    pub fn start_next_epoch(&mut self) {
        self.state.next_epoch();
    }

    /// Next step; `None` at the end of the epoch.
    pub fn next_batch(&mut self) -> Option<Batch> {
        let k = (self.state.pos as usize) / self.seg_len;
        if k >= self.n_steps {
            return None;
        }
        let (b, l, row_len) = (self.batch, self.seg_len, self.n_steps * self.seg_len);
        let pad = self.pad as i64;
        let mut inputs = Vec::with_capacity(b * l);
        let mut targets = Vec::with_capacity(b * l);
        let mut reset = Vec::with_capacity(b);
        let mut target_mask = self.mask.as_ref().map(|_| Vec::with_capacity(b * l));
        for r in 0..b {
            let row = &self.tokens[r * row_len..(r + 1) * row_len];
            reset.push(self.starts[r * self.n_steps + k]);
            for i in k * l..(k + 1) * l {
                inputs.push(row[i] as i64);
                let next = i + 1;
                let doc_ends = next == row_len
                    || row[next] == self.pad
                    || row[i] == self.pad
                    || (next % l == 0 && self.starts[r * self.n_steps + next / l]);
                targets.push(if doc_ends { pad } else { row[next] as i64 });
                if let (Some(out), Some(m)) = (target_mask.as_mut(), self.mask.as_ref()) {
                    out.push(!doc_ends && m[r * row_len + next]);
                }
            }
        }
        let batch = Batch {
            inputs,
            targets,
            batch: b,
            len: l,
            reset,
            pad: Some(pad),
            target_mask,
            counted: None,
            epoch: self.state.epoch,
            step: self.state.step,
        };
        self.state.pos += l as u64;
        self.state.step += 1;
        Some(batch)
    }

    /// Next step, starting the next epoch when this one is over.
    pub fn next_batch_wrapping(&mut self) -> Batch {
        if let Some(b) = self.next_batch() {
            return b;
        }
        self.start_next_epoch();
        // `new` guarantees at least one document, hence at least one step.
        self.next_batch().expect("an epoch has at least one step")
    }
}

impl Iterator for DocBatcher {
    type Item = Batch;

    /// [`DocBatcher::next_batch`]: the rest of the current epoch.
    fn next(&mut self) -> Option<Batch> {
        self.next_batch()
    }
}
