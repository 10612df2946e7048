//! The exact backend's host store, for CPU devices: pairs in plain host memory, and a search
//! that never materialises the full score matrix.
//!
//! For every (row, block of queries) in parallel and every kv head: `S = Q_block Kᵀ` (the
//! block's queries of every query head reading that kv head) with a GEMM
//! into a per-thread buffer (`block x stored` scores, column-major so that the GEMM reads the
//! keys in place), the top-k of every score row selected from it (`top_k_columns`), and the
//! winners' keys and values copied straight into the output layout. On a CPU this replaces the device path's chain of
//! tensor ops (matmul over the whole memory, copy of the scores to the host, index tensors,
//! gather, permute, mask fill), each of which streamed the full score matrix or the
//! `[.., k, d]` result through memory.

use rayon::prelude::*;

use crate::RowState;

/// Query rows scored together against one (row, kv head) store (with grouped heads, a
/// block's tokens times the group's query heads): a `QUERY_BLOCK x stored` score buffer.
const QUERY_BLOCK: usize = 64;

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
}

/// What a search returns on the host: keys and values `[batch, tokens, heads, k, d]`, best
/// first, and `[batch, tokens, heads, k]` with `true` for slots that found no entry.
pub(crate) struct HostHits {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub empty: Vec<bool>,
}

impl HostStore {
    pub fn new(batch: usize, heads: usize, d: usize) -> Self {
        Self {
            batch,
            heads,
            d,
            alloc: 0,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// A store holding `slots` slots per (row, kv head) from `[batch, kv_heads, slots, d]` data.
    pub fn from_parts(
        batch: usize,
        heads: usize,
        d: usize,
        slots: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
    ) -> Self {
        Self {
            batch,
            heads,
            d,
            alloc: slots,
            keys,
            values,
        }
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
    }

    /// Writes token `token` of row `b` (from `[batch, tokens, heads, d]` data) into `slot`
    /// of every head.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        keys: &[f32],
        values: &[f32],
        tokens: usize,
        b: usize,
        token: usize,
        slot: usize,
    ) {
        let (h_n, d) = (self.heads, self.d);
        for h in 0..h_n {
            let src = ((b * tokens + token) * h_n + h) * d;
            let dst = self.offset(b, h, slot);
            self.keys[dst..dst + d].copy_from_slice(&keys[src..src + d]);
            self.values[dst..dst + d].copy_from_slice(&values[src..src + d]);
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
        // About QUERY_BLOCK score rows per GEMM, whatever the group size.
        let block = QUERY_BLOCK.div_ceil(group).clamp(1, tokens.max(1));
        // Tasks: (row, block of queries); each owns its slice of the outputs.
        let tasks: Vec<(usize, usize)> = (0..self.batch)
            .flat_map(|b| (0..tokens).step_by(block).map(move |t| (b, t)))
            .collect();
        let mut outs: Vec<(&mut [f32], &mut [f32], &mut [bool])> = Vec::new();
        {
            let (mut ks, mut vs, mut es) = (
                hits.keys.as_mut_slice(),
                hits.values.as_mut_slice(),
                hits.empty.as_mut_slice(),
            );
            for &(_, t0) in &tasks {
                let n = block.min(tokens - t0);
                let (k0, k1) = ks.split_at_mut(n * per_token * d);
                let (v0, v1) = vs.split_at_mut(n * per_token * d);
                let (e0, e1) = es.split_at_mut(n * per_token);
                outs.push((k0, v0, e0));
                (ks, vs, es) = (k1, v1, e1);
            }
        }
        tasks.into_par_iter().zip(outs).for_each_init(
            || (Vec::new(), Vec::new(), ColumnsTopK::default()),
            |(scores, packed, top): &mut (Vec<f32>, Vec<f32>, ColumnsTopK),
             ((b, t0), (ko, vo, eo))| {
                let filled = rows[b].len.min(self.alloc);
                if filled == 0 {
                    return;
                }
                let m = block.min(tokens - t0);
                // Score rows: r = i * group + j for token t0 + i and query head g * group + j.
                let n_rows = m * group;
                let kk = k.min(filled);
                scores.resize(n_rows * filled, 0.0);
                packed.resize(n_rows * d, 0.0);
                for g in 0..hk {
                    let store = self.offset(b, g, 0);
                    for i in 0..m {
                        // The group's heads are adjacent in a token's queries.
                        let src = ((b * tokens + t0 + i) * h_n + g * group) * d;
                        packed[i * group * d..(i + 1) * group * d]
                            .copy_from_slice(&q[src..src + group * d]);
                    }
                    // S = Q Kᵀ for this block and kv head: [m group, d] x [d, filled], written
                    // column-major (`scores[j * n_rows + r]`). With a row-major output `gemm`
                    // transposes the problem and packs every key again for each block of
                    // queries; column-major, it reads the keys where they are.
                    // SAFETY: every pointer/stride pair stays inside its slice: the
                    // n_rows x d packed queries, the first `filled` slots of store (b, g)
                    // read as a d x filled matrix, and the n_rows x filled buffer sized above.
                    unsafe {
                        gemm::gemm(
                            n_rows,
                            filled,
                            d,
                            scores.as_mut_ptr(),
                            n_rows as isize,
                            1,
                            false,
                            packed.as_ptr(),
                            1,
                            d as isize,
                            self.keys.as_ptr().add(store),
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
                    top_k_columns(&scores[..n_rows * filled], n_rows, kk, top);
                    for r in 0..n_rows {
                        let (i, h) = (r / group, g * group + r % group);
                        for (j, &(_, slot)) in top.rows[r].best.iter().enumerate() {
                            let src = store + slot as usize * d;
                            let dst = ((i * h_n + h) * k + j) * d;
                            ko[dst..dst + d].copy_from_slice(&self.keys[src..src + d]);
                            vo[dst..dst + d].copy_from_slice(&self.values[src..src + d]);
                            eo[(i * h_n + h) * k + j] = false;
                        }
                    }
                }
            },
        );
        hits
    }
}

/// Scratch buffers of [`top_k`], reused across rows.
#[derive(Debug, Default)]
pub(crate) struct TopK {
    /// Selected (score, index), best first after [`top_k`].
    pub best: Vec<(f32, u32)>,
    maxima: Vec<f32>,
    select: Vec<f32>,
}

/// Scores per block of [`top_k`]'s first pass.
const BLOCK: usize = 16;

/// Blocks per group when [`top_k`] selects its floor among group maxima (long rows).
const GROUP: usize = 16;

/// The `k` largest of `row` as (score, index) into `out.best`, best first, ties by index.
///
/// Two passes: the maximum of every block of 16 scores (branch-free, vectorised); the k-th
/// largest block maximum is a floor that at least `k` scores reach, so the top `k` are among
/// the scores ≥ floor, which live in the few blocks whose maximum reaches it. Those are
/// collected and the best `k` selected. About 4x faster than a single pass that keeps a
/// running top-k, whose many early replacements are branchy scalar work.
///
/// For long rows (at least `4 k` groups of [`GROUP`] blocks) the floor is the k-th largest
/// maximum of a group of blocks instead: at least `k` groups reach it, each with a score ≥ floor,
/// so it is still at most the k-th largest score. Selecting it among 16 times fewer maxima
/// matters: over 262,144 scores the selection among the block maxima took 12% of a Memorizing
/// step with exact search (`perf`), more than the rest of the first pass.
pub(crate) fn top_k(row: &[f32], k: usize, out: &mut TopK) {
    let n = row.len();
    let best = &mut out.best;
    best.clear();
    if n < 4 * k * BLOCK {
        best.extend(row.iter().enumerate().map(|(i, &s)| (s, i as u32)));
    } else {
        let full = n / BLOCK;
        out.maxima.clear();
        for c in row[..full * BLOCK].chunks_exact(BLOCK) {
            let mut m = [0f32; BLOCK / 2];
            for j in 0..BLOCK / 2 {
                m[j] = if c[j] > c[j + BLOCK / 2] {
                    c[j]
                } else {
                    c[j + BLOCK / 2]
                };
            }
            out.maxima.push(
                m.iter()
                    .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }),
            );
        }
        out.select.clear();
        if out.maxima.len() >= 4 * k * GROUP {
            out.select.extend(
                out.maxima
                    .chunks(GROUP)
                    .map(|g| g.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))),
            );
        } else {
            out.select.extend_from_slice(&out.maxima);
        }
        let floor = *out
            .select
            .select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a))
            .1;
        for (b, &m) in out.maxima.iter().enumerate() {
            if m >= floor {
                let at = b * BLOCK;
                for (i, &s) in row[at..at + BLOCK].iter().enumerate() {
                    if s >= floor {
                        best.push((s, (at + i) as u32));
                    }
                }
            }
        }
        for (i, &s) in row.iter().enumerate().skip(full * BLOCK) {
            if s >= floor {
                best.push((s, i as u32));
            }
        }
    }
    keep_best(best, k);
}

/// Keeps the best `k` of `best`, sorted best first, ties by index.
fn keep_best(best: &mut Vec<(f32, u32)>, k: usize) {
    let by_score = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if best.len() > k {
        best.select_nth_unstable_by(k - 1, by_score);
        best.truncate(k);
    }
    best.sort_unstable_by(by_score);
}

/// Scratch buffers of [`top_k_columns`], reused across calls; `rows[r].best` is row `r`'s
/// result.
#[derive(Debug, Default)]
pub(crate) struct ColumnsTopK {
    pub rows: Vec<TopK>,
    /// Block maxima, `[blocks, n_rows]`.
    maxima: Vec<f32>,
    /// Group maxima (long rows), `[groups, n_rows]`.
    groups: Vec<f32>,
    /// One row's group or block maxima, gathered for the selection.
    select: Vec<f32>,
    floors: Vec<f32>,
}

/// [`top_k`] of every row of a column-major `n_rows x n` matrix (`scores[j * n_rows + r]`):
/// the same two passes, the first one across the rows at once (the maxima of a block of
/// [`BLOCK`] columns are elementwise maxima of contiguous vectors), the floor per row, the
/// candidates collected block by block for all rows.
pub(crate) fn top_k_columns(scores: &[f32], n_rows: usize, k: usize, out: &mut ColumnsTopK) {
    let n = scores.len() / n_rows.max(1);
    out.rows.resize_with(n_rows, TopK::default);
    let column = |j: usize| &scores[j * n_rows..(j + 1) * n_rows];
    if n < 4 * k * BLOCK {
        // Short rows: each gathered and selected whole.
        for (r, top) in out.rows.iter_mut().enumerate() {
            out.select.clear();
            out.select.extend((0..n).map(|j| scores[j * n_rows + r]));
            top_k(&out.select, k, top);
        }
        return;
    }
    for top in &mut out.rows {
        top.best.clear();
    }
    {
        let blocks = n / BLOCK;
        out.maxima.clear();
        out.maxima.resize(blocks * n_rows, f32::NEG_INFINITY);
        for (b, m) in out.maxima.chunks_exact_mut(n_rows).enumerate() {
            for j in b * BLOCK..(b + 1) * BLOCK {
                for (x, &s) in m.iter_mut().zip(column(j)) {
                    *x = if s > *x { s } else { *x };
                }
            }
        }
        // Each row's floor, among group maxima on long rows (see `top_k`), `[groups, n_rows]`.
        let grouped = blocks >= 4 * k * GROUP;
        out.groups.clear();
        if grouped {
            for g in out.maxima.chunks(GROUP * n_rows) {
                let at = out.groups.len();
                out.groups.extend_from_slice(&g[..n_rows]);
                for c in g.chunks_exact(n_rows).skip(1) {
                    for (x, &m) in out.groups[at..].iter_mut().zip(c) {
                        *x = if m > *x { m } else { *x };
                    }
                }
            }
        }
        let candidates = if grouped { &out.groups } else { &out.maxima };
        out.floors.clear();
        for r in 0..n_rows {
            out.select.clear();
            out.select
                .extend(candidates.chunks_exact(n_rows).map(|c| c[r]));
            let floor = *out
                .select
                .select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a))
                .1;
            out.floors.push(floor);
        }
        for (b, m) in out.maxima.chunks_exact(n_rows).enumerate() {
            for (r, (&mx, &floor)) in m.iter().zip(&out.floors).enumerate() {
                if mx >= floor {
                    for j in b * BLOCK..(b + 1) * BLOCK {
                        let s = scores[j * n_rows + r];
                        if s >= floor {
                            out.rows[r].best.push((s, j as u32));
                        }
                    }
                }
            }
        }
        for j in blocks * BLOCK..n {
            for (r, &s) in column(j).iter().enumerate() {
                if s >= out.floors[r] {
                    out.rows[r].best.push((s, j as u32));
                }
            }
        }
    }
    for top in &mut out.rows {
        keep_best(&mut top.best, k);
    }
}
