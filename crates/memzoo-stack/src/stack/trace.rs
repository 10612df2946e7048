//! A traced pass ([`Trace`]): what each layer's attention did, for `memzoo inspect`.
//!
//! A [`Step`] with a trace ([`Step::with_trace`]) reads its segment exactly as one without;
//! each layer then also records, through its [`LayerContext::trace`], a probe of where its
//! queries attended ([`memzoo_relative::AttentionProbe`], computed from the real probabilities
//! by a second, non-fused computation) or, for an LSH layer, the buckets it hashed into. A pass
//! without a trace computes nothing of it.

use std::sync::{Arc, Mutex};

use burn::tensor::{Int, Tensor};
use memzoo_relative::AttentionProbe;

/// What one layer recorded in a traced pass.
#[derive(Debug, Clone)]
pub enum LayerTrace {
    /// A relative or kNN layer: where its queries' attention went.
    Attention(Box<AttentionProbe>),
    /// An LSH layer: the bucket of every position of `cat(memory, segment)` per head and
    /// round, `[batch, heads, rounds, padded len]`; the segment's positions start at `offset`.
    Buckets {
        /// The bucket ids.
        buckets: Box<Tensor<4, Int>>,
        /// Index of the segment's first position.
        offset: usize,
    },
}

/// The records of a traced pass, one per layer that recorded (LSH layers without buckets and
/// local layers record nothing), shared by the [`Step`](crate::Step) and the layers it reaches. Cloning
/// it shares the records.
#[derive(Clone, Default)]
pub struct Trace(Arc<Mutex<Vec<(usize, LayerTrace)>>>);

impl core::fmt::Debug for Trace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Trace({} records)", self.lock().len())
    }
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// The records so far, `(layer, record)` bottom to top, leaving the trace empty.
    pub fn take(&self) -> Vec<(usize, LayerTrace)> {
        std::mem::take(&mut *self.lock())
    }

    /// Where layer `layer` records.
    pub(crate) fn slot(&self, layer: usize) -> TraceSlot {
        TraceSlot {
            trace: self.clone(),
            layer,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(usize, LayerTrace)>> {
        // A poisoned lock only means a panicking recorder: the records are still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One layer's place in a [`Trace`].
#[derive(Debug, Clone)]
pub struct TraceSlot {
    trace: Trace,
    layer: usize,
}

impl TraceSlot {
    /// Records what the layer did.
    pub fn record(&self, record: LayerTrace) {
        self.trace.lock().push((self.layer, record));
    }
}
