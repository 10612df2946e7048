//! Repeated passages a few positions back: text an XL memory can predict and a segment alone
//! cannot.
//!
//! A document is `passage` random letters `a..=z`, then `repeats` times `gap` dots and the
//! same letters again, then a newline. Every repeated letter sits exactly `passage + gap`
//! positions after the same letter in the copy before: with segments shorter than that, its
//! source lies in an earlier segment, which only a memory of past segments still holds. The
//! first statement of a passage is random (log2 26 = 4.70 bits a letter whatever the model
//! does); the repeats fall towards 0 bits once the model reads its memory.

use crate::synthetic::SplitMix64;
use crate::tasks::Task;
use crate::{Batch, DataError};

/// Documents of repeated passages (see the module docs) totalling at least `bytes` bytes, and
/// per byte whether it is a repeated letter (predictable only from `passage + gap` back).
pub fn copy_text(
    bytes: usize,
    passage: usize,
    gap: usize,
    repeats: usize,
    seed: u64,
) -> (Vec<u8>, Vec<bool>) {
    let mut rng = SplitMix64::new(SplitMix64::mix(seed ^ 0xC0C0));
    let (mut text, mut copy) = (Vec::new(), Vec::new());
    while text.len() < bytes {
        document(&mut rng, passage, gap, repeats, &mut text, &mut copy);
    }
    (text, copy)
}

/// Appends one document and its repeated-letter flags.
fn document(
    rng: &mut SplitMix64,
    passage: usize,
    gap: usize,
    repeats: usize,
    text: &mut Vec<u8>,
    copy: &mut Vec<bool>,
) {
    let letters: Vec<u8> = (0..passage).map(|_| b'a' + rng.below(26) as u8).collect();
    text.extend_from_slice(&letters);
    copy.extend(std::iter::repeat_n(false, passage));
    for _ in 0..repeats {
        text.extend(std::iter::repeat_n(b'.', gap));
        copy.extend(std::iter::repeat_n(false, gap));
        text.extend_from_slice(&letters);
        copy.extend(std::iter::repeat_n(true, passage));
    }
    text.push(b'\n');
    copy.push(false);
}

/// The repeated-passage task and how it is cut into segments. Defaults: 6 letters, 1 dot, 6
/// repeats (copy distance 7), segments of 4 tokens, 16 rows: every repeated letter's source
/// lies beyond its segment, in the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyTask {
    /// Letters per passage.
    pub passage: usize,
    /// Dots before each repeat.
    pub gap: usize,
    /// Repeats per document.
    pub repeats: usize,
    /// Tokens per segment.
    pub seg_len: usize,
    /// Rows per batch.
    pub batch: usize,
}

impl Default for CopyTask {
    fn default() -> Self {
        Self {
            passage: 6,
            gap: 1,
            repeats: 6,
            seg_len: 4,
            batch: 16,
        }
    }
}

impl CopyTask {
    /// Checks the task, naming the bad value.
    pub fn validate(&self) -> Result<(), DataError> {
        for (name, v) in [
            ("copy passage", self.passage),
            ("copy repeats", self.repeats),
            ("copy seg_len", self.seg_len),
            ("copy batch", self.batch),
        ] {
            if v == 0 {
                return Err(DataError::invalid(name, v, "must be positive"));
            }
        }
        Ok(())
    }

    /// Distance from a repeated letter back to its source.
    pub fn distance(&self) -> usize {
        self.passage + self.gap
    }

    /// Bytes per document.
    pub fn doc_len(&self) -> usize {
        self.passage + self.repeats * (self.gap + self.passage) + 1
    }
}

/// [`CopyTask`] documents, one stream per row, read `seg_len` bytes at a time. Row `r` draws
/// its documents from its own seed and starts `r` segments into its first document, so that
/// the rows' documents start at different steps; `reset` marks the rows whose document starts
/// at the segment's first byte, `target_mask` the repeated letters among the targets.
#[derive(Clone, Debug)]
pub struct CopyText {
    task: CopyTask,
    rows: Vec<CopyRow>,
}

#[derive(Clone, Debug)]
struct CopyRow {
    rng: SplitMix64,
    text: Vec<u8>,
    copy: Vec<bool>,
    /// `true` where a document starts.
    start: Vec<bool>,
    pos: usize,
}

impl CopyRow {
    /// Makes sure `text[pos..pos + n]` exists.
    fn fill(&mut self, task: &CopyTask, n: usize) {
        while self.text.len() < self.pos + n {
            self.start.push(true);
            document(
                &mut self.rng,
                task.passage,
                task.gap,
                task.repeats,
                &mut self.text,
                &mut self.copy,
            );
            self.start.resize(self.text.len(), false);
        }
    }
}

impl CopyText {
    /// The task's rows, drawn from `seed`.
    pub fn new(task: CopyTask, seed: u64) -> Result<Self, DataError> {
        task.validate()?;
        let rows = (0..task.batch)
            .map(|r| {
                let mut row = CopyRow {
                    rng: SplitMix64::new(SplitMix64::mix(seed) ^ SplitMix64::mix(r as u64 + 1)),
                    text: Vec::new(),
                    copy: Vec::new(),
                    start: Vec::new(),
                    pos: 0,
                };
                row.pos = (r * task.seg_len) % task.doc_len();
                row.fill(&task, 1);
                row
            })
            .collect();
        Ok(Self { task, rows })
    }
}

impl Task for CopyText {
    fn seg_len(&self) -> usize {
        self.task.seg_len
    }

    fn draw(&mut self) -> Batch {
        let (b, l) = (self.task.batch, self.task.seg_len);
        let (mut inputs, mut targets, mut copied, mut reset) = (vec![], vec![], vec![], vec![]);
        for row in &mut self.rows {
            row.fill(&self.task, l + 1);
            let p = row.pos;
            inputs.extend(row.text[p..p + l].iter().map(|&t| t as i64));
            targets.extend(row.text[p + 1..p + l + 1].iter().map(|&t| t as i64));
            copied.extend_from_slice(&row.copy[p + 1..p + l + 1]);
            reset.push(row.start[p]);
            row.pos += l;
            // Drop what no later segment reads.
            if row.pos > 4096 {
                row.text.drain(..row.pos);
                row.copy.drain(..row.pos);
                row.start.drain(..row.pos);
                row.pos = 0;
            }
        }
        Batch::new(b, l, inputs, targets)
            .and_then(|x| x.with_reset(reset))
            .and_then(|x| x.with_target_mask(copied))
            .expect("shapes built to fit")
    }
}
