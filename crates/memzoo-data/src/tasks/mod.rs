//! Generated tasks: endless streams of [`Batch`]es drawn from a seed, each built so that one
//! kind of memory has something to prove.
//!
//! - [`duplication`]: the Reformer paper's copy task `0 w 0 w` (attention over a whole
//!   sequence; the loss counts the second copy only);
//! - [`recall`]: passages recalled across gaps far beyond an XL memory (what a kNN memory
//!   adds);
//! - [`copy_text`]: letters repeated a few positions back, beyond a short segment (what an XL
//!   memory adds).
//!
//! A [`Task`] draws the next batch; a [`TaskStream`] turns it into an ordered source (endless,
//! or `limit` batches per epoch for an evaluation set), whose position is the number of
//! batches drawn: restoring it replays the task from its seed.

pub mod copy_text;
pub mod duplication;
pub mod recall;

use serde::{Deserialize, Serialize};

use crate::{Batch, DataError};

/// A generated task: every call draws the next batch; a clone draws the same batches.
pub trait Task: Clone + Send {
    /// Tokens per row of every batch.
    fn seg_len(&self) -> usize;
    /// The next batch.
    fn draw(&mut self) -> Batch;
}

/// Where a [`TaskStream`] stands (saved in checkpoints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPosition {
    /// Batches drawn in the current epoch.
    pub drawn: u64,
    /// Epochs started before this one.
    pub epoch: u64,
}

/// A [`Task`]'s batches in order: endless, or the first `limit` of them per epoch (a fixed
/// evaluation set: every epoch draws the same batches).
#[derive(Clone, Debug)]
pub struct TaskStream<T> {
    start: T,
    now: T,
    limit: Option<u64>,
    position: TaskPosition,
}

impl<T: Task> TaskStream<T> {
    /// The task's batches, without end.
    pub fn endless(task: T) -> Self {
        Self {
            start: task.clone(),
            now: task,
            limit: None,
            position: TaskPosition { drawn: 0, epoch: 0 },
        }
    }

    /// The task's first `batches` batches, again at every epoch. Errors when `batches` is 0.
    pub fn limited(task: T, batches: usize) -> Result<Self, DataError> {
        if batches == 0 {
            return Err(DataError::invalid("task batches", 0, "must be at least 1"));
        }
        Ok(Self {
            limit: Some(batches as u64),
            ..Self::endless(task)
        })
    }

    /// Tokens per row of every batch.
    pub fn seg_len(&self) -> usize {
        self.now.seg_len()
    }

    /// The next batch, or `None` at the end of a limited stream's epoch.
    pub fn next_batch(&mut self) -> Option<Batch> {
        if self.limit.is_some_and(|l| self.position.drawn >= l) {
            return None;
        }
        let mut batch = self.now.draw();
        batch.epoch = self.position.epoch;
        batch.step = self.position.drawn;
        self.position.drawn += 1;
        Some(batch)
    }

    /// Back to the first batch (the same batches again), in a new epoch.
    pub fn start_next_epoch(&mut self) {
        self.now = self.start.clone();
        self.position = TaskPosition {
            drawn: 0,
            epoch: self.position.epoch + 1,
        };
    }

    /// Where the stream stands.
    pub fn position(&self) -> TaskPosition {
        self.position
    }

    /// Continues from `position`: the task is replayed from its seed. Errors when a limited
    /// stream never reaches it.
    pub fn restore(&mut self, position: TaskPosition) -> Result<(), DataError> {
        if let Some(limit) = self.limit
            && position.drawn > limit
        {
            return Err(DataError::StateMismatch {
                field: "drawn",
                saved: position.drawn,
                actual: limit,
            });
        }
        self.now = self.start.clone();
        for _ in 0..position.drawn {
            self.now.draw();
        }
        self.position = position;
        Ok(())
    }
}
