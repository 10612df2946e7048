//! The exact backend's host store, for CPU devices: pairs in plain host memory, and a search
//! that never materialises the full score matrix.
//!
//! For every (row, block of queries) in parallel and every kv head: `S = Q_block Kᵀ` (the
//! block's queries of every query head reading that kv head) with a GEMM per chunk of stored
//! keys into a per-thread buffer (`block x chunk` scores, column-major so that the GEMM reads
//! the keys in place), each chunk's top-k candidates taken while it is in cache
//! (`ColumnsTopK`), and the winners' keys and values copied straight into the output layout.
//! With int8 scoring (`crate::int8`, where the CPU has AVX-512 VNNI) the GEMM and the
//! top-k of a (row, block, kv head) are one scan of the keys in int8 instead, the keys that
//! may reach the top-k scored again in f32: the same result.
//! On a CPU this replaces the device path's chain of tensor ops (matmul over the whole
//! memory, copy of the scores to the host, index tensors, gather, permute, mask fill), each of
//! which streamed the full score matrix or the `[.., k, d]` result through memory.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::RowState;
use crate::int8::{Int8Keys, Plan, Scan};

/// Query rows scored together against one (row, kv head) store (with grouped heads, a
/// block's tokens times the group's query heads).
const QUERY_BLOCK: usize = 64;

/// Query rows per task with int8 scoring, at least: each block of four key tiles (2 KiB at
/// width 32) is read from L1 by all of them (16 KiB of int8 queries). 512 against 256: 0.482
/// -> 0.462 s a Memorizing-small step at 262,144 keys on the 2-core Zen 5 (measured with the
/// scan of pairs of tiles).
const INT8_QUERY_BLOCK: usize = 512;

/// Query rows per task with int8 scoring, at most. Every task reads all of its store's keys
/// (the int8 tiles, and most f32 rows for the keys scored again), so fewer, larger tasks read
/// less: tasks are made as large as this while there is one per thread. On the 2-core Zen 5
/// at 262,144 keys (a Memorizing-small step, two replicas of 4,096 query rows per store):
/// 0.281-0.290 s with 512 rows per task, 0.273 with 1,024, 0.265-0.271 with 2,048.
const INT8_QUERY_BLOCK_MAX: usize = 2048;

/// With `auto` scoring, the share of (query, key) pairs an int8 search may score again in f32
/// before the next searches go to f32. On the 2-core Zen 5 at 262,144 keys a task of 512
/// queries costs the int8 search about 17 ms plus 5.6 ms per 1% scored again (queries of
/// Memorizing-small's steps: 0.28%, 18.6 ms; near copies of stored keys: 0.9%, 24.7 ms, and 4%,
/// 39.4 ms), the f32 GEMM search 60-100 ms (about 60 in the steps, 98.5 in that probe): even
/// between 7.7% and 14%, and at 65,536 keys likewise; the AVX2 kernel (45-50 ms with 0.38%
/// scored again) near 9%.
const INT8_MAX_RESCORED: f64 = 0.05;

/// Searches scored in f32 after an int8 search over [`INT8_MAX_RESCORED`], before int8 is
/// tried again.
const INT8_REST: u32 = 8;

/// Searches left to score in f32 before int8 is tried again (adaptive plans only).
#[derive(Debug, Default)]
pub(crate) struct Int8Rest(AtomicU32);

impl Clone for Int8Rest {
    fn clone(&self) -> Self {
        Self(AtomicU32::new(self.0.load(Ordering::Relaxed)))
    }
}

impl Int8Rest {
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Stored keys scored at once: a `QUERY_BLOCK x KEY_CHUNK` score block (2 MiB) is read for
/// its top-k candidates right after the product writes it, so the scores of a whole store
/// (64 MB at 262,144 keys) never go through memory. Measured on the 2-core AVX-512 machine
/// (`bench scale --families memorizing --index-kinds exact`), against one product over the
/// whole store: 29% off the step at 262,144 keys, level at 65,536, 2-6% slower at 8,192 and
/// 32,768, within about the runs' spread; chunks of 2,048 gained only 15% at 262,144 and lost
/// 10% at 8,192.
const KEY_CHUNK: usize = 8192;

/// Keys and values of every (row, kv head) store, `[batch, kv_heads, alloc, d_head]` each.
#[derive(Debug, Clone)]
pub(crate) struct HostStore {
    pub batch: usize,
    /// Key/value heads (stores per row).
    pub heads: usize,
    pub d: usize,
    /// Slots allocated per (row, kv head).
    pub alloc: usize,
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    /// The keys again in int8 for the search's first pass (`crate::int8`), used as `plan`
    /// says; `None`: every key scored in f32 by a GEMM.
    pub int8: Option<(Int8Keys, Plan)>,
    /// Adaptive plans: searches left in f32.
    pub int8_rest: Int8Rest,
}

/// What a search returns on the host: keys and values `[batch, tokens, heads, k, d]`, best
/// first, and `[batch, tokens, heads, k]` with `true` for slots that found no entry.
pub(crate) struct HostHits {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub empty: Vec<bool>,
}

impl HostStore {
    /// An empty store; with `int8`, searched with an int8 first pass as it says.
    pub fn new(batch: usize, heads: usize, d: usize, int8: Option<Plan>) -> Self {
        Self {
            batch,
            heads,
            d,
            alloc: 0,
            keys: Vec::new(),
            values: Vec::new(),
            int8: int8.map(|plan| (Int8Keys::new(plan.kernel, batch * heads, d), plan)),
            int8_rest: Int8Rest::default(),
        }
    }

    /// A store holding `slots` slots per (row, kv head) from `[batch, kv_heads, slots, d]`
    /// data.
    pub fn from_parts(
        batch: usize,
        heads: usize,
        d: usize,
        int8: Option<Plan>,
        slots: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
    ) -> Self {
        let mut store = Self::new(batch, heads, d, int8);
        store.alloc = slots;
        store.keys = keys;
        store.values = values;
        if let Some((q, _)) = &mut store.int8
            && slots > 0
        {
            q.grow(slots);
            for (s, keys) in store.keys.chunks_exact(slots * d).enumerate() {
                q.write(s, 0..slots, keys);
            }
        }
        store
    }

    fn offset(&self, b: usize, h: usize, slot: usize) -> usize {
        ((b * self.heads + h) * self.alloc + slot) * self.d
    }

    /// Grows every store to `new` slots, keeping the old ones in place.
    pub fn grow(&mut self, new: usize) {
        if new <= self.alloc {
            return;
        }
        let (stores, d, old) = (self.batch * self.heads, self.d, self.alloc);
        let regrow = |src: &[f32]| {
            let mut dst = vec![0.0; stores * new * d];
            for s in 0..stores {
                dst[s * new * d..(s * new + old) * d]
                    .copy_from_slice(&src[s * old * d..(s + 1) * old * d]);
            }
            dst
        };
        self.keys = regrow(&self.keys);
        self.values = regrow(&self.values);
        self.alloc = new;
        if let Some((q, _)) = &mut self.int8 {
            q.grow(new);
        }
    }

    /// Writes tokens `token..token + count` of row `b` (from `[batch, tokens, heads, d]`
    /// data) into slots `slot..slot + count` of every head (the int8 copy's blocks quantised
    /// once per run).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        keys: &[f32],
        values: &[f32],
        tokens: usize,
        b: usize,
        token: usize,
        slot: usize,
        count: usize,
    ) {
        let (h_n, d) = (self.heads, self.d);
        for h in 0..h_n {
            for i in 0..count {
                let src = ((b * tokens + token + i) * h_n + h) * d;
                let dst = self.offset(b, h, slot + i);
                self.keys[dst..dst + d].copy_from_slice(&keys[src..src + d]);
                self.values[dst..dst + d].copy_from_slice(&values[src..src + d]);
            }
            let first = self.offset(b, h, 0);
            if let Some((q, _)) = &mut self.int8 {
                // The store's keys, from which a block whose scale changes is quantised again.
                let store = &self.keys[first..first + self.alloc * d];
                q.write(b * h_n + h, slot..slot + count, store);
            }
        }
    }

    /// The first `slots` slots of every store, `[batch, heads, slots, d]` (keys, values).
    pub fn prefix(&self, slots: usize) -> (Vec<f32>, Vec<f32>) {
        let d = self.d;
        let take = |src: &[f32]| {
            let mut out = Vec::with_capacity(self.batch * self.heads * slots * d);
            for s in 0..self.batch * self.heads {
                let at = s * self.alloc * d;
                out.extend_from_slice(&src[at..at + slots * d]);
            }
            out
        };
        (take(&self.keys), take(&self.values))
    }

    /// The top-`k` stored keys by inner product for every query of `q`
    /// (`[batch, tokens, heads * group, d]`: query head `j` searches kv head `j / group`),
    /// each row searching its first `rows[b].len` slots.
    ///
    /// Per task (row, block of tokens) and kv head: the block's queries of the group's heads,
    /// packed as `[tokens_in_block * group, d]`, against the kv head's keys in one GEMM, so
    /// that a store's keys are packed once for all the query heads that read it.
    pub fn search(
        &self,
        rows: &[RowState],
        q: &[f32],
        tokens: usize,
        group: usize,
        k: usize,
    ) -> HostHits {
        let (hk, d) = (self.heads, self.d);
        let h_n = hk * group;
        let per_token = h_n * k;
        let mut hits = HostHits {
            keys: vec![0.0; self.batch * tokens * per_token * d],
            values: vec![0.0; self.batch * tokens * per_token * d],
            empty: vec![true; self.batch * tokens * per_token],
        };
        // About QUERY_BLOCK score rows per GEMM (INT8_QUERY_BLOCK to INT8_QUERY_BLOCK_MAX per
        // int8 scan), whatever the group size.
        let int8 = self.int8_for(rows);
        let rows_per_task = match int8 {
            Some(_) => {
                let rows = self.batch * tokens * group;
                (rows / rayon::current_num_threads()).clamp(INT8_QUERY_BLOCK, INT8_QUERY_BLOCK_MAX)
            }
            None => QUERY_BLOCK,
        };
        let block = rows_per_task.div_ceil(group).clamp(1, tokens.max(1));
        // Tasks: (row, block of queries, kv heads); each owns its slice of the outputs. A
        // single query per row (a generated token) is one task per kv head, so that the
        // stores' scans, each reading its whole store, share the threads; a token's heads are
        // adjacent in the outputs.
        let heads_per_task = if tokens == 1 { 1 } else { hk };
        let tasks: Vec<(usize, usize, std::ops::Range<usize>)> = (0..self.batch)
            .flat_map(|b| {
                (0..tokens).step_by(block).flat_map(move |t| {
                    (0..hk)
                        .step_by(heads_per_task)
                        .map(move |g| (b, t, g..g + heads_per_task))
                })
            })
            .collect();
        let mut outs: Vec<(&mut [f32], &mut [f32], &mut [bool])> = Vec::new();
        {
            let (mut ks, mut vs, mut es) = (
                hits.keys.as_mut_slice(),
                hits.values.as_mut_slice(),
                hits.empty.as_mut_slice(),
            );
            for (_, t0, heads) in &tasks {
                // Its tokens' pairs of its kv heads' query heads (of every head, or of one kv
                // head's for a single token: adjacent in the outputs either way).
                let n = block.min(tokens - t0) * heads.len() * group * k;
                let (k0, k1) = ks.split_at_mut(n * d);
                let (v0, v1) = vs.split_at_mut(n * d);
                let (e0, e1) = es.split_at_mut(n);
                outs.push((k0, v0, e0));
                (ks, vs, es) = (k1, v1, e1);
            }
        }
        // (query, key) pairs scored in int8, and again in f32.
        let (scored, rescored) = (AtomicUsize::new(0), AtomicUsize::new(0));
        tasks.into_par_iter().zip(outs).for_each_init(
            || {
                (
                    Vec::new(),
                    Vec::new(),
                    ColumnsTopK::default(),
                    Scan::default(),
                )
            },
            |(scores, packed, top, scan): &mut (Vec<f32>, Vec<f32>, ColumnsTopK, Scan),
             ((b, t0, heads), (ko, vo, eo))| {
                let filled = rows[b].len.min(self.alloc);
                if filled == 0 {
                    return;
                }
                let m = block.min(tokens - t0);
                // Score rows: r = i * group + j for token t0 + i and query head g * group + j.
                let n_rows = m * group;
                let kk = k.min(filled);
                packed.resize(n_rows * d, 0.0);
                // The outputs' query heads: those of the task's kv heads, from `h0`.
                let (h0, width) = (heads.start * group, heads.len() * group);
                for g in heads {
                    let store = self.offset(b, g, 0);
                    for i in 0..m {
                        // The group's heads are adjacent in a token's queries.
                        let src = ((b * tokens + t0 + i) * h_n + g * group) * d;
                        packed[i * group * d..(i + 1) * group * d]
                            .copy_from_slice(&q[src..src + group * d]);
                    }
                    let best = match int8 {
                        Some(int8) => {
                            let keys = &self.keys[store..store + filled * d];
                            int8.top_k(b * hk + g, filled, keys, packed, kk, scan);
                            scored.fetch_add(n_rows * filled, Ordering::Relaxed);
                            rescored.fetch_add(scan.rescored, Ordering::Relaxed);
                            &scan.rows
                        }
                        None => {
                            self.gemm_top_k(store, filled, packed, n_rows, kk, scores, top);
                            &top.rows
                        }
                    };
                    for (r, best) in best.iter().enumerate().take(n_rows) {
                        let (i, h) = (r / group, g * group + r % group);
                        for (j, &(_, slot)) in best.iter().enumerate() {
                            let src = store + slot as usize * d;
                            let at = (i * width + h - h0) * k + j;
                            ko[at * d..(at + 1) * d].copy_from_slice(&self.keys[src..src + d]);
                            vo[at * d..(at + 1) * d].copy_from_slice(&self.values[src..src + d]);
                            eo[at] = false;
                        }
                    }
                }
            },
        );
        if int8.is_some() && self.int8.as_ref().is_some_and(|(_, plan)| plan.adaptive) {
            let share = rescored.into_inner() as f64 / scored.into_inner().max(1) as f64;
            if share > INT8_MAX_RESCORED {
                self.int8_rest.0.store(INT8_REST, Ordering::Relaxed);
            }
        }
        hits
    }

    /// The int8 copy a search of `rows` scores with, if any: once the fullest store holds
    /// the plan's `from` keys, unless an adaptive plan rests (one search of its rest is used
    /// up here).
    fn int8_for(&self, rows: &[RowState]) -> Option<&Int8Keys> {
        let (int8, plan) = self.int8.as_ref()?;
        if rows.iter().map(|r| r.len).max().unwrap_or(0) < plan.from {
            return None;
        }
        let rest = self.int8_rest.get();
        if plan.adaptive && rest > 0 {
            self.int8_rest.0.store(rest - 1, Ordering::Relaxed);
            return None;
        }
        Some(int8)
    }

    /// The top `kk` of the first `filled` slots of the store at `store` for the `n_rows`
    /// packed queries (`[n_rows, d]`) in `top.rows`: a GEMM per chunk of keys, each chunk's
    /// candidates taken while it is in cache.
    #[allow(clippy::too_many_arguments)]
    fn gemm_top_k(
        &self,
        store: usize,
        filled: usize,
        packed: &[f32],
        n_rows: usize,
        kk: usize,
        scores: &mut Vec<f32>,
        top: &mut ColumnsTopK,
    ) {
        let d = self.d;
        scores.resize(n_rows * KEY_CHUNK.min(filled), 0.0);
        top.start(n_rows, kk);
        for c0 in (0..filled).step_by(KEY_CHUNK) {
            let c = KEY_CHUNK.min(filled - c0);
            if n_rows == 1 {
                // One query (a generated token's head): its dots eight keys at a time, where
                // `gemm`'s matrix-vector loop sums one register per key.
                let keys = &self.keys[store + c0 * d..store + (c0 + c) * d];
                memzoo_fused::row::dots_into(packed, keys, &mut scores[..c]);
                top.push(&scores[..c], c0);
                continue;
            }
            // S = Q Kᵀ for this block, kv head and chunk of keys: [n_rows, d] x [d, c],
            // written column-major (`scores[j * n_rows + r]`). With a row-major output `gemm`
            // transposes the problem and packs every key again for each block of queries;
            // column-major, it reads the keys where they are.
            // SAFETY: every pointer/stride pair stays inside its slice: the n_rows x d packed
            // queries, slots c0..c0 + c of the store at `store` (within the `filled` written
            // ones) read as a d x c matrix, and the n_rows x KEY_CHUNK buffer sized above.
            unsafe {
                gemm::gemm(
                    n_rows,
                    c,
                    d,
                    scores.as_mut_ptr(),
                    n_rows as isize,
                    1,
                    false,
                    packed.as_ptr(),
                    1,
                    d as isize,
                    self.keys.as_ptr().add(store + c0 * d),
                    d as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            top.push(&scores[..n_rows * c], c0);
        }
        top.finish();
    }
}

/// Scores per block: a block whose maximum is below a row's floor is skipped whole.
const BLOCK: usize = 16;

/// Keeps the best `k` of `best`, sorted best first, ties by index.
pub(crate) fn keep_best(best: &mut Vec<(f32, u32)>, k: usize) {
    let by_score = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if best.len() > k {
        best.select_nth_unstable_by(k - 1, by_score);
        best.truncate(k);
    }
    best.sort_unstable_by(by_score);
}

/// The running top-k of every row of a score matrix fed to it in chunks of columns, each
/// column-major (`scores[j * n_rows + r]`): [`start`](Self::start), [`push`](Self::push) per
/// chunk, [`finish`](Self::finish), then `rows[r]` is row `r`'s top-k, best first, ties by
/// index (a full sort's first `k`).
///
/// Each row keeps the candidates that reach its floor: at first the k-th largest block
/// maximum of its first chunk of at least `k` blocks (at least `k` scores reach it), later the
/// k-th best score kept. A chunk's blocks of [`BLOCK`] columns are skipped where their maximum
/// is below the floor; the maxima of a block are elementwise maxima of contiguous vectors, for
/// all rows at once. A later candidate equal to the floor ranks after the kept ones (ties by
/// index), so the floor never drops one of the final top-k.
#[derive(Debug, Default)]
pub(crate) struct ColumnsTopK {
    /// Per row: candidates (score, column), after `finish` the best `k`, best first.
    pub rows: Vec<Vec<(f32, u32)>>,
    k: usize,
    /// Per row: the k-th best score kept so far, or minus infinity.
    floors: Vec<f32>,
    /// A chunk's block maxima, `[blocks, n_rows]`.
    maxima: Vec<f32>,
    /// One row's block maxima, gathered for a selection.
    select: Vec<f32>,
}

impl ColumnsTopK {
    /// Starts `n_rows` empty rows, keeping `k` each (`k >= 1`).
    pub fn start(&mut self, n_rows: usize, k: usize) {
        self.rows.resize_with(n_rows, Vec::new);
        self.rows.truncate(n_rows);
        for best in &mut self.rows {
            best.clear();
        }
        self.k = k;
        self.floors.clear();
        self.floors.resize(n_rows, f32::NEG_INFINITY);
    }

    /// The next chunk of columns, column `j` of `scores` being column `first + j` of the row.
    pub fn push(&mut self, scores: &[f32], first: usize) {
        let n_rows = self.rows.len();
        if n_rows == 0 {
            return;
        }
        let n = scores.len() / n_rows;
        let blocks = n / BLOCK;
        self.maxima.clear();
        self.maxima.resize(blocks * n_rows, f32::NEG_INFINITY);
        for (m, block) in self
            .maxima
            .chunks_exact_mut(n_rows)
            .zip(scores.chunks_exact(BLOCK * n_rows))
        {
            for column in block.chunks_exact(n_rows) {
                for (x, &s) in m.iter_mut().zip(column) {
                    *x = if s > *x { s } else { *x };
                }
            }
        }
        // A row without a floor yet takes the k-th largest block maximum of this chunk: at
        // least k of its scores reach it, so it is at most the row's k-th best.
        let k = self.k;
        if blocks >= k {
            for r in 0..n_rows {
                if self.floors[r] == f32::NEG_INFINITY {
                    self.select.clear();
                    self.select
                        .extend(self.maxima.chunks_exact(n_rows).map(|c| c[r]));
                    self.floors[r] = *self
                        .select
                        .select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a))
                        .1;
                }
            }
        }
        for (b, m) in self.maxima.chunks_exact(n_rows).enumerate() {
            for (r, (&mx, &floor)) in m.iter().zip(&self.floors).enumerate() {
                if mx >= floor {
                    for j in b * BLOCK..(b + 1) * BLOCK {
                        let s = scores[j * n_rows + r];
                        if s >= floor {
                            self.rows[r].push((s, (first + j) as u32));
                        }
                    }
                }
            }
        }
        for j in blocks * BLOCK..n {
            for (r, &s) in scores[j * n_rows..(j + 1) * n_rows].iter().enumerate() {
                if s >= self.floors[r] {
                    self.rows[r].push((s, (first + j) as u32));
                }
            }
        }
        // Rows holding many candidates keep their best k, which raises their floor.
        for (best, floor) in self.rows.iter_mut().zip(&mut self.floors) {
            if best.len() >= 4 * k.max(BLOCK) {
                keep_best(best, k);
                *floor = best[k - 1].0;
            }
        }
    }

    /// Leaves each row's best `k`, sorted.
    pub fn finish(&mut self) {
        for best in &mut self.rows {
            keep_best(best, self.k);
        }
    }
}
