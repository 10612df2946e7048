//! Which document position a retrieved kNN pair came from.
//!
//! A kNN memory returns the pairs it found, not where they came from. [`PositionedIndex`]
//! wraps a layer's memory for the inspector's single row: it passes every call through and
//! remembers, per kv head, the position of every key it stores (pairs arrive in document
//! order, whether the layer stores the segment's pairs or those leaving its XL memory), and
//! forgets them as the memory evicts them (FIFO) or is cleared. A retrieved key is a bit-exact
//! copy of a stored one, so its bits find its position ([`KeyPositions::lookup`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use burn::tensor::Tensor;
use memzoo_memory::{IndexKind, KnnIndex, KnnMemoryConfig, MemoryError, Retrieved, RowState};

/// The stored keys of one row, per kv head: their bits and positions in storage order.
#[derive(Debug)]
pub(crate) struct KeyPositions {
    /// Per kv head: key bits -> positions holding that key, oldest first.
    by_key: Vec<HashMap<Vec<u32>, VecDeque<i64>>>,
    /// Per kv head: the stored keys in storage order (to evict the oldest).
    order: Vec<VecDeque<Vec<u32>>>,
    capacity: usize,
    d_head: usize,
    /// Position of the next pair stored.
    next: i64,
    /// Position of the first pair of a document.
    start: i64,
}

impl KeyPositions {
    fn new(kv_heads: usize, d_head: usize, capacity: usize, start: i64) -> Self {
        Self {
            by_key: vec![HashMap::new(); kv_heads],
            order: vec![VecDeque::new(); kv_heads],
            capacity,
            d_head,
            next: start,
            start,
        }
    }

    fn clear(&mut self) {
        self.by_key.iter_mut().for_each(HashMap::clear);
        self.order.iter_mut().for_each(VecDeque::clear);
        self.next = self.start;
    }

    /// Records `keys` (`[1, tokens, kv_heads, d_head]`, host, row-major) stored in order.
    fn add(&mut self, keys: &[f32], tokens: usize) {
        let (hk, d) = (self.by_key.len(), self.d_head);
        for t in 0..tokens {
            let pos = self.next + t as i64;
            for g in 0..hk {
                let at = (t * hk + g) * d;
                let bits: Vec<u32> = keys[at..at + d].iter().map(|x| x.to_bits()).collect();
                self.by_key[g]
                    .entry(bits.clone())
                    .or_default()
                    .push_back(pos);
                self.order[g].push_back(bits);
                if self.order[g].len() > self.capacity
                    && let Some(old) = self.order[g].pop_front()
                    && let Some(list) = self.by_key[g].get_mut(&old)
                {
                    list.pop_front();
                    if list.is_empty() {
                        self.by_key[g].remove(&old);
                    }
                }
            }
        }
        self.next += tokens as i64;
    }

    /// The position of a stored key of kv head `g`; `nth` counts copies of the same key
    /// (identical keys at several positions) from the most recent. `None`: not stored.
    pub(crate) fn lookup(&self, g: usize, key: &[f32], nth: usize) -> Option<i64> {
        let bits: Vec<u32> = key.iter().map(|x| x.to_bits()).collect();
        let list = self.by_key.get(g)?.get(&bits)?;
        list.len()
            .checked_sub(1 + nth)
            .and_then(|i| list.get(i))
            .copied()
    }
}

/// Shared view of a [`PositionedIndex`]'s positions.
#[derive(Debug, Clone)]
pub(crate) struct PositionLog(Arc<Mutex<KeyPositions>>);

impl PositionLog {
    pub(crate) fn lock(&self) -> MutexGuard<'_, KeyPositions> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A one-row kNN memory that also records where its keys came from (see the module docs).
#[derive(Debug)]
pub(crate) struct PositionedIndex {
    inner: Box<dyn KnnIndex>,
    log: PositionLog,
}

impl PositionedIndex {
    /// Wraps `inner` (one row); the first pair of a document is at position `start`.
    pub(crate) fn wrap(inner: Box<dyn KnnIndex>, start: i64) -> (Self, PositionLog) {
        let c = inner.config();
        let positions = KeyPositions::new(c.kv_heads(), c.d_head, c.max_memories, start);
        let log = PositionLog(Arc::new(Mutex::new(positions)));
        (
            Self {
                inner,
                log: log.clone(),
            },
            log,
        )
    }
}

impl KnnIndex for PositionedIndex {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }

    fn config(&self) -> &KnnMemoryConfig {
        self.inner.config()
    }

    fn batch(&self) -> usize {
        self.inner.batch()
    }

    fn add(&mut self, keys: Tensor<4>, values: Tensor<4>) -> Result<(), MemoryError> {
        let [_, tokens, _, _] = keys.dims();
        let host: Vec<f32> = keys.clone().into_data().iter::<f32>().collect();
        self.inner.add(keys, values)?;
        self.log.lock().add(&host, tokens);
        Ok(())
    }

    fn search(&self, queries: Tensor<4>, k: usize) -> Result<Retrieved, MemoryError> {
        self.inner.search(queries, k)
    }

    fn clear(&mut self, rows: &[usize]) -> Result<(), MemoryError> {
        self.inner.clear(rows)?;
        if !rows.is_empty() {
            self.log.lock().clear();
        }
        Ok(())
    }

    fn rows(&self) -> &[RowState] {
        self.inner.rows()
    }

    fn snapshot(&self) -> Result<memzoo_memory::persist::Snapshot, MemoryError> {
        self.inner.snapshot()
    }

    fn save_extra(&self, dir: &std::path::Path) -> Result<Vec<u32>, MemoryError> {
        self.inner.save_extra(dir)
    }
}
