//! The host exact search's int8 first pass: every stored key also kept in int8, every query
//! scored against every key in int8 (AVX-512 VNNI where the CPU has it: 64 multiply-adds an
//! instruction, against 16 for an f32 FMA; else AVX2's `vpmaddubsw`, with queries in 7 bits),
//! and only the keys whose int8 score, widened by an error bound, can still reach a query's k
//! best scored again in f32. The result is the f32 search's: the same keys, best first by
//! their f32 scores, ties by slot.
//!
//! **The bound.** Keys are stored in blocks of 64 slots, each with one scale
//! `s_b = max |k_i| / 127` over the block's keys, as `k̂ = s_b round(k / s_b)`; a query is
//! taken as `q̂ = s_q round(q / s_q)`, `s_q = max_i |q_i| / 127` (`/ 63` for the AVX2
//! kernel). So
//! `|k_i − k̂_i| ≤ s_b / 2`, `|q_i − q̂_i| ≤ s_q / 2`, and
//!
//! ```text
//! |q·k − q̂·k̂| = |q·(k − k̂) + (q − q̂)·k̂| ≤ ‖q‖₂ ‖k − k̂‖₂ + ‖q − q̂‖₂ ‖k̂‖₂     (Cauchy-Schwarz)
//! ```
//!
//! where `‖k − k̂‖₂` and `‖k̂‖₂` are measured when a key is stored (their largest over the
//! block is kept) and `‖q‖₂`, `‖q − q̂‖₂` when a query is packed; plus the roundings of the
//! f32 scores (in [`Thresholds`]). A key whose int8 score `q̂·k̂` is below `F − E`, where `F`
//! is the k-th best f32 score among the keys scored so far (at most the final k-th best) and
//! `E` that bound, has `q·k < F` and cannot be among the k best.
//!
//! **The int8 product, compared in integers.** `q̂·k̂ = s_q s_b D` with the integer
//! `D = Σ_i round(k_i / s_b) round(q_i / s_q)`, so the test `q̂·k̂ ≥ F − E` is
//! `D ≥ (F − E) / (s_q s_b)`: one integer threshold per query and block, and the scan itself
//! never leaves the integers. VNNI's `vpdpbusd` multiplies unsigned by signed bytes: keys are
//! stored as `round(k / s_b) + 128` (unsigned), queries as `round(q / s_q)` (signed), and
//! `Σ_i (k_i + 128) q_i = D + 128 Σ_i q_i`, whose second term, the query's own, is added to
//! its thresholds. Keys are laid out in tiles of 16 keys by 4 dimensions (one 64-byte
//! register): the register of dimensions `4j..4j + 4` of 16 keys, times query bytes
//! `4j..4j + 4` broadcast, adds to 16 lanes of scores at once.
//!
//! One scale per block instead of one per key costs little precision (the bound takes the
//! block's largest error either way: on Memorizing-small's keys it grew 12% and the keys scored
//! again 6%) and takes the per-key conversions and products out of the scan.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::host::keep_best;

/// Keys per tile: one 512-bit register of 32-bit scores.
const TILE: usize = 16;
/// Slots per block: one scale, one bound, one threshold per query, four tiles scored at once.
/// Stores are allocated in whole blocks.
const BLOCK: usize = 4 * TILE;
/// Query rows scored together (a register of scores each, per tile).
const QUAD: usize = 4;
/// Queries per vector of thresholds: per-query arrays are padded to a multiple.
const LANES: usize = 16;
/// The widest head the int8 scan takes (32 groups of 4 bytes).
pub(crate) const MAX_D: usize = 128;
/// The integer thresholds' range: beyond any `D` (`|D| <= 127 · 127 · 128 < 2^21`) and its
/// offset, and exact in f32.
const THRESHOLD_LIMIT: f32 = (1 << 30) as f32;

/// Which loop scores the int8 keys: both compute the same integers and the same thresholds,
/// so they find the same candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// AVX-512 VNNI (`vpdpbusd`).
    Vnni,
    /// AVX-VNNI (`vpdpbusd` on 256-bit registers): CPUs with AVX2 and AVX-VNNI but no
    /// AVX-512 (Intel's client cores since Alder Lake, Sierra Forest).
    AvxVnni,
    /// AVX2 (`vpmaddubsw`, then `vpmaddwd`): queries in 7 bits, so that the 16-bit sums of
    /// two byte products cannot saturate (`2 · 255 · 63 < 2^15`).
    Avx2,
    /// Plain loops, for CPUs without either.
    Portable,
}

impl Kernel {
    /// The VNNI kernel, where the CPU has AVX-512 F, BW and VNNI and `MEMZOO_SIMD` allows
    /// AVX-512 (`memzoo_backend::simd`).
    pub fn vnni() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if memzoo_backend::simd::avx512() && std::arch::is_x86_feature_detected!("avx512vnni") {
            return Some(Kernel::Vnni);
        }
        None
    }

    /// The AVX-VNNI kernel, where the CPU has AVX2 and AVX-VNNI and `MEMZOO_SIMD` leaves
    /// every extension on (its `avx2` cap stands for a CPU with AVX2 alone).
    pub fn avx_vnni() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if memzoo_backend::simd::avx2()
            && memzoo_backend::simd::simd_allows(memzoo_backend::simd::SimdLevel::Avx512)
            && std::arch::is_x86_feature_detected!("avxvnni")
        {
            return Some(Kernel::AvxVnni);
        }
        None
    }

    /// The AVX2 kernel, where the CPU has AVX2 and `MEMZOO_SIMD` allows it.
    pub fn avx2() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if memzoo_backend::simd::avx2() {
            return Some(Kernel::Avx2);
        }
        None
    }

    /// The fastest kernel this CPU has and `MEMZOO_SIMD` allows: AVX-512 VNNI, else
    /// AVX-VNNI, else AVX2, else plain loops.
    pub fn best() -> Self {
        Self::vnni()
            .or_else(Self::avx_vnni)
            .or_else(Self::avx2)
            .unwrap_or(Kernel::Portable)
    }

    /// Every kernel this CPU can run (the tests compare them).
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        let mut all = vec![Kernel::Portable];
        all.extend(Self::avx2());
        all.extend(Self::avx_vnni());
        all.extend(Self::vnni());
        all
    }

    /// The largest query byte: 127, or 63 for the AVX2 kernel.
    fn query_levels(self) -> f32 {
        match self {
            Kernel::Avx2 => 63.0,
            _ => 127.0,
        }
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

/// A block's scale and bound factors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct BlockInfo {
    /// `1 / s_b` (0 where every key of the block is zero, empty or non-finite).
    inv_scale: f32,
    /// The factors `(α, β)` of the bound `‖q‖₂ α + ‖q − q̂‖₂ β` (see [`Thresholds`]).
    alpha: f32,
    beta: f32,
}

/// The int8 copy of a host store's keys: per (row, kv head) store, `alloc` slots in tiles
/// `[alloc / 16, groups, 16 keys, 4 bytes]`, each slot's largest component, error and norm,
/// and each block's scale and bound factors.
#[derive(Debug, Clone)]
pub(crate) struct Int8Keys {
    kernel: Kernel,
    d: usize,
    /// `d` in groups of 4 bytes, rounded up to a power of two (the padding is zero).
    groups: usize,
    stores: usize,
    /// Slots per store, a multiple of [`BLOCK`].
    alloc: usize,
    /// `[stores, alloc / TILE, groups, TILE, 4]`: `round(k / s_b) + 128`.
    tiles: Vec<u8>,
    /// `[stores, alloc]`: `max_i |k_i|` (0 for an empty or non-finite key).
    maxabs: Vec<f32>,
    /// `[stores, alloc]`: `‖k − k̂‖₂` (infinite for a non-finite key: always scored in f32).
    errors: Vec<f32>,
    /// `[stores, alloc]`: `max(‖k‖₂, ‖k̂‖₂)`.
    norms: Vec<f32>,
    /// `[stores, alloc / BLOCK]`.
    blocks: Vec<BlockInfo>,
}

/// `kernel::<G>(args)` for a store of `groups` groups of four bytes per key (1, 2, 4, 8, 16 or
/// 32: the width rounded up to a power of two).
macro_rules! by_groups {
    ($kernel:ident, $groups:expr, $($arg:expr),*) => {
        match $groups {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            4 => $kernel::<4>($($arg),*),
            8 => $kernel::<8>($($arg),*),
            16 => $kernel::<16>($($arg),*),
            _ => $kernel::<32>($($arg),*),
        }
    };
}

impl Int8Keys {
    /// No slots yet in each of `stores` stores of keys `d` wide (`d <= MAX_D`).
    pub fn new(kernel: Kernel, stores: usize, d: usize) -> Self {
        assert!(d <= MAX_D);
        Self {
            kernel,
            d,
            groups: d.div_ceil(4).next_power_of_two(),
            stores,
            alloc: 0,
            tiles: Vec::new(),
            maxabs: Vec::new(),
            errors: Vec::new(),
            norms: Vec::new(),
            blocks: Vec::new(),
        }
    }

    fn store_bytes(&self) -> usize {
        self.alloc * self.groups * 4
    }

    /// Room for at least `slots` slots per store, keeping the written ones.
    pub fn grow(&mut self, slots: usize) {
        let new = slots.next_multiple_of(BLOCK);
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
        self.maxabs = regrow(&self.maxabs, stores, old, new, 0.0);
        self.errors = regrow(&self.errors, stores, old, new, 0.0);
        self.norms = regrow(&self.norms, stores, old, new, 0.0);
        let zero = BlockInfo::default();
        self.blocks = regrow(&self.blocks, stores, old / BLOCK, new / BLOCK, zero);
        self.alloc = new;
    }

    /// Stores slots `slots` of `store` from `keys`, the store's f32 keys (`[slots, d]` from
    /// slot 0; slots past its end read as zero). A block whose scale changes is quantised
    /// again whole, from `keys`.
    pub fn write(&mut self, store: usize, slots: std::ops::Range<usize>, keys: &[f32]) {
        let d = self.d;
        let key = |slot: usize| keys.get(slot * d..(slot + 1) * d);
        for slot in slots.clone() {
            self.maxabs[store * self.alloc + slot] = match key(slot) {
                Some(k) if k.iter().all(|x| x.is_finite()) => {
                    k.iter().fold(0.0f32, |m, x| m.max(x.abs()))
                }
                _ => 0.0,
            };
        }
        if slots.is_empty() {
            return;
        }
        for b in slots.start / BLOCK..slots.end.div_ceil(BLOCK) {
            let first = store * self.alloc + b * BLOCK;
            let m = self.maxabs[first..first + BLOCK]
                .iter()
                .fold(0.0f32, |m, &x| m.max(x));
            let inv_scale = if m > 0.0 { 127.0 / m } else { 0.0 };
            let at = store * self.alloc / BLOCK + b;
            // The whole block where its scale changed, else only the written slots.
            let redo = if self.blocks[at].inv_scale == inv_scale {
                slots.start.max(b * BLOCK)..slots.end.min((b + 1) * BLOCK)
            } else {
                b * BLOCK..(b + 1) * BLOCK
            };
            self.blocks[at].inv_scale = inv_scale;
            for slot in redo {
                self.quantise(store, slot, key(slot).unwrap_or(&[]), inv_scale);
            }
            // The block's factors, from its 64 slots. 1% for the roundings of the scales
            // and norms in f32; (d + 8) u for those of the f32 score (|error| <= d u
            // Σ|q_i k_i| <= d u ‖q‖₂ ‖k‖₂) and of the thresholds.
            let max = |v: &[f32]| {
                v[first..first + BLOCK]
                    .iter()
                    .fold(0.0f32, |m, &x| m.max(x))
            };
            let (e, n) = (max(&self.errors), max(&self.norms));
            let u = (d as f32 + 8.0) * f32::EPSILON;
            self.blocks[at].alpha = 1.01 * e + u * n;
            self.blocks[at].beta = (1.01 + u) * n;
        }
    }

    /// Writes `key` (empty: a zero key) into `slot` of `store` at the scale `127 / inv_scale`.
    fn quantise(&mut self, store: usize, slot: usize, key: &[f32], inv_scale: f32) {
        let finite = key.iter().all(|x| x.is_finite());
        let scale = if inv_scale > 0.0 {
            1.0 / inv_scale
        } else {
            0.0
        };
        let base = store * self.store_bytes() + (slot / TILE) * self.groups * TILE * 4;
        let lane = slot % TILE;
        let (mut err, mut hat, mut norm) = (0.0f32, 0.0f32, 0.0f32);
        for g in 0..self.groups {
            for b in 0..4 {
                let x = key.get(4 * g + b).copied().unwrap_or(0.0);
                // A non-finite key is stored as zero and always scored in f32.
                let v = if finite { quantise(x * inv_scale) } else { 0 };
                let dequantised = v as f32 * scale;
                err += (x - dequantised) * (x - dequantised);
                hat += dequantised * dequantised;
                norm += x * x;
                self.tiles[base + (g * TILE + lane) * 4 + b] = (v + 128) as u8;
            }
        }
        let at = store * self.alloc + slot;
        // `1 / inv_scale` is not `s_b` exactly: 1% in `α` covers its rounding.
        self.errors[at] = if finite { err.sqrt() } else { f32::INFINITY };
        self.norms[at] = hat.sqrt().max(norm.sqrt());
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
        scan.start(queries, self.d, self.groups, k, self.kernel.query_levels());
        let blocks = self.alloc / BLOCK;
        let view = Store {
            tiles: &self.tiles[store * self.store_bytes()..(store + 1) * self.store_bytes()],
            blocks: &self.blocks[store * blocks..(store + 1) * blocks],
            keys,
            d: self.d,
            filled: filled.min(self.alloc),
        };
        match self.kernel {
            // SAFETY: `Kernel::Vnni` is only chosen where `Kernel::vnni` found the features.
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni => unsafe { by_groups!(scan_vnni, self.groups, &view, queries, scan) },
            // SAFETY: `Kernel::AvxVnni` is only chosen where `Kernel::avx_vnni` found the
            // features.
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe {
                by_groups!(scan_avx_vnni, self.groups, &view, queries, scan)
            },
            // SAFETY: `Kernel::Avx2` is only chosen where `Kernel::best` found AVX2.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { by_groups!(scan_avx2, self.groups, &view, queries, scan) },
            _ => scan_portable(&view, self.groups, queries, scan),
        }
        scan.finish();
    }
}

/// One store's int8 tiles, blocks and f32 keys, as a scan reads them.
struct Store<'a> {
    tiles: &'a [u8],
    blocks: &'a [BlockInfo],
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

    /// The blocks a SIMD scan of keys `groups` groups wide reads, after checking what it
    /// reads without bounds checks: the tiles of every block (`groups * 64` bytes a tile),
    /// `groups` packed words per query, a threshold and an entry per query, and for the
    /// offers every valid slot's f32 key and every real query.
    #[cfg(target_arch = "x86_64")]
    fn scan_blocks(&self, queries: &[f32], scan: &Scan, groups: usize) -> usize {
        let n_pad = scan.floors.len();
        let blocks = self.filled.div_ceil(BLOCK);
        assert!(self.tiles.len() >= blocks * 4 * groups * TILE * 4 && self.blocks.len() >= blocks);
        assert!(scan.qpack.len() >= n_pad * groups && scan.thresholds.len() == n_pad);
        assert!(scan.entries.len() == n_pad);
        assert!(
            self.keys.len() >= self.filled * self.d && queries.len() == scan.heaps.len() * self.d
        );
        blocks
    }

    /// Block `b`'s start in a SIMD scan: every query's threshold for it, the f32 rows of block
    /// `b + 1` fetched when the last block had offers (`offered`; see [`prefetch_next_rows`](Self::prefetch_next_rows)),
    /// and a pointer to its tiles (`tile_bytes` each).
    ///
    /// # Safety
    /// The CPU must have AVX2; `b` below [`scan_blocks`](Self::scan_blocks)'s count.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn begin_block(
        &self,
        b: usize,
        scan: &mut Scan,
        tile_bytes: usize,
        offered: bool,
    ) -> *const u8 {
        // SAFETY: the caller's.
        unsafe { thresholds_avx2(scan, &self.blocks[b]) };
        if offered {
            self.prefetch_next_rows(b);
        }
        // SAFETY: block `b`'s four tiles lie inside `tiles` (`scan_blocks`).
        unsafe { self.tiles.as_ptr().add(4 * b * tile_bytes) }
    }

    /// Fetches the f32 rows of block `b + 1`, which the offers of some query of the task will
    /// most likely read, while block `b` is scored (a miss on each offered row was half of the
    /// offers' time). The kernels call it only after a block with offers: a scan of a few
    /// queries (a generated token's) offers in few blocks, and fetching every block's f32 rows,
    /// four times the bytes of its int8 tiles, made such a scan memory-bound.
    #[cfg(target_arch = "x86_64")]
    fn prefetch_next_rows(&self, b: usize) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let next = ((b + 1) * BLOCK * self.d).min(self.keys.len());
        let end = ((b + 2) * BLOCK * self.d).min(self.keys.len());
        for at in (next..end).step_by(16) {
            // SAFETY: `at` is inside `keys`; a prefetch reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.keys.as_ptr().add(at).cast()) };
        }
    }
}

/// The integer threshold of a query for a block: the least `Σ_i key_byte_i q_i` (the query's
/// offset included) whose int8 score can reach its floor `F`.
///
/// ```text
/// t = F − (‖q‖₂ α + ‖q − q̂‖₂ β) − 1e-6 |F|        (the bound E, and the subtraction's rounding)
/// y = t · (1 / s_q) · (1 / s_b),   less 2e-6 |y|    (these two products' roundings)
/// threshold = ⌊y⌋ + 128 Σ_i round(q_i / s_q)
/// ```
///
/// `i32::MAX` (nothing passes) for a query that takes nothing (`F = +∞`); `y` clamped to
/// `±2^30`, minus `2^30` where it is not a number (a non-finite key in the block, or a zero
/// scale times an infinite `t`: every key passes). The SIMD kernels compute the same floats,
/// 8 queries at a time, in the same order ([`thresholds_avx2`]).
struct Thresholds;

impl Thresholds {
    fn one(floor: f32, norm: f32, error: f32, inv_q: f32, offset: i32, b: &BlockInfo) -> i32 {
        if floor == f32::INFINITY {
            return i32::MAX;
        }
        let t = (floor - (norm * b.alpha + error * b.beta)) - 1e-6 * floor.abs();
        let y = t * inv_q * b.inv_scale;
        let y = y - 2e-6 * y.abs();
        let y = if y.is_nan() {
            -THRESHOLD_LIMIT
        } else {
            y.clamp(-THRESHOLD_LIMIT, THRESHOLD_LIMIT)
        };
        // ⌊y⌋ by a conversion (|y| <= 2^30).
        let mut f = y as i32;
        if f as f32 > y {
            f -= 1;
        }
        f + offset
    }
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
/// best `k` so far. Per-query arrays are padded to a multiple of [`LANES`].
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Per query, `groups` words of 4 signed bytes.
    qpack: Vec<i32>,
    /// Per query: `1 / s_q` (0 for a zero query: its int8 scores are all 0).
    qinv: Vec<f32>,
    /// Per query: `128 Σ_i round(q_i / s_q)`, the unsigned keys' offset.
    qoff: Vec<i32>,
    /// Per query: `‖q‖₂`.
    qnorm: Vec<f32>,
    /// Per query: `‖q − q̂‖₂`.
    qerror: Vec<f32>,
    /// Per query: the k-th best f32 score so far (`F`); minus infinity before `k` are kept,
    /// plus infinity for padding and non-finite queries (nothing to keep).
    floors: Vec<f32>,
    /// Per query: its threshold for the block being scanned ([`Thresholds`]).
    thresholds: Vec<i32>,
    /// The block's queries with lanes that passed: (query, lanes), at most one per query.
    entries: Vec<(u32, u64)>,
    /// Per query: the best `k` so far, worst on top.
    heaps: Vec<BinaryHeap<Reverse<Candidate>>>,
    /// Per query, after the scan: its best `k` (f32 score, slot), best first.
    pub rows: Vec<Vec<(f32, u32)>>,
    /// (query, key) pairs scored again in f32 by the last scan.
    pub rescored: usize,
    k: usize,
}

impl Scan {
    /// Packs `queries` (`[n, d]`) with bytes up to `levels` (127, or 63 for AVX2) and empties
    /// the best `k` of each.
    fn start(&mut self, queries: &[f32], d: usize, groups: usize, k: usize, levels: f32) {
        let n = queries.len() / d;
        let n_pad = n.next_multiple_of(LANES);
        self.k = k;
        let reset = |v: &mut Vec<f32>, x: f32| {
            v.clear();
            v.resize(n_pad, x);
        };
        reset(&mut self.qinv, 0.0);
        reset(&mut self.qnorm, 0.0);
        reset(&mut self.qerror, 0.0);
        reset(&mut self.floors, f32::INFINITY);
        self.qpack.clear();
        self.qpack.resize(n_pad * groups, 0);
        self.qoff.clear();
        self.qoff.resize(n_pad, 0);
        self.thresholds.clear();
        self.thresholds.resize(n_pad, i32::MAX);
        self.entries.clear();
        self.entries.resize(n_pad, (0, 0));
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
            let sq = m / levels;
            let inv = if m > 0.0 { levels / m } else { 0.0 };
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
            // `inv` is `1 / s_q` up to its rounding (in the thresholds' margin).
            self.qinv[r] = inv;
            self.qoff[r] = 128 * sum;
            // 1% for the roundings of these norms.
            self.qnorm[r] = 1.01 * norm.sqrt();
            self.qerror[r] = 1.01 * err.sqrt();
            self.floors[r] = f32::NEG_INFINITY;
        }
    }

    /// The queries of the scan (`n`; the per-query arrays hold `n` rounded up to [`LANES`]).
    fn real_rows(&self) -> usize {
        self.heaps.len()
    }

    /// Every query's threshold for block `b`, in plain loops.
    fn thresholds_portable(&mut self, b: &BlockInfo) {
        for r in 0..self.floors.len() {
            self.thresholds[r] = Thresholds::one(
                self.floors[r],
                self.qnorm[r],
                self.qerror[r],
                self.qinv[r],
                self.qoff[r],
                b,
            );
        }
    }

    /// Keeps `slot`, f32 score `s`, for query `r` if it beats the k-th best so far (a NaN
    /// score never does), raising the floor. Slots come in increasing order, so one that
    /// ties the floor ranks after it.
    #[inline]
    fn offer(&mut self, r: usize, slot: usize, s: f32) {
        self.rescored += 1;
        if s.is_nan() || s <= self.floors[r] {
            return;
        }
        self.keep(r, Candidate(s, slot as u32));
    }

    #[inline(never)]
    fn keep(&mut self, r: usize, c: Candidate) {
        let heap = &mut self.heaps[r];
        if heap.len() < self.k {
            heap.push(Reverse(c));
        } else if let Some(mut worst) = heap.peek_mut() {
            // One sift instead of a pop and a push.
            *worst = Reverse(c);
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

/// `a·b` in f32 in a fixed order, the one [`dot_avx512`] computes: 16 partial sums (lane
/// `i` of chunk `c` of 16, zero-padded, added to sum `i`), then halves added pairwise
/// (`i + 8`, `i + 4`, `i + 2`, `i + 1`).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (xs, ys) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (x_tail, y_tail) = (xs.remainder(), ys.remainder());
    for (x, y) in xs.zip(ys) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    if !x_tail.is_empty() {
        // The last chunk zero-padded: `+ 0·0` in the lanes past the end too.
        let pad = |v: &[f32], i: usize| v.get(i).copied().unwrap_or(0.0);
        for (i, sum) in acc.iter_mut().enumerate() {
            *sum += pad(x_tail, i) * pad(y_tail, i);
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// [`dot`] with AVX-512: the same floats.
///
/// # Safety
/// The CPU must have AVX-512 F; `a` and `b` are `d` floats each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn dot_avx512(a: *const f32, b: *const f32, d: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm512_setzero_ps();
    for c in (0..d).step_by(LANES) {
        // SAFETY: a whole chunk is inside both; the mask reads only the `d` floats of each.
        let (x, y) = unsafe {
            if d - c >= LANES {
                (_mm512_loadu_ps(a.add(c)), _mm512_loadu_ps(b.add(c)))
            } else {
                let m = (1u16 << (d - c)) - 1;
                (
                    _mm512_maskz_loadu_ps(m, a.add(c)),
                    _mm512_maskz_loadu_ps(m, b.add(c)),
                )
            }
        };
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
    }
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(acc), high);
    let h = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_add_ss(h, _mm_shuffle_ps::<1>(h, h));
    _mm_cvtss_f32(h)
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
    while mask != 0 {
        let slot = first + mask.trailing_zeros() as usize;
        mask &= mask - 1;
        let s = dot(
            &queries[r * d..(r + 1) * d],
            &store.keys[slot * d..(slot + 1) * d],
        );
        scan.offer(r, slot, s);
    }
}

/// The scan in plain loops: query `r` passes slot `j` where `Σ_i key_byte_i q_i` reaches its
/// threshold, as in the VNNI kernel.
fn scan_portable(store: &Store, groups: usize, queries: &[f32], scan: &mut Scan) {
    let n_pad = scan.floors.len();
    let tile_bytes = groups * TILE * 4;
    for b in 0..store.filled.div_ceil(BLOCK) {
        scan.thresholds_portable(&store.blocks[b]);
        for r in 0..n_pad {
            for t in 4 * b..4 * b + 4 {
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
                    if (valid >> lane) & 1 == 1 && acc >= scan.thresholds[r] {
                        mask |= 1 << lane;
                    }
                }
                offer_lanes(store, queries, scan, r, t * TILE, mask);
            }
        }
    }
}

/// Every query's threshold for block `b` ([`Thresholds::one`]'s floats, 8 queries at once),
/// for both SIMD kernels.
///
/// # Safety
/// The CPU must have AVX2; the per-query arrays are padded to a multiple of [`LANES`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn thresholds_avx2(scan: &mut Scan, b: &BlockInfo) {
    use std::arch::x86_64::*;
    let n_pad = scan.floors.len();
    assert!(n_pad.is_multiple_of(LANES) && [scan.qnorm.len(), scan.qerror.len()] == [n_pad; 2]);
    assert!([scan.qinv.len(), scan.qoff.len(), scan.thresholds.len()] == [n_pad; 3]);
    let (alpha, beta) = (_mm256_set1_ps(b.alpha), _mm256_set1_ps(b.beta));
    let inv_scale = _mm256_set1_ps(b.inv_scale);
    let limit = _mm256_set1_ps(THRESHOLD_LIMIT);
    let low = _mm256_set1_ps(-THRESHOLD_LIMIT);
    let abs = |x: __m256| _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    // The real queries' vectors (the padding keeps its `i32::MAX` from `start`).
    for r in (0..scan.real_rows().next_multiple_of(8)).step_by(8) {
        // SAFETY: `r + 8 <= n_pad`, the length of every array read and written.
        unsafe {
            let floor = _mm256_loadu_ps(scan.floors.as_ptr().add(r));
            let norm = _mm256_loadu_ps(scan.qnorm.as_ptr().add(r));
            let error = _mm256_loadu_ps(scan.qerror.as_ptr().add(r));
            let inv_q = _mm256_loadu_ps(scan.qinv.as_ptr().add(r));
            let offset = _mm256_loadu_si256(scan.qoff.as_ptr().add(r).cast());
            let e = _mm256_add_ps(_mm256_mul_ps(norm, alpha), _mm256_mul_ps(error, beta));
            let margin = _mm256_mul_ps(_mm256_set1_ps(1e-6), abs(floor));
            let t = _mm256_sub_ps(_mm256_sub_ps(floor, e), margin);
            let y = _mm256_mul_ps(_mm256_mul_ps(t, inv_q), inv_scale);
            let y = _mm256_sub_ps(y, _mm256_mul_ps(_mm256_set1_ps(2e-6), abs(y)));
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y);
            let y = _mm256_min_ps(_mm256_max_ps(y, low), limit);
            let y = _mm256_blendv_ps(y, low, nan);
            let f = _mm256_cvttps_epi32(_mm256_floor_ps(y));
            let thr = _mm256_add_epi32(f, offset);
            let none = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                floor,
                _mm256_set1_ps(f32::INFINITY),
            ));
            let thr = _mm256_blendv_epi8(thr, _mm256_set1_epi32(i32::MAX), none);
            _mm256_storeu_si256(scan.thresholds.as_mut_ptr().add(r).cast(), thr);
        }
    }
}

/// The scan with AVX-512 VNNI, for keys of `G` groups: per block (four tiles, 64 slots) and
/// quad of queries, sixteen registers of 16 int32 scores, `G` steps of four tile loads and
/// sixteen `vpdpbusd`; then, per query, its four registers compared with its threshold into
/// one 64-lane mask, written to the block's list of entries and kept if any lane passed (no
/// branch on the scores). The entries are offered after the block ([`offer_block`]): each
/// query's threshold for the block was fixed before it, and its lanes stay in slot order.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI, and the store's tiles their documented size
/// (`G * 64` bytes per tile, over whole blocks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scan_vnni<const G: usize>(store: &Store, queries: &[f32], scan: &mut Scan) {
    use std::arch::x86_64::*;
    // Whole quads over the real queries: the padding beyond them takes nothing.
    let n_scan = scan.real_rows().next_multiple_of(QUAD);
    let tile_bytes = G * TILE * 4;
    let blocks = store.scan_blocks(queries, scan, G);
    // Whether the last block had offers: the next block's f32 rows are fetched only then
    // (see `prefetch_next_rows`).
    let mut offered = true;
    for b in 0..blocks {
        // SAFETY: the CPU has AVX2 (implied by this function's AVX-512 F); `b < blocks`. (All
        // loads below: within the lengths `scan_blocks` asserted.)
        let tiles = unsafe { store.begin_block(b, scan, tile_bytes, offered) };
        // Each tile's lanes that hold written slots.
        let valid: [u16; 4] = std::array::from_fn(|w| store.valid(4 * b + w));
        let (qpack, thresholds) = (scan.qpack.as_ptr(), scan.thresholds.as_ptr());
        let entries = scan.entries.as_mut_ptr();
        let mut passed = 0;
        for r0 in (0..n_scan).step_by(QUAD) {
            let qp = unsafe { qpack.add(r0 * G) };
            // acc[4 u + w]: query r0 + u, tile w.
            let mut acc = [_mm512_setzero_si512(); 4 * QUAD];
            for g in 0..G {
                // Plain loops, no closures, in both kernels: a closure of intrinsics that
                // LLVM does not inline becomes a call per load (the AVX2 kernel ran 3x slower
                // so in one build).
                let mut k = [_mm512_setzero_si512(); 4];
                for (w, k) in k.iter_mut().enumerate() {
                    *k = unsafe { _mm512_loadu_si512(tiles.add(w * tile_bytes + g * 64).cast()) };
                }
                for u in 0..QUAD {
                    let q = _mm512_set1_epi32(unsafe { *qp.add(u * G + g) });
                    for w in 0..4 {
                        acc[4 * u + w] = _mm512_dpbusd_epi32(acc[4 * u + w], k[w], q);
                    }
                }
            }
            // Per query, its 64 lanes at or above its threshold (tile w in bits 16 w..16 w +
            // 16), written to the next entry, which is kept (`passed` moves on) only if one
            // passed: no branch on the scores.
            for u in 0..QUAD {
                // SAFETY: `r0 + 4 <= n_scan <= n_pad`, the thresholds' length.
                let thr = _mm512_set1_epi32(unsafe { *thresholds.add(r0 + u) });
                let mut m: [__mmask16; 4] = [0; 4];
                for (w, m) in m.iter_mut().enumerate() {
                    *m = _mm512_mask_cmpge_epi32_mask(valid[w], acc[4 * u + w], thr);
                }
                let low = _mm512_kunpackw(m[1] as __mmask32, m[0] as __mmask32);
                let high = _mm512_kunpackw(m[3] as __mmask32, m[2] as __mmask32);
                let lanes = _mm512_kunpackd(high as __mmask64, low as __mmask64);
                // SAFETY: `passed <= r0 + u < n_scan <= n_pad`, the entries' length.
                unsafe { *entries.add(passed) = ((r0 + u) as u32, lanes) };
                passed += (lanes != 0) as usize;
            }
        }
        offered = passed > 0;
        // The block's offers, in query order (each query's in slot order).
        // SAFETY: as this function.
        unsafe { offer_block(store, queries, scan, b, passed) };
    }
}

/// The offers of block `b`: per entry `(r, lanes)` of the first `passed` of
/// `scan.entries`, every slot `64 b + i` of bit `i` of `lanes` to query `r`. Apart from the
/// scan, so that its registers stay the scan's.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn offer_block(store: &Store, queries: &[f32], scan: &mut Scan, b: usize, passed: usize) {
    let d = store.d;
    offer_entries(scan, b, passed, |r, slot| {
        // SAFETY: a valid slot is below `filled`: its key is in `keys`, and a query that
        // passes one is a real row of `queries`; the CPU has AVX-512 F (this function's).
        unsafe {
            dot_avx512(
                queries.as_ptr().add(r * d),
                store.keys.as_ptr().add(slot * d),
                d,
            )
        }
    });
}

/// Per entry `(r, lanes)` of the first `passed` of `scan.entries`, every slot `64 b + i` of bit
/// `i` of `lanes` scored by `score(r, slot)` and offered to query `r`. Inlined into each
/// kernel's offers, with their instruction sets.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn offer_entries(scan: &mut Scan, b: usize, passed: usize, score: impl Fn(usize, usize) -> f32) {
    for e in 0..passed {
        let (r, mut m) = scan.entries[e];
        let r = r as usize;
        while m != 0 {
            let slot = b * BLOCK + m.trailing_zeros() as usize;
            m &= m - 1;
            let s = score(r, slot);
            scan.offer(r, slot, s);
        }
    }
}

/// The 8 lanes of `acc` over `thr`, as bits `32 half + 8 j..` of a block's 64: the 256-bit
/// kernels' masks.
macro_rules! ymm_lanes {
    ($acc:ident, $thr:ident, $half:ident, $j:literal) => {{
        let pass = _mm256_cmpgt_epi32($acc, $thr);
        let m = _mm256_movemask_ps(_mm256_castsi256_ps(pass)) as u32 as u64;
        m << (32 * $half + 8 * $j)
    }};
}

/// The scan with 256-bit registers, for keys of `G` groups: per block, pair of queries and half
/// block (two tiles, 32 slots), eight registers of 8 int32 scores, `G` steps of four loads and
/// eight `$dot4` (a word's four byte products added to the scores); then the same per-query
/// masks, list of entries and offers after the block as [`scan_vnni`] (with [`dot`] for the
/// f32 scores). Two kernels differ only in `$dot4`: [`scan_avx2`] and [`scan_avx_vnni`].
macro_rules! scan_ymm {
    ($(#[$attr:meta])* fn $name:ident, $dot4:path) => {
        $(#[$attr])*
        unsafe fn $name<const G: usize>(store: &Store, queries: &[f32], scan: &mut Scan) {
            use std::arch::x86_64::*;
            // Whole pairs over the real queries: the padding beyond them takes nothing.
            let n_scan = scan.real_rows().next_multiple_of(2);
            let tile_bytes = G * TILE * 4;
            let blocks = store.scan_blocks(queries, scan, G);
            let ones = _mm256_set1_epi16(1);
            let d = store.d;
            // Whether the last block had offers: the next block's f32 rows are fetched only then
            // (see `prefetch_next_rows`).
            let mut offered = true;
            for b in 0..blocks {
                // SAFETY: the CPU has AVX2 (among this function's features); `b < blocks`.
                // (All loads below: within the lengths `scan_blocks` asserted.)
                let tiles = unsafe { store.begin_block(b, scan, tile_bytes, offered) };
                let valid = (0..4).fold(0u64, |m, w| m | (store.valid(4 * b + w) as u64) << (16 * w));
                let (qpack, thresholds) = (scan.qpack.as_ptr(), scan.thresholds.as_ptr());
                let entries = scan.entries.as_mut_ptr();
                let mut passed = 0;
                for r0 in (0..n_scan).step_by(2) {
                    let qp = unsafe { qpack.add(r0 * G) };
                    // `acc >= threshold` as `acc > threshold - 1` (thresholds are above i32::MIN).
                    let thr0 = _mm256_set1_epi32(unsafe { *thresholds.add(r0) } - 1);
                    let thr1 = _mm256_set1_epi32(unsafe { *thresholds.add(r0 + 1) } - 1);
                    let mut lanes = [0u64; 2];
                    for half in 0..2 {
                        // `a{u}{j}`: query r0 + u, keys 8 j..8 j + 8 of this half's 32. Named
                        // registers and no closures (see `scan_vnni`): the 8 accumulators, 4 key
                        // vectors, the query word and `ones` fill the 16 YMM registers, and an array
                        // here went through the stack in one build.
                        let z = _mm256_setzero_si256();
                        let (mut a00, mut a01, mut a02, mut a03) = (z, z, z, z);
                        let (mut a10, mut a11, mut a12, mut a13) = (z, z, z, z);
                        let first = unsafe { tiles.add(2 * half * tile_bytes) };
                        for g in 0..G {
                            // `k0 k1`: tile 2 half, keys 0..16 and 16..32 of this word; `k2 k3`: the
                            // next tile's.
                            let (k0, k1, k2, k3) = unsafe {
                                let t = first.add(g * 64);
                                (
                                    _mm256_loadu_si256(t.cast()),
                                    _mm256_loadu_si256(t.add(32).cast()),
                                    _mm256_loadu_si256(t.add(tile_bytes).cast()),
                                    _mm256_loadu_si256(t.add(tile_bytes + 32).cast()),
                                )
                            };
                            // Σ over the word's 4 bytes of key x query, added to the scores.
                            // SAFETY (the products): the CPU has this kernel's features.
                            let q0 = _mm256_set1_epi32(unsafe { *qp.add(g) });
                            a00 = unsafe { $dot4(a00, k0, q0, ones) };
                            a01 = unsafe { $dot4(a01, k1, q0, ones) };
                            a02 = unsafe { $dot4(a02, k2, q0, ones) };
                            a03 = unsafe { $dot4(a03, k3, q0, ones) };
                            let q1 = _mm256_set1_epi32(unsafe { *qp.add(G + g) });
                            a10 = unsafe { $dot4(a10, k0, q1, ones) };
                            a11 = unsafe { $dot4(a11, k1, q1, ones) };
                            a12 = unsafe { $dot4(a12, k2, q1, ones) };
                            a13 = unsafe { $dot4(a13, k3, q1, ones) };
                        }
                        lanes[0] |= ymm_lanes!(a00, thr0, half, 0) | ymm_lanes!(a01, thr0, half, 1);
                        lanes[0] |= ymm_lanes!(a02, thr0, half, 2) | ymm_lanes!(a03, thr0, half, 3);
                        lanes[1] |= ymm_lanes!(a10, thr1, half, 0) | ymm_lanes!(a11, thr1, half, 1);
                        lanes[1] |= ymm_lanes!(a12, thr1, half, 2) | ymm_lanes!(a13, thr1, half, 3);
                    }
                    for (u, &l) in lanes.iter().enumerate() {
                        let l = l & valid;
                        // SAFETY: `passed <= r0 + u < n_scan <= n_pad`, the entries' length.
                        unsafe { *entries.add(passed) = ((r0 + u) as u32, l) };
                        passed += (l != 0) as usize;
                    }
                }
                offered = passed > 0;
                offer_entries(scan, b, passed, |r, slot| {
                    dot(
                        &queries[r * d..(r + 1) * d],
                        &store.keys[slot * d..(slot + 1) * d],
                    )
                });
            }

        }
    };
}

scan_ymm!(
    /// [`scan_ymm`] with AVX2: `vpmaddubsw` + `vpmaddwd` + `vpaddd` per word ([`dot4_avx2`]).
    ///
    /// # Safety
    /// The CPU must have AVX2, and the store's tiles their documented size (`G * 64` bytes per
    /// tile, over whole blocks); the queries packed with bytes up to 63.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn scan_avx2,
    dot4_avx2
);

scan_ymm!(
    /// [`scan_ymm`] with AVX-VNNI: one `vpdpbusd` per word ([`dot4_avx_vnni`]).
    ///
    /// # Safety
    /// The CPU must have AVX2 and AVX-VNNI, and the store's tiles their documented size; the
    /// queries packed with bytes up to 127.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    fn scan_avx_vnni,
    dot4_avx_vnni
);

/// `acc + Σ_{i < 4} k_i q_i` per 32-bit lane, keys unsigned and queries signed bytes, with
/// AVX2: the byte pairs in i16 (`vpmaddubsw`: the queries in 7 bits, so that `2 · 255 · 63 <
/// 2^15` cannot saturate), the pairs' sums in i32 (`vpmaddwd` by `ones`).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot4_avx2(
    acc: std::arch::x86_64::__m256i,
    k: std::arch::x86_64::__m256i,
    q: std::arch::x86_64::__m256i,
    ones: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(k, q), ones))
}

/// [`dot4_avx2`] in one instruction (`vpdpbusd`, VEX-encoded: AVX-VNNI), the queries in 8
/// bits.
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn dot4_avx_vnni(
    acc: std::arch::x86_64::__m256i,
    k: std::arch::x86_64::__m256i,
    q: std::arch::x86_64::__m256i,
    _ones: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    std::arch::x86_64::_mm256_dpbusd_avx_epi32(acc, k, q)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thresholds: the AVX2 loop's equal the scalar function's for every query (edge
    /// cases included: no floor yet, a query that takes nothing, a zero query, a block of zero
    /// keys, a block with a non-finite key), and each is at most the exact
    /// `(F − E) / (s_q s_b)` (in f64) plus the query's offset, so that no key whose int8 score
    /// reaches `F − E` fails it.
    #[test]
    fn thresholds_are_the_same_floats_and_never_above_the_exact_one() {
        let mut rand = crate::tests::uniform(0x9e37_79b9);
        let n = 100;
        let mut scan = Scan::default();
        let queries: Vec<f32> = (0..n * 8).map(|_| rand() * 2.0 - 1.0).collect();
        scan.start(&queries, 8, 2, 4, 127.0);
        for r in 0..n {
            scan.floors[r] = match r % 10 {
                0 => f32::NEG_INFINITY,
                1 => f32::INFINITY,
                _ => (rand() * 2.0 - 1.0) * [1.0, 1e3, 1e-3][r % 3],
            };
        }
        // A zero query.
        scan.qinv[5] = 0.0;
        scan.qoff[5] = 0;
        let blocks = [
            BlockInfo {
                inv_scale: 127.0 / 0.4,
                alpha: 0.008,
                beta: 1.01,
            },
            BlockInfo {
                inv_scale: 127.0 / 30.0,
                alpha: 0.5,
                beta: 80.0,
            },
            BlockInfo {
                inv_scale: 0.0,
                alpha: 0.0,
                beta: 0.0,
            },
            BlockInfo {
                inv_scale: 127.0 / 0.4,
                alpha: f32::INFINITY,
                beta: 1.0,
            },
        ];
        for b in &blocks {
            scan.thresholds_portable(b);
            let portable = scan.thresholds.clone();
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2; `start` padded the arrays.
                unsafe { thresholds_avx2(&mut scan, b) };
                assert_eq!(scan.thresholds, portable, "{b:?}, AVX2");
            }
            for (r, &thr) in portable.iter().enumerate().take(n) {
                let (floor, thr) = (scan.floors[r], thr as i64);
                if floor == f32::INFINITY {
                    assert_eq!(thr, i32::MAX as i64);
                    continue;
                }
                let e =
                    scan.qnorm[r] as f64 * b.alpha as f64 + scan.qerror[r] as f64 * b.beta as f64;
                let exact = (floor as f64 - e) * scan.qinv[r] as f64 * b.inv_scale as f64;
                if exact.is_nan() || exact == f64::NEG_INFINITY {
                    // Every key passes.
                    assert!(thr - scan.qoff[r] as i64 <= -(1 << 21), "{b:?}, query {r}");
                } else {
                    assert!(
                        thr - scan.qoff[r] as i64 <= exact.floor() as i64,
                        "{b:?}, query {r}"
                    );
                }
            }
        }
    }
}
