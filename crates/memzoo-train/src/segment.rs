//! What the trainer reads: ordered segments ([`Segment`], memzoo-data's [`Batch`](memzoo_data::Batch)) from a
//! [`SegmentSource`], and the segment's tensors.

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::error::TrainError;

/// One step of ordered data: `batch` rows of `len` tokens, each row continuing exactly where
/// its previous segment stopped, with per-row resets, padding, the targets the loss counts
/// and the targets evaluation scores separately. It is memzoo-data's [`Batch`](memzoo_data::Batch): one type
/// from the batchers and generated tasks through the trainer.
pub use memzoo_data::Batch as Segment;

/// Ordered segments of one split, with a position that checkpoints save and restore.
pub trait SegmentSource: Send {
    /// The next segment of `len` tokens per row, or `None` at the end of the split.
    fn next_segment(&mut self, len: usize) -> Option<Segment>;
    /// Back to the start of the split (a new epoch).
    fn rewind(&mut self);
    /// Where the source stands (serialisable; saved in checkpoints).
    fn position(&self) -> serde_json::Value;
    /// Continue from a saved position.
    fn restore(&mut self, position: &serde_json::Value) -> Result<(), TrainError>;
}

/// The inputs and targets of `segment` as tensors on `device`.
///
/// # Shapes
/// - both: `[batch, len]`
pub fn tensors(segment: &Segment, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let shape = segment.shape();
    (
        Tensor::from_data(TensorData::new(segment.inputs.clone(), shape), device),
        Tensor::from_data(TensorData::new(segment.targets.clone(), shape), device),
    )
}

/// The loss weights of `segment`: 1 where the target counts ([`Segment::loss_mask`]), else
/// 0; `None` when every target counts.
///
/// # Shapes
/// - `[batch, len]`
pub fn loss_weights(segment: &Segment, device: &Device) -> Option<Tensor<2>> {
    if segment.counts_every_target() {
        return None;
    }
    Some(mask_tensor(&segment.loss_mask(), segment.shape(), device))
}

/// A `[batch, len]` 0/1 tensor of `mask`.
pub(crate) fn mask_tensor(mask: &[bool], shape: [usize; 2], device: &Device) -> Tensor<2> {
    let w: Vec<f32> = mask.iter().map(|&m| f32::from(u8::from(m))).collect();
    Tensor::from_data(TensorData::new(w, shape), device)
}
