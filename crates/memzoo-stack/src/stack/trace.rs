//! A traced pass ([`Trace`]): what each layer's attention did, for `memzoo inspect`.
//!
//! A [`Step`] with a trace ([`Step::with_trace`]) reads its segment exactly as one without;
//! each layer then also records, through its [`LayerContext::trace`], a probe of where its
//! queries attended ([`memzoo_relative::AttentionProbe`], computed from the real probabilities
//! by a second, non-fused computation) or, for an LSH layer, the buckets it hashed into. A pass
//! without a trace computes nothing of it.

use std::sync::{Arc, Mutex};

use burn::tensor::{Int, Tensor};
use memzoo_relative::{AttentionProbe, KeySplit};

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

/// The records of a traced pass, one or two per layer (an LSH layer records its attention
/// masses and its buckets), shared by the [`Step`](crate::Step) and the layers it reaches. Cloning
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

    /// Where layer `layer` records, its keys laid out as `layout` says.
    pub(crate) fn slot(&self, layer: usize, layout: ProbeLayout) -> TraceSlot {
        TraceSlot {
            trace: self.clone(),
            layer,
            layout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(usize, LayerTrace)>> {
        // A poisoned lock only means a panicking recorder: the records are still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a layer's probe cannot read from its own position context: how the stack laid out
/// the memories among its keys and queries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProbeLayout {
    /// `cat(memory, segment)`: the keys before the segment are the XL memory.
    #[default]
    XlMemory,
    /// A Compressive Transformer's `cat(cmem, mem, segment)`: the first `compressed` keys
    /// are the compressed memory.
    Compressed {
        /// Keys of the compressed memory.
        compressed: usize,
    },
    /// A Recurrent Memory Transformer's `[read (m), segment (len), write (m)]` sequence: the
    /// `m` read memory tokens are the memory, and only the segment's queries are recorded
    /// (they never see the write tokens).
    MemoryTokens {
        /// Memory tokens `m`.
        m: usize,
        /// Segment tokens.
        len: usize,
    },
}

impl ProbeLayout {
    /// How a probe divides the keys when the layer's context holds `mlen` memory keys.
    pub fn split(&self, mlen: usize) -> KeySplit {
        match *self {
            Self::XlMemory => KeySplit::memory(mlen),
            Self::Compressed { compressed } => KeySplit {
                compressed: compressed.min(mlen),
                memory: mlen.saturating_sub(compressed),
            },
            // An XL memory before the read tokens counts as memory with them.
            Self::MemoryTokens { m, .. } => KeySplit::memory(mlen + m),
        }
    }

    /// The recorded queries of a probe over all of the layer's queries.
    pub fn recorded(&self, probe: AttentionProbe) -> AttentionProbe {
        match *self {
            Self::MemoryTokens { m, len } => probe.queries(m, len),
            _ => probe,
        }
    }
}

/// One layer's place in a [`Trace`].
#[derive(Debug, Clone)]
pub struct TraceSlot {
    trace: Trace,
    layer: usize,
    layout: ProbeLayout,
}

impl TraceSlot {
    /// How the stack laid out the layer's keys and queries.
    pub fn layout(&self) -> ProbeLayout {
        self.layout
    }

    /// Records a probe over all the layer's queries (the segment's, or an RMT stack's whole
    /// sequence): the recorded queries' part of it.
    pub fn record_probe(&self, probe: AttentionProbe) {
        self.record(LayerTrace::Attention(Box::new(self.layout.recorded(probe))));
    }

    /// Records what the layer did.
    pub fn record(&self, record: LayerTrace) {
        self.trace.lock().push((self.layer, record));
    }
}
