//! The exact backend: keys and values on the model's device, search = batched matmul + top-k.

use std::path::Path;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData, s};

use crate::config::{IndexKind, KnnMemoryConfig, TopkPlacement};
use crate::error::MemoryError;
use crate::host::HostStore;
use crate::persist::Snapshot;
use crate::{KnnIndex, Retrieved, RowState, check_pairs, check_queries, check_rows, host_vec};

/// Score given to empty slots before the top-k.
const EMPTY: f32 = -1.0e30;
/// Scores below this are empty slots.
const EMPTY_BELOW: f32 = -1.0e29;
/// Largest score block (elements) computed at once; queries are chunked to stay under it.
const SCORE_BLOCK: usize = 1 << 24;
/// Columns one top-k reduction reads at most. CubeCL's top-k (Burn 0.22.1) never returns the
/// entries from index 65,534 on when it selects 32 of a row of 65,536 or more (found on Vulkan
/// and GL; `memzoo devices --verify`, `backend_devices_verify_holds_what_memzoo_builds_on`): `memorizing-paper`'s full
/// store is 65,536 slots. Longer rows go in blocks ([`blocked_topk`]).
const TOPK_BLOCK: usize = 1 << 15;

/// `scores.topk_with_indices(k, 3)` for `[batch, heads, n, slots]` scores, in blocks of at
/// most [`TOPK_BLOCK`] slots: each block's top `k` (which hold every one of the row's top `k`
/// that falls in the block), their indices offset by the block's first slot, then the top `k`
/// of those candidates, whose indices are gathered.
///
/// # Shapes
/// - `scores`: `[batch, heads, n, slots]`, `k ≤ slots`
/// - output: values and slot indices `[batch, heads, n, k]`, the values in descending order
fn blocked_topk(scores: Tensor<4>, k: usize) -> (Tensor<4>, Tensor<4, Int>) {
    let slots = scores.dims()[3];
    if slots <= TOPK_BLOCK {
        return scores.topk_with_indices(k, 3);
    }
    let (vals, idx): (Vec<_>, Vec<_>) = (0..slots)
        .step_by(TOPK_BLOCK)
        .map(|start| {
            let len = TOPK_BLOCK.min(slots - start);
            let (v, i) = scores
                .clone()
                .narrow(3, start, len)
                .topk_with_indices(k.min(len), 3);
            (v, i.add_scalar(start as i64))
        })
        .unzip();
    let (top, at) = Tensor::cat(vals, 3).topk_with_indices(k, 3);
    (top, Tensor::cat(idx, 3).gather(3, at))
}

/// Brute-force kNN memory, exact top-k by inner product.
///
/// Two stores behind it, chosen by [`TopkPlacement`] (`auto`: by the device):
/// - on the model's device (GPUs): `[batch, kv_heads, slots, d_head]` key and value tensors,
///   grown by doubling up to `max_memories` slots; a search scores every query against every
///   stored key of its row and kv head, `S = Q Kᵀ` (`[batch, kv_heads, group * tokens,
///   slots]`, a group's query heads stacked), hides the empty slots, keeps the top `k` per
///   query and gathers keys and values by slot there;
/// - in host memory (CPU devices): the same layout in plain vectors, searched by a GEMM per
///   (row, query block, kv head) fused with the top-k selection and the gather (see
///   `crate::host`), which never materialises the full score matrix.
#[derive(Debug)]
pub struct ExactIndex {
    config: KnnMemoryConfig,
    /// The model's device without its autodiff association: the store, the scores and the
    /// top-k run there (see [`ExactIndex::new`]).
    device: Device,
    rows: Vec<RowState>,
    store: Store,
}

// One per index: the size of the `Host` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Store {
    /// `[batch, kv_heads, alloc, d_head]` tensors on the device, detached.
    Device {
        keys: Option<Tensor<4>>,
        values: Option<Tensor<4>>,
    },
    /// The same in host memory.
    Host(HostStore),
}

impl ExactIndex {
    /// An empty memory for `batch` rows.
    ///
    /// The device store and its searches leave autodiff out (`Device::without_autodiff`):
    /// nothing in them is differentiated, and Burn 0.22.1's autodiff backend has no
    /// `topk_with_indices` of its own, so on an autodiff device the top-k falls back to Burn's
    /// default, a full sort, which CubeCL's backends (wgpu, CUDA) run on the host: every score
    /// copied to the CPU and back at each search. Without autodiff it is CubeCL's top-k
    /// reduction on the device.
    pub fn new(config: &KnnMemoryConfig, batch: usize, device: &Device) -> Self {
        let host = match config.topk {
            TopkPlacement::Host => true,
            TopkPlacement::Device => false,
            TopkPlacement::Auto => memzoo_backend::is_host_cpu(device),
        };
        let store = if host {
            Store::Host(HostStore::new(
                batch,
                config.kv_heads(),
                config.d_head,
                config.scoring.plan(config.d_head, config.max_memories),
            ))
        } else {
            Store::Device {
                keys: None,
                values: None,
            }
        };
        Self {
            config: config.clone(),
            device: device.clone().without_autodiff(),
            rows: vec![RowState::default(); batch],
            store,
        }
    }

    /// A memory holding `snapshot` (from [`crate::open`]).
    pub(crate) fn from_snapshot(config: &KnnMemoryConfig, snap: Snapshot, device: &Device) -> Self {
        let mut index = Self::new(config, snap.rows.len(), device);
        let (b, h, d) = (snap.rows.len(), config.kv_heads(), config.d_head);
        if snap.slots > 0 {
            index.store = match index.store {
                Store::Host(_) => Store::Host(HostStore::from_parts(
                    b,
                    h,
                    d,
                    config.scoring.plan(config.d_head, config.max_memories),
                    snap.slots,
                    snap.keys,
                    snap.values,
                )),
                Store::Device { .. } => {
                    let shape = [b, h, snap.slots, d];
                    let on_device =
                        |v| Some(Tensor::from_data(TensorData::new(v, shape), &index.device));
                    Store::Device {
                        keys: on_device(snap.keys),
                        values: on_device(snap.values),
                    }
                }
            };
        }
        index.rows = snap.rows;
        index
    }

    fn alloc(&self) -> usize {
        match &self.store {
            Store::Device { keys, .. } => keys.as_ref().map_or(0, |k| k.dims()[2]),
            Store::Host(host) => host.alloc,
        }
    }

    /// Grows the stores to at least `needed` slots (doubling, at most `max_memories`).
    fn grow(&mut self, needed: usize) {
        let alloc = self.alloc();
        if needed <= alloc {
            return;
        }
        let cap = self.config.max_memories;
        let new = needed.max(2 * alloc).max(256).min(cap);
        let [b, h, d] = [self.rows.len(), self.config.kv_heads(), self.config.d_head];
        match &mut self.store {
            Store::Host(host) => host.grow(new),
            Store::Device { keys, values } => {
                let extend = |t: Option<Tensor<4>>| {
                    let pad = Tensor::zeros([b, h, new - alloc, d], &self.device);
                    Some(match t {
                        Some(t) => Tensor::cat(vec![t, pad], 2),
                        None => pad,
                    })
                };
                *keys = extend(keys.take());
                *values = extend(values.take());
            }
        }
    }

    /// Slot indices `[batch, kv_heads, n, kk]` and their emptiness for the `n` queries per
    /// kv head of `q` (`[batch, kv_heads, n, d]`) against all `slots` allocated slots of
    /// `keys` (`[batch, kv_heads, slots, d]`; a row's slots from its length on are hidden), in
    /// query chunks of a power of two so that a score block stays under [`SCORE_BLOCK`]
    /// elements.
    ///
    /// The shapes depend only on the allocation, which doubles, and not on how full the
    /// memory is: a GPU backend compiles (and autotunes) its kernels per shape, so a search
    /// over exactly the filled slots, 512 more each step, would meet new shapes every step.
    fn topk(&self, q: Tensor<4>, keys: &Tensor<4>, kk: usize) -> (Tensor<4, Int>, Tensor<4, Bool>) {
        // Autodiff's top-k is a host sort on CubeCL (see `new`): a broken invariant, not input.
        assert!(
            !q.is_autodiff() && !keys.is_autodiff(),
            "the device search runs without autodiff"
        );
        let [batch, kv_heads, rows, _] = q.dims();
        let slots = keys.dims()[2];
        let hidden = self.rows.iter().any(|r| r.len < slots).then(|| {
            let mut hidden = Vec::with_capacity(batch * slots);
            for r in &self.rows {
                hidden.extend((0..slots).map(|s| s >= r.len));
            }
            Tensor::<4, Bool>::from_data(
                TensorData::new(hidden, [batch, 1, 1, slots]),
                &self.device,
            )
        });
        let fit = (SCORE_BLOCK / (batch * kv_heads * slots).max(1)).max(1);
        // The largest power of two that fits.
        let chunk = (1usize << fit.ilog2()).min(rows);
        let kt = keys.clone().transpose();
        let mut idx_parts = Vec::new();
        let mut empty_parts = Vec::new();
        for start in (0..rows).step_by(chunk) {
            let t = chunk.min(rows - start);
            // S = Q Kᵀ: [batch, kv_heads, t, d] x [batch, kv_heads, d, slots]
            let mut scores = q.clone().narrow(2, start, t).matmul(kt.clone());
            if let Some(h) = &hidden {
                scores = scores.mask_fill(h.clone().expand([batch, kv_heads, t, slots]), EMPTY);
            }
            let (vals, idx) = blocked_topk(scores, kk);
            idx_parts.push(idx);
            empty_parts.push(vals.lower_elem(EMPTY_BELOW));
        }
        (Tensor::cat(idx_parts, 2), Tensor::cat(empty_parts, 2))
    }
}

impl KnnIndex for ExactIndex {
    fn kind(&self) -> IndexKind {
        IndexKind::Exact
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
        let [batch, tokens, _, _] = keys.dims();
        if tokens == 0 {
            return Ok(());
        }
        let cap = self.config.max_memories;
        let needed = self
            .rows
            .iter()
            .map(|r| (r.len + tokens).min(cap))
            .max()
            .unwrap_or(0);
        self.grow(needed);
        match &mut self.store {
            Store::Host(host) => {
                let keys = host_vec(keys);
                let values = host_vec(values);
                for b in 0..batch {
                    let (runs, next) = self.rows[b].plan(tokens, cap);
                    for (slot, offset, count) in runs {
                        host.write(&keys, &values, tokens, b, offset, slot, count);
                    }
                    self.rows[b] = next;
                }
            }
            Store::Device {
                keys: store_k,
                values: store_v,
            } => {
                // [batch, tokens, heads, d] -> [batch, heads, tokens, d], on our device, without autodiff.
                let keys = keys
                    .without_autodiff()
                    .to_device(&self.device)
                    .swap_dims(1, 2);
                let values = values
                    .without_autodiff()
                    .to_device(&self.device)
                    .swap_dims(1, 2);
                let mut sk = store_k.take().expect("grown");
                let mut sv = store_v.take().expect("grown");
                for b in 0..batch {
                    let (runs, next) = self.rows[b].plan(tokens, cap);
                    for (slot, offset, count) in runs.into_iter().filter(|r| r.2 > 0) {
                        let src = s![b..b + 1, .., offset..offset + count, ..];
                        let dst = s![b..b + 1, .., slot..slot + count, ..];
                        sk = sk.slice_assign(dst, keys.clone().slice(src));
                        sv = sv.slice_assign(dst, values.clone().slice(src));
                    }
                    self.rows[b] = next;
                }
                *store_k = Some(sk);
                *store_v = Some(sv);
            }
        }
        Ok(())
    }

    fn search(&self, queries: Tensor<4>, k: usize) -> Result<Retrieved, MemoryError> {
        check_queries(queries.dims(), self.batch(), &self.config)?;
        if k == 0 {
            return Err(MemoryError::Input("k must be positive, got 0".into()));
        }
        let [batch, tokens, heads, d] = queries.dims();
        let filled = self.rows.iter().map(|r| r.len).max().unwrap_or(0);
        let out_device = queries.device();
        let empty_result = || Retrieved {
            keys: Tensor::zeros([batch, tokens, heads, k, d], &out_device),
            values: Tensor::zeros([batch, tokens, heads, k, d], &out_device),
            mask: Tensor::<4, Bool>::from_data(
                TensorData::new(
                    vec![true; batch * tokens * heads * k],
                    [batch, tokens, heads, k],
                ),
                &out_device,
            ),
        };
        if filled == 0 || tokens == 0 {
            return Ok(empty_result());
        }
        let (keys, values) = match &self.store {
            Store::Host(host) => {
                let q = host_vec(queries);
                let hits = host.search(&self.rows, &q, tokens, self.config.group(), k);
                let shape = [batch, tokens, heads, k, d];
                return Ok(Retrieved {
                    keys: Tensor::from_data(TensorData::new(hits.keys, shape), &out_device),
                    values: Tensor::from_data(TensorData::new(hits.values, shape), &out_device),
                    mask: Tensor::from_data(
                        TensorData::new(hits.empty, [batch, tokens, heads, k]),
                        &out_device,
                    ),
                });
            }
            // Every allocated slot, not only the filled ones (see `topk`).
            Store::Device { keys, values } => (
                keys.clone().expect("filled"),
                values.clone().expect("filled"),
            ),
        };
        // [batch, tokens, kv_heads * group, d] -> [batch, kv_heads, group * tokens, d]: the
        // queries of a kv head's group stacked, query head g * group + j at rows j * tokens..
        let (hk, group) = (self.config.kv_heads(), self.config.group());
        let n = group * tokens;
        let q = queries
            .without_autodiff()
            .to_device(&self.device)
            .reshape([batch, tokens, hk, group, d])
            .permute([0, 2, 3, 1, 4])
            .reshape([batch, hk, n, d]);
        let kk = k.min(filled);
        let (idx, empty) = self.topk(q, &keys, kk);
        // Gather by slot: [batch, kv_heads, n * kk, d]
        let gather_idx = idx
            .reshape([batch, hk, n * kk, 1])
            .expand([batch, hk, n * kk, d]);
        let pick = |store: Tensor<4>| {
            store
                .gather(2, gather_idx.clone())
                .reshape([batch, heads, tokens, kk, d])
                .permute([0, 2, 1, 3, 4])
        };
        let (mut rk, mut rv) = (pick(keys), pick(values));
        let mut mask = empty
            .reshape([batch, heads, tokens, kk])
            .permute([0, 2, 1, 3]);
        // Zero the empty slots so that they carry no stale data.
        let zero = mask
            .clone()
            .unsqueeze_dim::<5>(4)
            .expand([batch, tokens, heads, kk, d]);
        rk = rk.mask_fill(zero.clone(), 0.0);
        rv = rv.mask_fill(zero, 0.0);
        if kk < k {
            let pad = [batch, tokens, heads, k - kk, d];
            rk = Tensor::cat(vec![rk, Tensor::zeros(pad, &self.device)], 3);
            rv = Tensor::cat(vec![rv, Tensor::zeros(pad, &self.device)], 3);
            let pad_mask = Tensor::<4, Bool>::from_data(
                TensorData::new(
                    vec![true; batch * tokens * heads * (k - kk)],
                    [batch, tokens, heads, k - kk],
                ),
                &self.device,
            );
            mask = Tensor::cat(vec![mask, pad_mask], 3);
        }
        // Back on the queries' device, with their autodiff association (as constants).
        let back = |t: Tensor<5>| match t.to_device(&out_device) {
            t if out_device.is_autodiff() => t.autodiff(),
            t => t,
        };
        Ok(Retrieved {
            keys: back(rk),
            values: back(rv),
            mask: mask.to_device(&out_device),
        })
    }

    fn clear(&mut self, rows: &[usize]) -> Result<(), MemoryError> {
        check_rows(rows, self.batch())?;
        for &r in rows {
            // The slots stay allocated; `len = 0` hides them from every search.
            self.rows[r] = RowState::default();
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, MemoryError> {
        let slots = self.rows.iter().map(|r| r.len).max().unwrap_or(0);
        let (keys, values) = match &self.store {
            Store::Host(host) if slots > 0 => host.prefix(slots),
            Store::Device {
                keys: Some(k),
                values: Some(v),
            } if slots > 0 => {
                let host = |t: &Tensor<4>| host_vec(t.clone().narrow(2, 0, slots));
                (host(k), host(v))
            }
            _ => (Vec::new(), Vec::new()),
        };
        Ok(Snapshot {
            rows: self.rows.clone(),
            slots,
            keys,
            values,
        })
    }

    fn save_extra(&self, _dir: &Path) -> Result<Vec<u32>, MemoryError> {
        Ok(Vec::new())
    }
}
