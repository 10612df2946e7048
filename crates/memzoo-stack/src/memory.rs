//! The recurrence state of Transformer-XL.

use std::path::Path;

use burn::tensor::{Device, Tensor, s};
use memzoo_memory::{KnnIndex, KnnMemoryConfig, MemoryError};

/// Cached hidden states of earlier segments: one tensor per layer, the *input* of that layer
/// at the last `mlen` positions, `[batch, mlen, d_model]`.
///
/// Returned by every forward pass and handed to the next one. Its tensors are always detached
/// from the autodiff graph (Dai et al. 2019, eq. 1: `SG(h_{τ-1})`), so a backward pass never
/// reaches an earlier segment and the graph does not grow across segments.
#[derive(Debug, Clone, Default)]
pub struct XlMemory {
    layers: Vec<Tensor<3>>,
    /// Where the layers are views of buffers with room to append in place (generation,
    /// [`begin_append`](Self::begin_append)); `None`: each layer its own tensor.
    room: Option<Room>,
}

/// Buffers with room to append in place: per layer `[batch, capacity, width]`, whose positions
/// `start .. start + len` are the memory (every layer the same `start`, `len` and capacity).
/// A pass appending `q` positions writes them at `start + len` in every layer; when they do not
/// fit, the memory moves to the front of new buffers with room for `q` and a quarter more (one
/// copy every quarter of the memory's length, where a plain memory copies itself at every
/// append).
#[derive(Debug, Clone)]
struct Room {
    /// `None` only inside [`XlMemory::append`].
    buffers: Vec<Option<Tensor<3>>>,
    start: usize,
    /// Positions held before the pass under way, and the pass's `q` (`None` between passes).
    pass: Option<(usize, usize)>,
}

impl Room {
    fn capacity(&self) -> usize {
        self.buffers
            .iter()
            .flatten()
            .next()
            .map_or(0, |b| b.dims()[1])
    }
}

/// The capacity of new buffers for `needed` positions: a quarter more, at least 16.
fn with_slack(needed: usize) -> usize {
    needed + (needed / 4).max(16)
}

impl XlMemory {
    /// No memory: the first segment of a sequence.
    pub fn empty() -> Self {
        Self::default()
    }

    /// `mlen` zero vectors per layer, `[batch, mlen, d_model]`: the memory HF's TransfoXL
    /// starts a sequence from (`init_mems`; see `XlConfig::zero_first_memory`).
    pub fn zeros(
        n_layers: usize,
        batch: usize,
        mlen: usize,
        d_model: usize,
        device: &Device,
    ) -> Self {
        Self {
            layers: (0..n_layers)
                .map(|_| Tensor::zeros([batch, mlen, d_model], device))
                .collect(),
            room: None,
        }
    }

    /// Memory from per-layer tensors `[batch, mlen, d_model]` (all the same shape); detached.
    ///
    /// Returns an error naming the mismatch if the layers disagree in shape.
    pub fn from_layers(layers: Vec<Tensor<3>>) -> Result<Self, String> {
        if let Some(first) = layers.first() {
            let dims = first.dims();
            for (l, t) in layers.iter().enumerate() {
                if t.dims() != dims {
                    return Err(format!(
                        "memory layer {l} has shape {:?}, layer 0 has {dims:?}",
                        t.dims()
                    ));
                }
            }
        }
        Ok(Self {
            layers: layers.into_iter().map(|t| t.detach()).collect(),
            room: None,
        })
    }

    /// Number of cached positions (`mlen`); 0 when empty.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |t| t.dims()[1])
    }

    /// True when no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of layers the memory covers (0 when empty).
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Batch size of the memory, if any.
    pub fn batch(&self) -> Option<usize> {
        self.layers.first().map(|t| t.dims()[0])
    }

    /// The memory of layer `l`, `[batch, mlen, d_model]`.
    pub fn layer(&self, l: usize) -> Option<&Tensor<3>> {
        self.layers.get(l)
    }

    /// The most recent `len` positions of every layer (all of them where fewer are kept;
    /// `len = 0`: an empty memory).
    pub fn recent(&self, len: usize) -> Self {
        if len == 0 {
            return Self::empty();
        }
        let layers = (self.layers.iter())
            .map(|t| {
                let n = t.dims()[1];
                let keep = n.min(len);
                t.clone().narrow(1, n - keep, keep)
            })
            .collect();
        Self { layers, room: None }
    }

    /// All layers.
    pub fn layers(&self) -> &[Tensor<3>] {
        &self.layers
    }

    /// Moves the memory to another device (e.g. from an autodiff device to its inner one).
    pub fn to_device(self, device: &Device) -> Self {
        Self {
            layers: self
                .layers
                .into_iter()
                .map(|t| t.to_device(device))
                .collect(),
            room: None,
        }
    }

    /// The memory after a segment: per layer, the last `mem_len` positions of
    /// `cat(old memory, layer input)`, detached.
    ///
    /// The window is taken from the end of the concatenation, so it is right whatever the
    /// segment length `qlen` and the previous `mlen` (the evaluation segment length may differ
    /// from training's, and evaluation may use a longer `mem_len`).
    ///
    /// # Shapes
    /// - `inputs[l]`: `[batch, qlen, d_model]`
    pub fn update(&self, inputs: &[Tensor<3>], mem_len: usize) -> Self {
        self.update_with(inputs, mem_len, true)
    }

    /// [`update`](Self::update), the inputs detached, or kept in the graph (`detach =
    /// false`: a Block-Recurrent unroll's key/value memory, detached with
    /// [`detach`](Self::detach) when the unroll ends).
    ///
    /// # Shapes
    /// - `inputs[l]`: `[batch, qlen, width]`
    pub fn update_with(&self, inputs: &[Tensor<3>], mem_len: usize, detach: bool) -> Self {
        if mem_len == 0 {
            return Self::empty();
        }
        let layers = inputs
            .iter()
            .enumerate()
            .map(|(l, input)| {
                let input = if detach {
                    input.clone().detach()
                } else {
                    input.clone()
                };
                let cat = match self.layers.get(l) {
                    Some(old) => Tensor::cat(vec![old.clone(), input], 1),
                    None => input,
                };
                let total = cat.dims()[1];
                let keep = total.min(mem_len);
                cat.narrow(1, total - keep, keep)
            })
            .collect();
        Self { layers, room: None }
    }

    /// Starts a pass that appends `q` positions to every layer in place
    /// ([`append`](Self::append), then [`finish_append`](Self::finish_append)): the memory
    /// moves into buffers with room where it has none or too little (one copy), and drops its
    /// views so that each buffer is held by this memory alone (Burn writes a slice in place
    /// only into a tensor nothing else holds; a buffer shared with a clone is copied at its
    /// first write). Between `begin_append` and `finish_append` the memory has no layers.
    pub(crate) fn begin_append(&mut self, q: usize) {
        let len = self.len();
        let views = std::mem::take(&mut self.layers);
        let fits = self
            .room
            .as_ref()
            .is_some_and(|r| r.start + len + q <= r.capacity());
        if !fits {
            // Each layer's memory at the front of a new buffer with room.
            let cap = with_slack(len + q);
            let buffers = views
                .into_iter()
                .map(|v| {
                    let [b, _, w] = v.dims();
                    let buffer = Tensor::zeros([b, cap, w], &v.device());
                    Some(buffer.slice_assign(s![.., 0..len, ..], v))
                })
                .collect();
            self.room = Some(Room {
                buffers,
                start: 0,
                pass: None,
            });
        }
        if let Some(room) = self.room.as_mut() {
            room.pass = Some((len, q));
        }
    }

    /// Layer `l`'s memory followed by `entry`, written into the layer's buffer after its
    /// memory, as a view (inside a pass, [`begin_append`](Self::begin_append)).
    ///
    /// # Shapes
    /// - `entry`: `[batch, q, width]` → `[batch, len + q, width]`
    pub(crate) fn append(&mut self, l: usize, entry: Tensor<3>) -> Result<Tensor<3>, String> {
        let room = self
            .room
            .as_mut()
            .ok_or("append outside a pass (begin_append)")?;
        let (len, q) = room.pass.ok_or("append outside a pass (begin_append)")?;
        let [b, eq, w] = entry.dims();
        if eq != q {
            return Err(format!("entry of {eq} positions, the pass appends {q}"));
        }
        if l == room.buffers.len() {
            // A memory that was empty: its buffers are made as the layers append.
            let cap = room.capacity().max(with_slack(q));
            room.buffers
                .push(Some(Tensor::zeros([b, cap, w], &entry.device())));
        }
        let at = room.start + len;
        let buffer = room
            .buffers
            .get_mut(l)
            .and_then(Option::take)
            .ok_or_else(|| format!("layer {l} has no buffer ({} layers)", room.buffers.len()))?;
        let [bb, cap, bw] = buffer.dims();
        if (bb, bw) != (b, w) || at + q > cap {
            return Err(format!(
                "entry [{b}, {q}, {w}] does not fit layer {l}'s buffer [{bb}, {cap}, {bw}] at {at}"
            ));
        }
        let buffer = buffer.slice_assign(s![.., at..at + q, ..], entry);
        let view = buffer.clone().narrow(1, room.start, len + q);
        room.buffers[l] = Some(buffer);
        Ok(view)
    }

    /// Ends a pass ([`begin_append`](Self::begin_append)): the memory holds `len + q`
    /// positions per layer when every layer appended (`done`), else the `len` it held before
    /// (what a failed pass wrote past them is never read).
    pub(crate) fn finish_append(&mut self, done: bool) {
        let Some(room) = self.room.as_mut() else {
            return;
        };
        if let Some((len, q)) = room.pass.take() {
            let n = if done { len + q } else { len };
            self.layers = room
                .buffers
                .iter()
                .flatten()
                .filter(|_| n > 0)
                .map(|b| b.clone().narrow(1, room.start, n))
                .collect();
        }
    }

    /// Keeps the most recent `len` positions of every layer, in place (a buffer's window
    /// moves; other memories are narrowed); `len = 0`: an empty memory.
    pub(crate) fn keep_recent(self, len: usize) -> Self {
        let n = self.len();
        match self.room {
            Some(mut room) if len > 0 => {
                if n > len {
                    room.start += n - len;
                }
                let keep = n.min(len);
                let layers = room
                    .buffers
                    .iter()
                    .flatten()
                    .map(|b| b.clone().narrow(1, room.start, keep))
                    .collect();
                Self {
                    layers,
                    room: Some(room),
                }
            }
            _ => self.recent(len),
        }
    }

    /// Every layer's memory detached from the graph.
    pub fn detach(&mut self) {
        for m in &mut self.layers {
            *m = m.clone().detach();
        }
    }
}

/// The recurrence state of a stack read with `TransformerXl::forward_state`, owned by the
/// caller (the trainer): the XL memory and one kNN memory per kNN layer. Host-side, not part
/// of the Module.
#[derive(Debug, Default)]
pub struct XlState {
    /// Cached layer inputs of the last `mem_len` positions (every layer).
    pub xl: XlMemory,
    /// One memory per kNN layer (bottom to top), each with one store per (row, kv head).
    pub knn: Vec<Box<dyn KnnIndex>>,
    /// Per row, how many of the most recent XL memory positions belong to the row's current
    /// document (older ones are hidden from attention; with `document_resets`). Empty: all
    /// valid.
    pub xl_valid: Vec<usize>,
    /// The compressed memories of a compressive stack (empty otherwise).
    pub compressed: crate::compressive::CompressedMemory,
    /// The carried memory tokens of a Recurrent Memory Transformer (empty otherwise).
    pub rmt: crate::rmt::RmtMemory,
    /// The carried state of a Block-Recurrent Transformer (empty otherwise).
    pub block_recurrent: crate::block_recurrent::RecurrentState,
}

impl XlState {
    /// No memory yet; the first forward pass creates the kNN memories for its batch size.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh state holding the kNN memories `knn` (one per kNN layer) and nothing else.
    pub fn with_knn(knn: Vec<Box<dyn KnnIndex>>) -> Self {
        Self { knn, ..Self::new() }
    }

    /// Entries stored per row in kNN layer `l` (counting kNN layers only, bottom to top).
    pub fn knn_len(&self, l: usize, row: usize) -> usize {
        self.knn.get(l).map_or(0, |m| m.len(row))
    }

    /// Saves the kNN memories into `dir/knn-<i>` (the XL memory is saved by the caller).
    pub fn save_knn(&self, dir: &Path) -> Result<(), MemoryError> {
        for (i, m) in self.knn.iter().enumerate() {
            m.save(&dir.join(format!("knn-{i}")))?;
        }
        Ok(())
    }

    /// Opens `n` kNN memories saved by [`save_knn`](Self::save_knn) with `config` (empty XL
    /// memory).
    pub fn open_knn(
        dir: &Path,
        n: usize,
        config: &KnnMemoryConfig,
        device: &Device,
    ) -> Result<Self, MemoryError> {
        let knn = (0..n)
            .map(|i| memzoo_memory::open(&dir.join(format!("knn-{i}")), config, device))
            .collect::<Result<_, _>>()?;
        Ok(Self::with_knn(knn))
    }
}

/// A tensor a stack carries from segment to segment in its [`XlState`] (an RMT's written
/// memory, a Block-Recurrent layer's state), `[batch, n, d_model]`; `None` before the first
/// segment. In the graph during a training unroll, detached otherwise.
#[derive(Debug, Clone, Default)]
pub struct Carried {
    /// The tensor after the last segment.
    pub value: Option<Tensor<3>>,
}

impl Carried {
    /// Cuts the tensor from the graph (the end of a backpropagation window).
    pub fn detach(&mut self) {
        self.value = self.value.take().map(Tensor::detach);
    }
}
