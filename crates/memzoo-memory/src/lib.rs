//! A kNN key-value memory for model memories (the Memorizing Transformer's external memory,
//! Wu et al. 2022).
//!
//! A memory serves one attention layer. It holds, for every batch row and every key/value
//! head (the layer's heads, or fewer shared by groups of query heads:
//! [`KnnMemoryConfig::n_kv_heads`]), up to
//! `max_memories` (key, value) pairs in insertion order; when full, the oldest pairs are
//! evicted first (a ring of slots, FIFO). [`KnnIndex::add`] stores a segment's pairs,
//! [`KnnIndex::search`] returns for every query its top-k keys by inner product with their
//! values, as tensors on the model's device, plus a mask of the slots that have no entry.
//!
//! Two backends behind the one trait:
//! - [`ExactIndex`]: a search is a batched matmul `Q Kᵀ` and a top-k: on the model's device
//!   for GPUs (the fastest at any size we train with), fused per query block in host memory
//!   for CPU devices. There, from 16,384 keys per store on a CPU with AVX-512 VNNI (32,768
//!   with AVX2 only), the keys are scored in int8 first and again in f32 only where an error
//!   bound says the int8 score could be wrong about the top-k ([`HostScoring`]): the same
//!   top-k, a Memorizing-small step at 262,144 keys 2.4x faster with VNNI.
//! - [`UsearchIndex`]: an HNSW graph (usearch, inner product) per (row, kv head), values in a
//!   host ring gathered by id. Adds and searches run in parallel across (row, kv head) stores.
//!
//! [`IndexKind::Auto`] (the default) picks exact up to `auto_crossover` memories per row and
//! HNSW above.
//!
//! ```
//! use burn::tensor::{Device, Distribution, Tensor};
//! use memzoo_memory::KnnMemoryConfig;
//!
//! let device = Device::flex();
//! // 2 heads of width 16, at most 64 pairs per (row, head), for a batch of 3 rows.
//! let mut memory = KnnMemoryConfig::new(2, 16)
//!     .with_max_memories(64)
//!     .init(3, &device)
//!     .unwrap();
//! // A segment of 8 tokens: its (key, value) pairs, `[batch, tokens, heads, d_head]`.
//! let keys = Tensor::<4>::random([3, 8, 2, 16], Distribution::Default, &device);
//! memory.add(keys.clone(), keys.clone() * 2.0).unwrap();
//! // The top 4 stored keys of each query, with their values and a mask of empty slots.
//! let found = memory.search(keys, 4).unwrap();
//! assert_eq!(found.keys.dims(), [3, 8, 2, 4, 16]);
//! assert_eq!(memory.len(0), 8);
//! ```
//!
//! ## Measured (2 CPU cores shared with other builds, load 4-6: timings are rough)
//!
//! One segment = search top-32 for 512 tokens, then add them; 32-d unit keys drawn from 256
//! clusters ([`keys::clustered_keys`]); `cargo xtask bench memory-crossover` reproduces it.
//!
//! | stored / (row, head) | heads | exact | HNSW (M, ef) | HNSW recall@32 |
//! |---|---|---|---|---|
//! | 16K | 8 | 1.05 s | 1.18 s (16, 256) | 0.989 |
//! | 16K | 2 | 0.61 s | 0.44 s (32, 256) | 0.991 |
//! | 65K | 8 | 3.9 s | 3.1 s (16, 256) | 0.905 |
//! | 65K | 2 | 1.8 s | 0.92 s (16, 512) / 2.0 s (32, 512) | 0.967 / 0.992 |
//! | 262K | 2 | 3.1-5.1 s | 2.1 s (32, 1024) / 8.2 s (16, 2048) | 0.952 / 0.972 |
//!
//! Filling HNSW is the slow part: 65K x 8 heads took 55 s, 262K x 2 heads 60-100 s
//! (about 5-10K inserts/s over 2 threads); exact fills in under a second. On random (not
//! clustered) 32-d keys, 8K stored, recall@32 at the defaults is 0.9995 (clustered: 0.980).
//!
//! Since then the exact search on CPU devices keeps its pairs in host memory and fuses the
//! GEMM with the top-k selection ([`ExactIndex`]): one segment at 16K x 8 heads now takes
//! 0.44-0.51 s (HNSW 1.07 s, same load). On *real* attention keys HNSW needs a far larger
//! search expansion for the same recall than on clustered random keys (recall@32 0.77-0.87
//! at ef 256, 0.93-0.98 at ef 4096, 16K stored; `cargo xtask bench memory --real-keys`), so
//! `auto` now stays exact up to 262,144 entries per (row, head).
//!
//! **Per head, not heads flattened.** The attention scores each head's query against that
//! head's keys, so the neighbours of a query must be found in its own head's key space; a
//! single index over concatenated heads would rank tokens by the *sum* of the heads' scores
//! and hand every head the same neighbours, which is not the paper's per-head kNN attention.
//! Each (row, head) store is separate, so rows can never see each other's memories and a row
//! is cleared without touching the others.
//!
//! **Grouped heads: one store per kv head.** With multi-query or grouped attention
//! (memorizing-transformers-pytorch is multi-query) the query heads of a group all read the
//! same keys, so the memory stores that kv head once, not once per query head: a group's
//! query heads search one store (on the host, in one GEMM against its keys). With 8 query
//! heads and one kv head this is 8x less memory and 8x fewer inserts than storing copies
//! (`MEMZOO_BENCH_KV_HEADS=1` in the crossover run, 16K stored, 512 tokens x 8 query heads,
//! load 3.2-3.5: exact search 1.7x faster than over 8 stores, HNSW fill 10x).
//!
//! Metric: inner product. The kNN layer L2-normalises keys and queries (as the paper does),
//! so inner product equals cosine similarity there; the memory itself stores what it is given.
//!
//! Persistence: [`KnnIndex::save`] writes `header.json` (dims, kind, counts, CRC-32s),
//! `keys.f32` and `values.f32` (little-endian, read back memory-mapped) and, for HNSW, one
//! usearch index file per store; [`open`] checks all of it and fails with
//! [`MemoryError::Corrupt`] naming the problem rather than returning an empty memory.

#![warn(missing_docs)]

pub mod config;
pub mod error;
pub mod exact;
pub mod hnsw;
pub(crate) mod host;
pub(crate) mod int8;
pub mod keys;
pub mod persist;
pub mod reset;

pub use config::{HnswConfig, HostScoring, IndexKind, KnnMemoryConfig, TopkPlacement, WhenFull};
pub use error::MemoryError;
pub use exact::ExactIndex;
pub use hnsw::UsearchIndex;
pub use persist::open;

use std::path::Path;

use burn::tensor::{Bool, Tensor};

/// The result of a [`KnnIndex::search`].
///
/// # Shapes
/// - `keys`, `values`: `[batch, tokens, heads, k, d_head]`, best match first
/// - `mask`: `[batch, tokens, heads, k]`, `true` = no entry in this slot (fewer than `k`
///   stored), Burn's convention for hidden positions; its key and value are zeros.
#[derive(Debug, Clone)]
pub struct Retrieved {
    /// Retrieved keys.
    pub keys: Tensor<5>,
    /// Their values.
    pub values: Tensor<5>,
    /// Hidden (empty) slots.
    pub mask: Tensor<4, Bool>,
}

/// Fill state of one batch row (all its heads fill together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RowState {
    /// Entries stored (≤ `max_memories`).
    pub len: usize,
    /// Slot the next entry goes to; when full, also the oldest entry.
    pub next: usize,
}

impl RowState {
    /// The slots that the next `n` tokens go to, as at most two contiguous runs
    /// `(slot, token offset, count)`; only the last `capacity` of the tokens are kept.
    pub(crate) fn plan(&self, n: usize, capacity: usize) -> (Vec<(usize, usize, usize)>, RowState) {
        let kept = n.min(capacity);
        let skip = n - kept;
        let start = (self.next + skip) % capacity;
        let first = kept.min(capacity - start);
        let mut runs = vec![(start, skip, first)];
        if kept > first {
            runs.push((0, skip + first, kept - first));
        }
        let next = (start + kept) % capacity;
        let len = (self.len + n).min(capacity);
        (runs, RowState { len, next })
    }
}

/// A kNN key-value store for one attention layer: one FIFO store per (batch row, kv head),
/// searched by the query heads of its group.
pub trait KnnIndex: Send + Sync + std::fmt::Debug {
    /// The backend in use (`Exact` or `Hnsw`).
    fn kind(&self) -> IndexKind;

    /// The configuration the memory was built with.
    fn config(&self) -> &KnnMemoryConfig;

    /// Number of batch rows.
    fn batch(&self) -> usize;

    /// Stores a segment's pairs, evicting the oldest entries of a full row. Tensors are
    /// detached and stored once.
    ///
    /// # Shapes
    /// - `keys`, `values`: `[batch, tokens, kv_heads, d_head]` (`kv_heads` =
    ///   [`KnnMemoryConfig::kv_heads`])
    fn add(&mut self, keys: Tensor<4>, values: Tensor<4>) -> Result<(), MemoryError>;

    /// The top-`k` keys of every query by inner product, in its own row and kv head (query
    /// head `j` searches kv head `j / group`, `group = n_heads / kv_heads`).
    ///
    /// # Shapes
    /// - `queries`: `[batch, tokens, n_heads, d_head]`
    /// - output: see [`Retrieved`]
    fn search(&self, queries: Tensor<4>, k: usize) -> Result<Retrieved, MemoryError>;

    /// Empties the given rows (e.g. their documents ended); other rows are untouched.
    fn clear(&mut self, rows: &[usize]) -> Result<(), MemoryError>;

    /// Fill state of every row.
    fn rows(&self) -> &[RowState];

    /// Entries stored in `row` (per kv head).
    fn len(&self, row: usize) -> usize {
        self.rows().get(row).map_or(0, |r| r.len)
    }

    /// True when no row holds an entry.
    fn is_empty(&self) -> bool {
        self.rows().iter().all(|r| r.len == 0)
    }

    /// Entries each (row, kv head) can hold: `max_memories`.
    fn capacity(&self) -> usize {
        self.config().max_memories
    }

    /// Host copy of the stored pairs, `[batch, kv_heads, slots, d_head]` each with
    /// `slots = max len over rows` (used by [`KnnIndex::save`]).
    fn snapshot(&self) -> Result<persist::Snapshot, MemoryError>;

    /// Writes backend-specific files into `dir`; returns their CRC-32s.
    fn save_extra(&self, dir: &Path) -> Result<Vec<u32>, MemoryError>;

    /// Saves the memory into `dir` (created if needed); [`open`] reads it back.
    fn save(&self, dir: &Path) -> Result<(), MemoryError> {
        persist::save(self, dir)
    }
}

/// Checks a `[batch, tokens, heads, d_head]` input against the memory: `heads` is the
/// config's `n_heads` for queries, its `kv_heads()` for stored pairs.
fn check_shape(
    what: &str,
    dims: [usize; 4],
    batch: usize,
    heads: (&str, usize),
    d_head: usize,
) -> Result<(), MemoryError> {
    let [b, _, h, d] = dims;
    if b != batch || h != heads.1 || d != d_head {
        return Err(MemoryError::Input(format!(
            "{what} has shape {dims:?}, expected [{batch}, tokens, {} = {}, {d_head}]",
            heads.0, heads.1
        )));
    }
    Ok(())
}

/// Checks the queries passed to `search`: `[batch, tokens, n_heads, d_head]`.
pub(crate) fn check_queries(
    dims: [usize; 4],
    batch: usize,
    config: &KnnMemoryConfig,
) -> Result<(), MemoryError> {
    check_shape(
        "queries",
        dims,
        batch,
        ("n_heads", config.n_heads),
        config.d_head,
    )
}

/// Checks the `keys` and `values` passed to `add`: `[batch, tokens, kv_heads, d_head]`, one
/// shape.
pub(crate) fn check_pairs(
    keys: [usize; 4],
    values: [usize; 4],
    batch: usize,
    config: &KnnMemoryConfig,
) -> Result<(), MemoryError> {
    check_shape(
        "keys",
        keys,
        batch,
        ("kv_heads", config.kv_heads()),
        config.d_head,
    )?;
    if keys != values {
        return Err(MemoryError::Input(format!(
            "keys {keys:?} and values {values:?} differ in shape"
        )));
    }
    Ok(())
}

/// A tensor's elements on the host (one device-to-host copy), detached.
pub(crate) fn host_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.detach()
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 tensor")
}

/// Checks `rows` passed to `clear`.
pub(crate) fn check_rows(rows: &[usize], batch: usize) -> Result<(), MemoryError> {
    if let Some(r) = rows.iter().find(|&&r| r >= batch) {
        return Err(MemoryError::Input(format!(
            "cannot clear row {r}: the memory has {batch} rows"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
