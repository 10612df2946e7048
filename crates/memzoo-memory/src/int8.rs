//! The host exact search's int8 first pass: every stored key also kept in int8, every query
//! scored against every key in int8 (AVX-512 VNNI where the CPU has it: 64 multiply-adds an
//! instruction, against 16 for an f32 FMA), and only the keys whose int8 score, widened by an
//! error bound, can still reach a query's k best scored again in f32. The result is the f32
//! search's: the same keys, best first by their f32 scores, ties by slot.
//!
//! **The bound.** A key is stored as `k̂ = s_k round(k / s_k)` with `s_k = max_i |k_i| / 127`,
//! a query taken as `q̂ = s_q round(q / s_q)`, `s_q = max_i |q_i| / 127`; so
//! `|k_i − k̂_i| ≤ s_k / 2`, `|q_i − q̂_i| ≤ s_q / 2`, and
//!
//! ```text
//! |q·k − q̂·k̂| = |q·(k − k̂) + (q − q̂)·k̂| ≤ ‖q‖₂ ‖k − k̂‖₂ + ‖q − q̂‖₂ ‖k̂‖₂     (Cauchy-Schwarz)
//! ```
//!
//! where `‖k − k̂‖₂` and `‖k̂‖₂` are measured when a key is stored (their largest over each
//! pair of tiles, 32 slots, is kept) and `‖q‖₂`, `‖q − q̂‖₂` when a query is packed; plus the
//! roundings of the f32 scores (in [`threshold`]). A key whose int8 score `q̂·k̂` is below
//! `F − E`, where `F` is the k-th best f32 score among the keys scored so far (at most the
//! final k-th best) and `E` that bound, has `q·k < F` and cannot be among the k best. (The
//! rounding errors are at most `s/2` per component, so `E` is about `(‖q‖₂ s_k + s_q) √d / 2`
//! at worst and `√(d/12)` times the scales on average.)
//!
//! **The int8 product.** VNNI's `vpdpbusd` multiplies unsigned by signed bytes: keys are stored
//! as `round(k / s_k) + 128` (unsigned), queries as `round(q / s_q)` (signed), and
//! `Σ_i (k_i + 128) q_i = k·q + 128 Σ_i q_i`, whose second term is the query's own, subtracted
//! once. Keys are laid out in tiles of 16 keys by 4 dimensions (one 64-byte register): the
//! register of dimensions `4j..4j + 4` of 16 keys, times query bytes `4j..4j + 4` broadcast,
//! adds to 16 lanes of scores at once.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::host::keep_best;

/// Keys per tile: one 512-bit register of 32-bit scores.
const TILE: usize = 16;
/// Slots per step of the scan (two tiles, one bound); stores are allocated in multiples.
const PAIR: usize = 2 * TILE;
/// Query rows scored together (a register of scores each, per tile).
const QUAD: usize = 4;
/// The widest head the int8 scan takes (32 groups of 4 bytes).
pub(crate) const MAX_D: usize = 128;

/// Which loop scores the int8 keys: both compute the same integers and the same floats, so
/// they find the same candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// AVX-512 VNNI (`vpdpbusd`).
    Vnni,
    /// Plain loops, for CPUs without it.
    Portable,
}

impl Kernel {
    /// The kernel this CPU runs fastest, `None` where int8 scoring would not pay (no VNNI).
    pub fn detect() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
        {
            return Some(Kernel::Vnni);
        }
        None
    }
}

/// How a host store uses int8 scoring ([`crate::HostScoring::plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub kernel: Kernel,
    /// Keys in the fullest store from which a search scores in int8.
    pub from: usize,
    /// Whether a search that scores too many keys again in f32 sends the next ones to f32
    /// (`crate::host::Int8Rest`).
    pub adaptive: bool,
}

/// The int8 copy of a host store's keys: per (row, kv head) store, `alloc` slots in tiles
/// `[alloc / 16, groups, 16 keys, 4 bytes]`, each slot's scale, error and norm, and each
/// pair of tiles' bound factors.
#[derive(Debug, Clone)]
pub(crate) struct Int8Keys {
    kernel: Kernel,
    d: usize,
    /// `d` in groups of 4 bytes, rounded up to a power of two (the padding is zero).
    groups: usize,
    stores: usize,
    /// Slots per store, a multiple of [`PAIR`].
    alloc: usize,
    /// `[stores, alloc / TILE, groups, TILE, 4]`: `round(k / s_k) + 128`.
    tiles: Vec<u8>,
    /// `[stores, alloc]`: `s_k` (0 for an empty or non-finite key).
    scales: Vec<f32>,
    /// `[stores, alloc]`: `‖k − k̂‖₂` (infinite for a non-finite key: always scored in f32).
    errors: Vec<f32>,
    /// `[stores, alloc]`: `max(‖k‖₂, ‖k̂‖₂)`.
    norms: Vec<f32>,
    /// `[stores, alloc / PAIR]`: the pair's factors `(α, β)` of its bound
    /// `‖q‖₂ α + ‖q − q̂‖₂ β` (see [`threshold`]).
    bounds: Vec<(f32, f32)>,
}

impl Int8Keys {
    /// No slots yet in each of `stores` stores of keys `d` wide (`d <= MAX_D`).
    pub fn new(kernel: Kernel, stores: usize, d: usize) -> Self {
        debug_assert!(d <= MAX_D);
        Self {
            kernel,
            d,
            groups: d.div_ceil(4).next_power_of_two(),
            stores,
            alloc: 0,
            tiles: Vec::new(),
            scales: Vec::new(),
            errors: Vec::new(),
            norms: Vec::new(),
            bounds: Vec::new(),
        }
    }

    fn store_bytes(&self) -> usize {
        self.alloc * self.groups * 4
    }

    /// Room for at least `slots` slots per store, keeping the written ones.
    pub fn grow(&mut self, slots: usize) {
        let new = slots.next_multiple_of(PAIR);
        let old = self.alloc;
        if new <= old {
            return;
        }
        let stores = self.stores;
        fn regrow<T: Copy>(v: &[T], stores: usize, old: usize, new: usize, zero: T) -> Vec<T> {
            let mut out = vec![zero; stores * new];
            for s in 0..stores {
                out[s * new..s * new + old].copy_from_slice(&v[s * old..(s + 1) * old]);
            }
            out
        }
        // Tiles hold whole slots, so the old tiles of a store are a prefix of its new ones.
        let per_slot = self.groups * 4;
        self.tiles = regrow(&self.tiles, stores, old * per_slot, new * per_slot, 0);
        self.scales = regrow(&self.scales, stores, old, new, 0.0);
        self.errors = regrow(&self.errors, stores, old, new, 0.0);
        self.norms = regrow(&self.norms, stores, old, new, 0.0);
        self.bounds = regrow(&self.bounds, stores, old / PAIR, new / PAIR, (0.0, 0.0));
        self.alloc = new;
    }

    /// Stores `key` (`d` values) in `slot` of `store`.
    pub fn write(&mut self, store: usize, slot: usize, key: &[f32]) {
        let m = key.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let finite = key.iter().all(|x| x.is_finite());
        let scale = if finite && m > 0.0 { m / 127.0 } else { 0.0 };
        let inv = if scale > 0.0 { 127.0 / m } else { 0.0 };
        let base = store * self.store_bytes() + (slot / TILE) * self.groups * TILE * 4;
        let lane = slot % TILE;
        let (mut err, mut hat, mut norm) = (0.0f32, 0.0f32, 0.0f32);
        for g in 0..self.groups {
            for b in 0..4 {
                let x = key.get(4 * g + b).copied().unwrap_or(0.0);
                let v = quantise(x * inv);
                let dequantised = v as f32 * scale;
                err += (x - dequantised) * (x - dequantised);
                hat += dequantised * dequantised;
                norm += x * x;
                self.tiles[base + (g * TILE + lane) * 4 + b] = (v + 128) as u8;
            }
        }
        let at = store * self.alloc + slot;
        self.scales[at] = scale;
        self.errors[at] = if finite { err.sqrt() } else { f32::INFINITY };
        self.norms[at] = hat.sqrt().max(norm.sqrt());
        // The pair's factors, from its 32 slots.
        let first = at - slot % PAIR;
        let pair = |v: &[f32]| v[first..first + PAIR].iter().fold(0.0f32, |m, &x| m.max(x));
        let (e, n) = (pair(&self.errors), pair(&self.norms));
        // 1% for the roundings of the scales and norms in f32; (d + 8) u for those of the
        // two f32 scores: the rescoring's d products and sums (|error| <= d u Σ|q_i k_i| <=
        // d u ‖q‖₂ ‖k‖₂) and the int8 score's conversions and products (|error| <= 3 u
        // |q̂·k̂|, and ‖q̂‖₂ <= ‖q‖₂ + ‖q − q̂‖₂).
        let u = (self.d as f32 + 8.0) * f32::EPSILON;
        self.bounds[store * self.alloc / PAIR + slot / PAIR] = (1.01 * e + u * n, (1.01 + u) * n);
    }

    /// The top `k` (`k <= filled`) of the first `filled` slots of `store` for every query of
    /// `queries` (`[n, d]`), by f32 inner product with `keys` (the store's f32 keys, `[slots,
    /// d]`); `scan.rows[r]` is query `r`'s, best first, ties by slot.
    pub fn top_k(
        &self,
        store: usize,
        filled: usize,
        keys: &[f32],
        queries: &[f32],
        k: usize,
        scan: &mut Scan,
    ) {
        scan.start(queries, self.d, self.groups, k);
        let pairs = self.alloc / PAIR;
        let view = Store {
            tiles: &self.tiles[store * self.store_bytes()..(store + 1) * self.store_bytes()],
            scales: &self.scales[store * self.alloc..(store + 1) * self.alloc],
            bounds: &self.bounds[store * pairs..(store + 1) * pairs],
            keys,
            d: self.d,
            filled: filled.min(self.alloc),
        };
        match self.kernel {
            // SAFETY: `Kernel::Vnni` is only chosen where `Kernel::detect` found the
            // features.
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni => unsafe {
                match self.groups {
                    1 => scan_vnni::<1>(&view, queries, scan),
                    2 => scan_vnni::<2>(&view, queries, scan),
                    4 => scan_vnni::<4>(&view, queries, scan),
                    8 => scan_vnni::<8>(&view, queries, scan),
                    16 => scan_vnni::<16>(&view, queries, scan),
                    _ => scan_vnni::<32>(&view, queries, scan),
                }
            },
            _ => scan_portable(&view, self.groups, queries, scan),
        }
        scan.finish();
    }
}

/// One store's int8 tiles, scales, bounds and f32 keys, as a scan reads them.
struct Store<'a> {
    tiles: &'a [u8],
    scales: &'a [f32],
    bounds: &'a [(f32, f32)],
    keys: &'a [f32],
    d: usize,
    filled: usize,
}

impl Store<'_> {
    /// The lanes of tile `t` that hold written slots.
    fn valid(&self, t: usize) -> u16 {
        let n = self.filled.saturating_sub(t * TILE).min(TILE);
        ((1u32 << n) - 1) as u16
    }
}

/// The least int8 score a key of a pair with factors `(α, β)` needs to be scored in f32 by
/// a query with floor `F`, `‖q‖₂ = norm` and `‖q − q̂‖₂ = error`: `F − E`, with
/// `E = norm α + error β` (the bound, with the f32 scores' roundings) and `|F| 1e-6` for
/// the roundings of this subtraction. Plus infinity for a query that takes nothing, minus
/// infinity where the bound is not a number (a non-finite key: always scored in f32).
fn threshold(floor: f32, norm: f32, error: f32, (alpha, beta): (f32, f32)) -> f32 {
    if floor == f32::INFINITY {
        return f32::INFINITY;
    }
    let t = floor - (norm * alpha + error * beta) - 1e-6 * floor.abs();
    if t.is_nan() { f32::NEG_INFINITY } else { t }
}

/// A kept candidate, ordered worst first in a min-heap: by f32 score, then the lower slot
/// ranks higher.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate(f32, u32);

impl Eq for Candidate {}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A scan's per-query state, reused across searches: the int8 queries, their norms, and the
/// best `k` so far.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Per query (padded to a multiple of [`QUAD`]), `groups` words of 4 signed bytes.
    qpack: Vec<i32>,
    /// Per query: `s_q`.
    qscale: Vec<f32>,
    /// Per query: `128 Σ_i round(q_i / s_q)`, the unsigned keys' offset.
    qoff: Vec<i32>,
    /// Per query: `‖q‖₂`.
    qnorm: Vec<f32>,
    /// Per query: `‖q − q̂‖₂`.
    qerror: Vec<f32>,
    /// Per query: the k-th best f32 score so far (`F`); minus infinity before `k` are kept,
    /// plus infinity for padding and non-finite queries (nothing to keep).
    floors: Vec<f32>,
    /// Per query: the best `k` so far, worst on top.
    heaps: Vec<BinaryHeap<Reverse<Candidate>>>,
    /// Per query, after the scan: its best `k` (f32 score, slot), best first.
    pub rows: Vec<Vec<(f32, u32)>>,
    /// (query, key) pairs scored again in f32 by the last scan.
    pub rescored: usize,
    k: usize,
}

impl Scan {
    fn start(&mut self, queries: &[f32], d: usize, groups: usize, k: usize) {
        let n = queries.len() / d;
        let n_pad = n.next_multiple_of(QUAD);
        self.k = k;
        let reset = |v: &mut Vec<f32>, x: f32| {
            v.clear();
            v.resize(n_pad, x);
        };
        reset(&mut self.qscale, 0.0);
        reset(&mut self.qnorm, 0.0);
        reset(&mut self.qerror, 0.0);
        reset(&mut self.floors, f32::INFINITY);
        self.qpack.clear();
        self.qpack.resize(n_pad * groups, 0);
        self.qoff.clear();
        self.qoff.resize(n_pad, 0);
        self.rescored = 0;
        self.heaps.resize_with(n, BinaryHeap::new);
        self.heaps.truncate(n);
        for heap in &mut self.heaps {
            heap.clear();
        }
        for (r, q) in queries.chunks_exact(d).enumerate() {
            if !q.iter().all(|x| x.is_finite()) {
                // Every f32 score is NaN or infinite: the f32 search keeps no NaN, and here
                // such a query keeps nothing.
                continue;
            }
            let m = q.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let sq = m / 127.0;
            let inv = if m > 0.0 { 127.0 / m } else { 0.0 };
            let (mut sum, mut err, mut norm) = (0i32, 0.0f32, 0.0f32);
            for g in 0..groups {
                let mut word = [0u8; 4];
                for (b, byte) in word.iter_mut().enumerate() {
                    let x = q.get(4 * g + b).copied().unwrap_or(0.0);
                    let v = quantise(x * inv);
                    let e = x - v as f32 * sq;
                    err += e * e;
                    norm += x * x;
                    sum += v;
                    *byte = v as i8 as u8;
                }
                self.qpack[r * groups + g] = i32::from_le_bytes(word);
            }
            self.qscale[r] = sq;
            self.qoff[r] = 128 * sum;
            // 1% for the roundings of these norms.
            self.qnorm[r] = 1.01 * norm.sqrt();
            self.qerror[r] = 1.01 * err.sqrt();
            self.floors[r] = f32::NEG_INFINITY;
        }
    }

    /// The threshold of query `r` for a pair with bound factors `bound`.
    fn threshold(&self, r: usize, bound: (f32, f32)) -> f32 {
        threshold(self.floors[r], self.qnorm[r], self.qerror[r], bound)
    }

    /// Scores `slot` for query `r` in f32 and keeps it if it beats the k-th best so far
    /// (a NaN score never does), raising the floor.
    #[inline(never)]
    fn offer(&mut self, r: usize, slot: usize, q: &[f32], key: &[f32]) {
        let s = dot(q, key);
        if s.is_nan() {
            return;
        }
        let c = Candidate(s, slot as u32);
        let heap = &mut self.heaps[r];
        if heap.len() < self.k {
            heap.push(Reverse(c));
        } else if let Some(mut worst) = heap.peek_mut().filter(|w| c > w.0) {
            // One sift instead of a pop and a push.
            *worst = Reverse(c);
        } else {
            return;
        }
        if heap.len() == self.k {
            self.floors[r] = heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.0);
        }
    }

    /// Leaves each query's best `k`, sorted, in `rows`.
    fn finish(&mut self) {
        self.rows.resize_with(self.heaps.len(), Vec::new);
        self.rows.truncate(self.heaps.len());
        for (row, heap) in self.rows.iter_mut().zip(&mut self.heaps) {
            row.clear();
            row.extend(heap.drain().map(|Reverse(c)| (c.0, c.1)));
            keep_best(row, self.k);
        }
    }
}

/// `y` (`|y| <= 127`) rounded to an integer, half away from zero up to the rounding of
/// `y ± 0.5`: a conversion instead of `f32::round`'s call (this crate's baseline target has no
/// rounding instruction). Any integer near `y` would do: the bounds use the error of the
/// value chosen.
fn quantise(y: f32) -> i32 {
    ((y + 0.5f32.copysign(y)) as i32).clamp(-127, 127)
}

/// `a·b` in f32, in eight interleaved partial sums (the same order on every CPU).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Offers every lane of `mask` (slots `first..first + 16`) to query `r`.
fn offer_lanes(
    store: &Store,
    queries: &[f32],
    scan: &mut Scan,
    r: usize,
    first: usize,
    mut mask: u16,
) {
    let d = store.d;
    scan.rescored += mask.count_ones() as usize;
    while mask != 0 {
        let slot = first + mask.trailing_zeros() as usize;
        mask &= mask - 1;
        scan.offer(
            r,
            slot,
            &queries[r * d..(r + 1) * d],
            &store.keys[slot * d..(slot + 1) * d],
        );
    }
}

/// The scan in plain loops: the int8 score of query `r` and slot `j` is
/// `(Σ_i key_byte_i q_i − qoff_r) · (s_q s_k)`, in the same operations as the VNNI kernel.
fn scan_portable(store: &Store, groups: usize, queries: &[f32], scan: &mut Scan) {
    let n_pad = scan.floors.len();
    let tile_bytes = groups * TILE * 4;
    for p in 0..store.filled.div_ceil(PAIR) {
        for r in 0..n_pad {
            // One threshold for both tiles, as in the VNNI kernel.
            let thr = scan.threshold(r, store.bounds[p]);
            for t in [2 * p, 2 * p + 1] {
                let tile = &store.tiles[t * tile_bytes..(t + 1) * tile_bytes];
                let valid = store.valid(t);
                let mut mask = 0u16;
                for lane in 0..TILE {
                    let mut acc = 0i32;
                    for g in 0..groups {
                        let q = scan.qpack[r * groups + g].to_le_bytes();
                        for (b, &qb) in q.iter().enumerate() {
                            acc += tile[(g * TILE + lane) * 4 + b] as i32 * qb as i8 as i32;
                        }
                    }
                    let scale = scan.qscale[r] * store.scales[t * TILE + lane];
                    let approx = (acc - scan.qoff[r]) as f32 * scale;
                    if (valid >> lane) & 1 == 1 && approx >= thr {
                        mask |= 1 << lane;
                    }
                }
                offer_lanes(store, queries, scan, r, t * TILE, mask);
            }
        }
    }
}

/// The scan with AVX-512 VNNI, for keys of `G` groups: per pair of tiles (32 slots) and quad
/// of queries, eight registers of 16 int32 scores, `G` steps of two tile loads and eight
/// `vpdpbusd`, then eight compares with the thresholds; the lanes that pass are offered.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI, and the store's slices their documented sizes
/// (`tiles`: `G * 64` bytes per tile, `scales` one per slot, both over whole pairs).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scan_vnni<const G: usize>(store: &Store, queries: &[f32], scan: &mut Scan) {
    use std::arch::x86_64::*;
    let n_pad = scan.floors.len();
    let tile_bytes = G * TILE * 4;
    let pairs = store.filled.div_ceil(PAIR);
    assert!(store.tiles.len() >= pairs * 2 * tile_bytes && store.scales.len() >= pairs * PAIR);
    assert!(scan.qpack.len() >= n_pad * G);
    for p in 0..pairs {
        // SAFETY (all loads below): within the lengths asserted above.
        let t0 = unsafe { store.tiles.as_ptr().add(2 * p * tile_bytes) };
        let t1 = unsafe { t0.add(tile_bytes) };
        let ks = unsafe {
            [
                _mm512_loadu_ps(store.scales.as_ptr().add(p * PAIR)),
                _mm512_loadu_ps(store.scales.as_ptr().add(p * PAIR + TILE)),
            ]
        };
        let valid = [store.valid(2 * p), store.valid(2 * p + 1)];
        // The f32 rows of the next pair, which the offers of some query of the block will
        // most likely read: fetched while this pair is scored (a miss on each offered row
        // was half of the offers' time).
        let next = ((p + 1) * PAIR * store.d).min(store.keys.len());
        let end = ((p + 2) * PAIR * store.d).min(store.keys.len());
        for at in (next..end).step_by(16) {
            // SAFETY: `at` is inside `keys`; a prefetch reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(store.keys.as_ptr().add(at).cast()) };
        }
        let bound = store.bounds[p];
        for r0 in (0..n_pad).step_by(QUAD) {
            let qp = unsafe { scan.qpack.as_ptr().add(r0 * G) };
            let mut acc = [_mm512_setzero_si512(); 2 * QUAD];
            for g in 0..G {
                let (k0, k1) = unsafe {
                    (
                        _mm512_loadu_si512(t0.add(g * 64).cast()),
                        _mm512_loadu_si512(t1.add(g * 64).cast()),
                    )
                };
                for u in 0..QUAD {
                    let q = _mm512_set1_epi32(unsafe { *qp.add(u * G + g) });
                    acc[u] = _mm512_dpbusd_epi32(acc[u], k0, q);
                    acc[QUAD + u] = _mm512_dpbusd_epi32(acc[QUAD + u], k1, q);
                }
            }
            let mut masks = [0u16; 2 * QUAD];
            let mut any = 0u16;
            for u in 0..QUAD {
                let r = r0 + u;
                let thr = _mm512_set1_ps(scan.threshold(r, bound));
                let off = _mm512_set1_epi32(scan.qoff[r]);
                let qs = _mm512_set1_ps(scan.qscale[r]);
                for w in 0..2 {
                    let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[w * QUAD + u], off));
                    let approx = _mm512_mul_ps(v, _mm512_mul_ps(qs, ks[w]));
                    let m = _mm512_mask_cmp_ps_mask::<_CMP_GE_OQ>(valid[w], approx, thr);
                    masks[w * QUAD + u] = m;
                    any |= m;
                }
            }
            if any != 0 {
                for u in 0..QUAD {
                    for w in 0..2 {
                        let m = masks[w * QUAD + u];
                        if m != 0 {
                            let first = (2 * p + w) * TILE;
                            offer_lanes(store, queries, scan, r0 + u, first, m);
                        }
                    }
                }
            }
        }
    }
}
