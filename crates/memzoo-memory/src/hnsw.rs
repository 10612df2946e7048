//! The HNSW backend: one usearch index per (batch row, kv head), pairs in host rings.

use std::path::Path;

use burn::tensor::{Bool, Tensor, TensorData};
use rayon::prelude::*;
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use crate::config::{IndexKind, KnnMemoryConfig};
use crate::error::MemoryError;
use crate::persist::Snapshot;
use crate::{KnnIndex, Retrieved, RowState, check_pairs, check_queries, check_rows, host_vec};

/// One (row, kv head) store: the HNSW graph over the keys (usearch key = ring slot) and the
/// key and value rings, `[slots, d_head]` each, grown up to `max_memories` slots.
struct Store {
    index: Index,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store {{ size: {} }}", self.index.size())
    }
}

/// Approximate kNN memory: an HNSW graph (usearch, inner product, f32) per (row, kv head),
/// searched by every query head of its group.
///
/// The usearch key of an entry is its ring slot; evicting the oldest entry is a `remove` of
/// that slot before the new key is added (usearch reuses the freed node). Values (and a key
/// copy, to return the keys) live in host rings and are gathered by slot. Adds and searches
/// run in parallel over the `batch * kv_heads` stores (rayon), with one host round trip per call.
#[derive(Debug)]
pub struct UsearchIndex {
    config: KnnMemoryConfig,
    rows: Vec<RowState>,
    /// `stores[b * kv_heads + g]`.
    stores: Vec<Store>,
}

fn index_err(e: impl std::fmt::Display) -> MemoryError {
    MemoryError::Index(e.to_string())
}

impl UsearchIndex {
    /// The usearch options of a store.
    pub fn options(config: &KnnMemoryConfig) -> IndexOptions {
        IndexOptions {
            dimensions: config.d_head,
            metric: MetricKind::IP,
            quantization: ScalarKind::F32,
            connectivity: config.hnsw.connectivity,
            expansion_add: config.hnsw.expansion_add,
            expansion_search: config.hnsw.expansion_search_for(config.max_memories),
            multi: false,
        }
    }

    fn new_store(config: &KnnMemoryConfig) -> Result<Store, MemoryError> {
        let index = Index::new(&Self::options(config)).map_err(index_err)?;
        Ok(Store {
            index,
            keys: Vec::new(),
            values: Vec::new(),
        })
    }

    /// An empty memory for `batch` rows.
    pub fn new(config: &KnnMemoryConfig, batch: usize) -> Result<Self, MemoryError> {
        let stores = (0..batch * config.kv_heads())
            .map(|_| Self::new_store(config))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            config: config.clone(),
            rows: vec![RowState::default(); batch],
            stores,
        })
    }

    /// File name of the usearch index of (row, kv head).
    pub(crate) fn file_name(b: usize, h: usize) -> String {
        format!("index-b{b}-h{h}.usearch")
    }

    /// Replaces the graph of `index` by the one saved at `path`, with the search and add
    /// breadths of `config`. What a loaded graph draws next is the same however it came to be
    /// loaded: usearch restarts its level generators on every load (they are in no file), which
    /// is why [`KnnIndex::save_extra`] reloads the graphs it saved.
    fn load_graph(index: &Index, path: &str, config: &KnnMemoryConfig) -> Result<(), String> {
        index.load(path).map_err(|e| e.to_string())?;
        index.change_expansion_search(config.hnsw.expansion_search_for(config.max_memories));
        index.change_expansion_add(config.hnsw.expansion_add);
        Ok(())
    }

    /// A memory holding `snap` (`[batch, kv_heads, slots, d]`), its graphs loaded from
    /// `dir` (from [`crate::open`]): kv head `g`'s from the file of saved head
    /// `g * file_stride` (1, or the group size for a memory saved with a copy per query head).
    pub(crate) fn from_snapshot(
        config: &KnnMemoryConfig,
        snap: Snapshot,
        dir: &Path,
        file_stride: usize,
    ) -> Result<Self, MemoryError> {
        let (h, d, slots) = (config.kv_heads(), config.d_head, snap.slots);
        let corrupt = |message: String| MemoryError::Corrupt {
            dir: dir.to_path_buf(),
            message,
        };
        let mut stores = Vec::with_capacity(snap.rows.len() * h);
        for (b, row) in snap.rows.iter().enumerate() {
            for head in 0..h {
                let path = dir.join(Self::file_name(b, head * file_stride));
                let store = Self::new_store(config)?;
                let p = path
                    .to_str()
                    .ok_or_else(|| corrupt(format!("non-UTF-8 path {path:?}")))?;
                Self::load_graph(&store.index, p, config)
                    .map_err(|e| corrupt(format!("cannot load {}: {e}", path.display())))?;
                if store.index.size() != row.len || store.index.dimensions() != d {
                    return Err(corrupt(format!(
                        "{} holds {} vectors of {} dims, the header says {} of {d}",
                        path.display(),
                        store.index.size(),
                        store.index.dimensions(),
                        row.len
                    )));
                }
                let at = (b * h + head) * slots * d;
                let n = row.len * d;
                let mut store = store;
                store.keys = snap.keys[at..at + n].to_vec();
                store.values = snap.values[at..at + n].to_vec();
                stores.push(store);
            }
        }
        Ok(Self {
            config: config.clone(),
            rows: snap.rows,
            stores,
        })
    }
}

impl KnnIndex for UsearchIndex {
    fn kind(&self) -> IndexKind {
        IndexKind::Hnsw
    }

    fn config(&self) -> &KnnMemoryConfig {
        &self.config
    }

    fn batch(&self) -> usize {
        self.rows.len()
    }

    fn rows(&self) -> &[RowState] {
        &self.rows
    }

    fn add(&mut self, keys: Tensor<4>, values: Tensor<4>) -> Result<(), MemoryError> {
        check_pairs(keys.dims(), values.dims(), self.batch(), &self.config)?;
        let [_, tokens, heads, d] = keys.dims();
        if tokens == 0 {
            return Ok(());
        }
        let cap = self.config.max_memories;
        // One round trip: [batch, tokens, kv_heads, d] on the host.
        let (keys, values) = (host_vec(keys), host_vec(values));
        let plans: Vec<_> = self.rows.iter().map(|r| r.plan(tokens, cap)).collect();
        let at = |b: usize, t: usize, h: usize| ((b * tokens + t) * heads + h) * d;
        self.stores.par_iter_mut().enumerate().try_for_each(
            |(i, store)| -> Result<(), MemoryError> {
                let (b, h) = (i / heads, i % heads);
                let (runs, next) = &plans[b];
                let filled = next.len * d;
                if store.keys.len() < filled {
                    store.keys.resize(filled, 0.0);
                    store.values.resize(filled, 0.0);
                }
                if store.index.capacity() < next.len {
                    let want = next.len.max(2 * store.index.capacity()).min(cap);
                    // One thread per store: the parallelism is across stores.
                    store
                        .index
                        .reserve_capacity_and_threads(want, 1)
                        .map_err(index_err)?;
                }
                for &(slot, offset, count) in runs {
                    for j in 0..count {
                        let (s, t) = (slot + j, offset + j);
                        let src = at(b, t, h);
                        let key = &keys[src..src + d];
                        store.keys[s * d..(s + 1) * d].copy_from_slice(key);
                        store.values[s * d..(s + 1) * d].copy_from_slice(&values[src..src + d]);
                        // FIFO: the slot's previous (oldest) entry leaves the graph first.
                        if store.index.contains(s as u64) {
                            store.index.remove(s as u64).map_err(index_err)?;
                        }
                        store.index.add(s as u64, key).map_err(index_err)?;
                    }
                }
                Ok(())
            },
        )?;
        for (row, (_, next)) in self.rows.iter_mut().zip(plans) {
            *row = next;
        }
        Ok(())
    }

    fn search(&self, queries: Tensor<4>, k: usize) -> Result<Retrieved, MemoryError> {
        check_queries(queries.dims(), self.batch(), &self.config)?;
        if k == 0 {
            return Err(MemoryError::Input("k must be positive, got 0".into()));
        }
        let [batch, tokens, heads, d] = queries.dims();
        let (hk, group) = (self.config.kv_heads(), self.config.group());
        let device = queries.device();
        let q = host_vec(queries);
        // Per store (row, kv head g): [tokens, group, k] slots (or None) for query heads
        // g * group + j, searched in parallel.
        let found: Vec<Vec<Option<u64>>> = self
            .stores
            .par_iter()
            .enumerate()
            .map(|(i, store)| -> Result<Vec<Option<u64>>, MemoryError> {
                let (b, g) = (i / hk, i % hk);
                let mut out = vec![None; tokens * group * k];
                if self.rows[b].len == 0 {
                    return Ok(out);
                }
                for t in 0..tokens {
                    for j in 0..group {
                        let src = ((b * tokens + t) * heads + g * group + j) * d;
                        let m = store.index.search(&q[src..src + d], k).map_err(index_err)?;
                        for (r, key) in m.keys.into_iter().take(k).enumerate() {
                            out[(t * group + j) * k + r] = Some(key);
                        }
                    }
                }
                Ok(out)
            })
            .collect::<Result<_, _>>()?;
        let n = batch * tokens * heads * k;
        let mut rk = vec![0.0f32; n * d];
        let mut rv = vec![0.0f32; n * d];
        let mut mask = vec![true; n];
        for (i, slots) in found.iter().enumerate() {
            let (b, g) = (i / hk, i % hk);
            let store = &self.stores[i];
            for t in 0..tokens {
                for (jr, found) in slots[t * group * k..(t + 1) * group * k].iter().enumerate() {
                    let (h, j) = (g * group + jr / k, jr % k);
                    if let Some(s) = *found {
                        let s = s as usize;
                        let o = ((b * tokens + t) * heads + h) * k + j;
                        rk[o * d..(o + 1) * d].copy_from_slice(&store.keys[s * d..(s + 1) * d]);
                        rv[o * d..(o + 1) * d].copy_from_slice(&store.values[s * d..(s + 1) * d]);
                        mask[o] = false;
                    }
                }
            }
        }
        let shape = [batch, tokens, heads, k, d];
        Ok(Retrieved {
            keys: Tensor::from_data(TensorData::new(rk, shape), &device),
            values: Tensor::from_data(TensorData::new(rv, shape), &device),
            mask: Tensor::<4, Bool>::from_data(
                TensorData::new(mask, [batch, tokens, heads, k]),
                &device,
            ),
        })
    }

    fn clear(&mut self, rows: &[usize]) -> Result<(), MemoryError> {
        check_rows(rows, self.batch())?;
        let heads = self.config.kv_heads();
        for &r in rows {
            for h in 0..heads {
                self.stores[r * heads + h] = Self::new_store(&self.config)?;
            }
            self.rows[r] = RowState::default();
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, MemoryError> {
        let d = self.config.d_head;
        let slots = self.rows.iter().map(|r| r.len).max().unwrap_or(0);
        let mut keys = vec![0.0f32; self.stores.len() * slots * d];
        let mut values = vec![0.0f32; self.stores.len() * slots * d];
        for (i, store) in self.stores.iter().enumerate() {
            let n = store.keys.len().min(slots * d);
            keys[i * slots * d..i * slots * d + n].copy_from_slice(&store.keys[..n]);
            values[i * slots * d..i * slots * d + n].copy_from_slice(&store.values[..n]);
        }
        Ok(Snapshot {
            rows: self.rows.clone(),
            slots,
            keys,
            values,
        })
    }

    /// Saves every store's graph, then reloads it from the file written: usearch draws each
    /// new node's level from a generator that no file holds and no call sets, restarted by
    /// every load. Reloaded, this memory draws from where a memory opened from `dir` (a
    /// resumed run's) does, so the two add the same levels and build the same graphs.
    fn save_extra(&self, dir: &Path) -> Result<Vec<u32>, MemoryError> {
        let heads = self.config.kv_heads();
        let mut crcs = Vec::with_capacity(self.stores.len());
        for (i, store) in self.stores.iter().enumerate() {
            let path = dir.join(Self::file_name(i / heads, i % heads));
            let p = path
                .to_str()
                .ok_or_else(|| MemoryError::Input(format!("non-UTF-8 path {path:?}")))?;
            store
                .index
                .save(p)
                .map_err(|e| MemoryError::Index(format!("saving {}: {e}", path.display())))?;
            let bytes = std::fs::read(&path).map_err(|e| MemoryError::io(&path, e))?;
            crcs.push(crc32fast::hash(&bytes));
            Self::load_graph(&store.index, p, &self.config)
                .map_err(|e| MemoryError::Index(format!("reloading {}: {e}", path.display())))?;
        }
        Ok(crcs)
    }
}
