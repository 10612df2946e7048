//! memzoo-data's ordered batchers as the trainer's [`SegmentSource`]s.

use memzoo_data::{Batch, DocBatcher, OrderedBatcher};

use crate::error::TrainError;
use crate::trainer::{Segment, SegmentSource};

fn segment(b: Batch) -> Segment {
    Segment {
        batch: b.batch,
        len: b.len,
        inputs: b.inputs,
        targets: b.targets,
        reset: b.reset,
        target_mask: b.target_mask,
    }
}

fn restore_err(e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint(format!("data position does not fit this data: {e}"))
}

impl SegmentSource for OrderedBatcher {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        match self.next_batch_len(len) {
            Ok(Some(b)) if b.len == len => Some(segment(b)),
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
/// targets are ignored by the loss. The segment length is fixed by the batcher.
impl SegmentSource for DocBatcher {
    fn next_segment(&mut self, len: usize) -> Option<Segment> {
        if len != self.seg_len() {
            return None;
        }
        self.next_batch().map(segment)
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

    fn ignore_index(&self) -> Option<usize> {
        Some(self.pad() as usize)
    }
}
