//! memzoo-data's ordered batchers and generated tasks as the trainer's [`SegmentSource`]s.

use memzoo_data::{DocBatcher, OrderedBatcher, Task, TaskStream};

use crate::error::TrainError;
use crate::segment::{Segment, SegmentSource};

fn restore_err(e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint(format!("data position does not fit this data: {e}"))
}

/// A checkpoint's data `position` read as a source's state `S` and given to `restore`.
fn restore_from<S: serde::de::DeserializeOwned, E: std::fmt::Display>(
    position: &serde_json::Value,
    restore: impl FnOnce(S) -> Result<(), E>,
) -> Result<(), TrainError> {
    let state = serde_json::from_value(position.clone()).map_err(restore_err)?;
    restore(state).map_err(restore_err)
}

/// A source's state as the checkpoint's data position.
fn position_of(state: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(state).expect("plain state")
}

/// The next batch of a source whose segment length is fixed (`seg_len`): none for another `len`.
fn fixed_len(
    len: usize,
    seg_len: usize,
    next: impl FnOnce() -> Option<Segment>,
) -> Option<Segment> {
    if len != seg_len {
        return None;
    }
    next()
}

impl SegmentSource for OrderedBatcher {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        match self.next_batch_len(len) {
            Ok(Some(b)) if b.len == len => Some(b),
            _ => None,
        }
    }

    fn rewind(&mut self) {
        self.start_next_epoch();
    }

    fn position(&self) -> serde_json::Value {
        position_of(self.state())
    }

    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError> {
        restore_from(position, |state| OrderedBatcher::restore(self, state))
    }
}

/// Documents laid out per row; `reset` marks where a row's new document starts and padding
/// targets (the batches' `pad`) are ignored by the loss. The segment length is fixed by the
/// batcher.
impl SegmentSource for DocBatcher {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        fixed_len(len, self.seg_len(), || self.next_batch())
    }

    fn rewind(&mut self) {
        self.start_next_epoch();
    }

    fn position(&self) -> serde_json::Value {
        position_of(self.state())
    }

    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError> {
        restore_from(position, |state| DocBatcher::restore(self, state))
    }
}

/// A generated task (duplication, recall, copied text): endless for training, a fixed set of
/// batches for evaluation. The segment length is fixed by the task.
impl<T: Task> SegmentSource for TaskStream<T> {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        fixed_len(len, self.seg_len(), || self.next_batch())
    }

    fn rewind(&mut self) {
        self.start_next_epoch();
    }

    fn position(&self) -> serde_json::Value {
        position_of(TaskStream::position(self))
    }

    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError> {
        restore_from(position, |state| TaskStream::restore(self, state))
    }
}
