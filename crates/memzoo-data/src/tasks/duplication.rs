//! The duplication task of the Reformer paper (Kitaev et al. 2020, sec. 5): sequences
//! `0 w 0 w`, where `w` is a random string of symbols `1..vocab`; a model must copy the first
//! half into the second. The second `w` can only be predicted by finding its first copy, up to
//! a whole sequence back: it tests attention over the full length (LSH attention must hash
//! each query into the bucket of its earlier copy). The loss counts the second copy only (the
//! first is random), and evaluation scores it as the batch's `target_mask`.

use crate::synthetic::SplitMix64;
use crate::tasks::Task;
use crate::{Batch, DataError};

/// `batch` sequences `0 w 0 w` of `len` symbols per draw.
///
/// A row is one whole sequence: `reset` is `true` for every row. Targets are the next
/// symbols (the last position repeats its own); `counted` and `target_mask` select the targets
/// that are symbols of the second `w`.
#[derive(Clone, Debug)]
pub struct Duplication {
    batch: usize,
    len: usize,
    vocab: usize,
    rng: SplitMix64,
}

impl Duplication {
    /// Sequences of `len` symbols (even, at least 4), symbols `1..vocab` (`vocab` at least 2;
    /// 0 is the separator), `batch` rows, drawn from `seed`.
    pub fn new(batch: usize, len: usize, vocab: usize, seed: u64) -> Result<Self, DataError> {
        if len < 4 || !len.is_multiple_of(2) {
            return Err(DataError::invalid(
                "duplication len",
                len,
                "must be even and at least 4 (0 w 0 w)",
            ));
        }
        if vocab < 2 {
            return Err(DataError::invalid(
                "duplication vocab",
                vocab,
                "must be at least 2",
            ));
        }
        if batch == 0 {
            return Err(DataError::invalid(
                "duplication batch",
                0,
                "must be at least 1",
            ));
        }
        Ok(Self {
            batch,
            len,
            vocab,
            rng: SplitMix64::new(SplitMix64::mix(seed ^ 0xD0D0)),
        })
    }
}

impl Task for Duplication {
    fn seg_len(&self) -> usize {
        self.len
    }

    fn draw(&mut self) -> Batch {
        let (len, half) = (self.len, self.len / 2);
        let mut inputs = Vec::with_capacity(self.batch * len);
        let mut targets = Vec::with_capacity(self.batch * len);
        let mut copy = Vec::with_capacity(self.batch * len);
        for _ in 0..self.batch {
            let w: Vec<i64> = (1..half)
                .map(|_| 1 + self.rng.below(self.vocab as u64 - 1) as i64)
                .collect();
            let mut seq = vec![0i64];
            seq.extend(&w);
            seq.push(0);
            seq.extend(&w);
            for i in 0..len {
                inputs.push(seq[i]);
                targets.push(if i + 1 < len { seq[i + 1] } else { seq[i] });
                // The target seq[i + 1] lies in the second w: i + 1 in half + 1 .. len.
                copy.push(i + 1 > half && i + 1 < len);
            }
        }
        Batch::new(self.batch, len, inputs, targets)
            .and_then(|b| b.with_reset(vec![true; self.batch]))
            .and_then(|b| b.with_counted(copy.clone()))
            .and_then(|b| b.with_target_mask(copy))
            .expect("shapes built to fit")
    }
}
