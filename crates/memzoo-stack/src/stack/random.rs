//! The stack's seeded randomness: the tags of its random sites, seeded dropout masks, and the
//! step counter that makes what a step draws a function of its step number.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::{Device, Tensor};
use memzoo_reformer::ForwardOptions;
use memzoo_reformer::rng::{dropout_mask, mix};

/// Seed tags of the random sites of seeded passes (see [`Randomness::Seeded`]): layer `l`
/// draws from `child(TAG_LAYER + l)`, inside it the attention from `child(TAG_ATTENTION)`, the
/// dropout on `F`'s and `G`'s outputs from `TAG_DROP_F` / `TAG_DROP_G`.
pub(crate) const TAG_ATTENTION: u64 = 1;
pub(crate) const TAG_DROP_F: u64 = 2;
pub(crate) const TAG_DROP_G: u64 = 3;
pub(crate) const TAG_DROP_FF_INNER: u64 = 4;
/// The relative or kNN attention's own dropout masks (its probabilities; in a device stack
/// its output too), from `child(TAG_ATTENTION_DROPOUT)` of the layer's options.
pub(crate) const TAG_ATTENTION_DROPOUT: u64 = 5;
/// The memory length a training step reads ([`XlConfig::train_memory_lengths`](crate::XlConfig)).
pub(crate) const TAG_MEMORY_READ: u64 = 6;
/// A device stack's dropout on what a block-recurrent layer's tokens read from the state (a
/// seeded stack's block drops it with the attention's output, `TAG_DROP_F`).
pub(crate) const TAG_DROP_STATE_READ: u64 = 7;
pub(crate) const TAG_LAYER: u64 = 1_000;
pub(crate) const TAG_EMBED: u64 = 1_000_001;
pub(crate) const TAG_FINAL: u64 = 1_000_002;

/// Inverted dropout of `x` with a mask drawn from `opts`'s seed and `tag` (none outside
/// training): the same options replay the same mask.
pub(crate) fn seeded_dropout(x: Tensor<3>, p: f64, opts: &ForwardOptions, tag: u64) -> Tensor<3> {
    match seeded_mask(x.dims(), p, opts, tag, &x.device()) {
        Some(mask) => x * mask,
        None => x,
    }
}

/// The mask of [`seeded_dropout`] for activations of `shape` (`None`: no dropout).
pub(crate) fn seeded_mask(
    shape: [usize; 3],
    p: f64,
    opts: &ForwardOptions,
    tag: u64,
    device: &Device,
) -> Option<Tensor<3>> {
    if !opts.train {
        return None;
    }
    dropout_mask(shape, p, mix(opts.seed, tag), device)
}

/// Counts training steps so each draws fresh rotations and dropout masks (seeded passes).
///
/// Clones share the count. The trainer does not rely on it: it sets a fresh counter at the
/// stream of every step and replica ([`StepCounter::at`],
/// [`crate::RecurrentModel::with_train_stream`]), so that what a step draws is a function of
/// its step number, not of the process's history (a resumed run draws what the straight one
/// did) or of which replica's thread ran first.
#[derive(Debug, Clone, Default)]
pub struct StepCounter(Arc<AtomicU64>);

impl StepCounter {
    /// A counter of its own (shared with none) starting at `count`.
    pub fn at(count: u64) -> Self {
        Self(Arc::new(AtomicU64::new(count)))
    }

    /// The current count, then increments it.
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}
