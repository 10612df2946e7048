//! memzoo-data's ordered batchers and generated tasks as the trainer's [`SegmentSource`]s.

use memzoo_data::{DocBatcher, OrderedBatcher, Task, TaskStream};

use crate::error::TrainError;
use crate::segment::{Segment, SegmentSource};

fn restore_err(e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint(format!("data position does not fit this data: {e}"))
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
        serde_json::to_value(self.state()).expect("plain state")
    }

    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError> {
        let state = serde_json::from_value(position.clone()).map_err(restore_err)?;
        OrderedBatcher::restore(self, state).map_err(restore_err)
    }
}

/// Documents laid out per row; `reset` marks where a row's new document starts and padding
/// targets (the batches' `pad`) are ignored by the loss. The segment length is fixed by the
/// batcher.
impl SegmentSource for DocBatcher {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        if len != self.seg_len() {
            return None;
        }
        self.next_batch()
    }

    fn rewind(&mut self) {
        self.start_next_epoch();
    }

    fn position(&self) -> serde_json::Value {
        serde_json::to_value(self.state()).expect("plain state")
    }

    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError> {
        let state = serde_json::from_value(position.clone()).map_err(restore_err)?;
        DocBatcher::restore(self, state).map_err(restore_err)
    }
}

/// A generated task (duplication, recall, copied text): endless for training, a fixed set of
/// batches for evaluation. The segment length is fixed by the task.
impl<T: Task> SegmentSource for TaskStream<T> {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        if len != self.seg_len() {
            return None;
        }
        self.next_batch()
    }

    fn rewind(&mut self) {
        self.start_next_epoch();
    }

    fn position(&self) -> serde_json::Value {
        serde_json::to_value(TaskStream::position(self)).expect("plain state")
    }

    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError> {
        let position = serde_json::from_value(position.clone()).map_err(restore_err)?;
        TaskStream::restore(self, position).map_err(restore_err)
    }
}
