//! Configuration of a kNN memory: which index, its capacity and the HNSW parameters.

use burn::config::Config;
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use crate::KnnIndex;
use crate::error::MemoryError;
use crate::exact::ExactIndex;
use crate::hnsw::UsearchIndex;
use crate::reset::ResetWhenFull;

/// Which search structure a memory uses.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    /// Brute force: one batched matmul of the queries against every stored key, then top-k.
    /// Exact; cost grows linearly with the stored entries.
    Exact,
    /// usearch HNSW graph, inner product: approximate, cost grows ~logarithmically.
    Hnsw,
    /// Exact when `max_memories <= auto_crossover`, HNSW above (see [`KnnMemoryConfig`]).
    #[default]
    Auto,
}

impl std::str::FromStr for IndexKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(IndexKind::Exact),
            "hnsw" => Ok(IndexKind::Hnsw),
            "auto" => Ok(IndexKind::Auto),
            other => Err(format!(
                "unknown index kind `{other}`: expected exact, hnsw or auto"
            )),
        }
    }
}

/// Where the exact backend selects its top-k.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TopkPlacement {
    /// `Tensor::topk_with_indices` on the model's device (a GPU: one kernel).
    Device,
    /// Scores are copied to the host once per search and each row's top-k is a partial
    /// selection (`select_nth_unstable`), rows in parallel. Burn's CPU backends implement
    /// top-k as a full sort, which is far slower for 10^4-10^6 columns.
    Host,
    /// `Host` where [`memzoo_backend::is_host_cpu`] says the device computes in host memory
    /// (`flex`, LibTorch on the CPU), `Device` elsewhere.
    #[default]
    Auto,
}

/// How the exact backend's host store scores the stored keys (CPU devices; see
/// [`TopkPlacement`]). Every choice finds the same top-k.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum HostScoring {
    /// Every key in f32, a GEMM per chunk of keys with the top-k taken from its scores.
    F32,
    /// Every key in int8 first, then in f32 only the keys whose int8 score, widened by an
    /// error bound, can still reach the top-k (an int8 copy of the keys is kept, a quarter of
    /// their f32 size). AVX-512 VNNI where the CPU has it, else AVX-VNNI, else AVX2 (queries
    /// in 7 bits); elsewhere plain loops, far slower than `f32` (for tests). Heads up to 128
    /// wide.
    Int8,
    /// `int8` with the AVX2 kernel even where the CPU has AVX-512 VNNI or AVX-VNNI (plain
    /// loops without AVX2): to measure what a CPU with AVX2 alone runs (`bench scale
    /// --index-kinds exactint8avx2`).
    Int8Avx2,
    /// `int8` with the AVX-VNNI kernel even where the CPU has AVX-512 VNNI (the AVX2 kernel
    /// without AVX-VNNI): to measure what a CPU with AVX-VNNI but no AVX-512 runs (`bench
    /// scale --index-kinds exactint8avxvnni`).
    Int8AvxVnni,
    /// `int8` where a store holds at least [`HostScoring::AUTO_INT8_FROM`] keys on a CPU with
    /// AVX-512 VNNI or AVX-VNNI, or [`HostScoring::AUTO_INT8_AVX2_FROM`] with AVX2 only, `f32`
    /// elsewhere; and `f32` for the next 8
    /// searches of a memory whose int8 search scored more than 5% of its keys again in f32
    /// (queries with many keys about as close as their k-th best, where the f32 GEMM is
    /// faster).
    #[default]
    Auto,
}

impl HostScoring {
    /// Stored keys per (row, kv head) from which `auto` scores in int8: below it the f32
    /// GEMM was about as fast. Measured on the 2-core Zen 5 (`cargo xtask bench scale
    /// --families memorizing --index-kinds exactf32,exactint8`, a Memorizing-small step):
    /// int8 takes 2% less time at 8,192 (level), 3% at 16,384, 14% at 32,768, 25% at 65,536
    /// and 55% at 262,144 (0.291 against 0.648 s). The AVX-VNNI kernel's too: forced there
    /// (`exactint8avxvnni`), a segment's search at 16,384 took 0.038-0.045 s against 0.043 s
    /// with f32 scoring whose products use AVX-512, where a CPU with AVX-VNNI alone runs them
    /// at half the width.
    pub const AUTO_INT8_FROM: usize = 16384;

    /// As [`AUTO_INT8_FROM`](Self::AUTO_INT8_FROM), on a CPU with AVX2 but no AVX-512 VNNI.
    /// Measured on the 2-core Zen 5 with the AVX2 kernel forced (`cargo xtask bench scale
    /// --families memorizing --index-kinds exactf32,exactint8avx2`, a Memorizing-small step),
    /// against f32 scoring whose products there use AVX-512: level at 32,768 (0.235-0.239
    /// against 0.234-0.240 s), 4% less time at 65,536, 12% at 131,072, 20% at 262,144 (0.533
    /// against 0.669 s). A CPU with only AVX2 runs the f32 products at half the width; not
    /// measured on one.
    pub const AUTO_INT8_AVX2_FROM: usize = 32768;

    /// How a host store `d` wide of at most `max_memories` keys per store scores with this
    /// choice on this CPU; `None`: f32 (and no int8 copy of the keys: `auto` keeps none for
    /// stores that never reach the size from which it would score in int8).
    pub(crate) fn plan(self, d: usize, max_memories: usize) -> Option<crate::int8::Plan> {
        use crate::int8::{Kernel, MAX_D, Plan};
        if d > MAX_D {
            return None;
        }
        match self {
            HostScoring::F32 => None,
            HostScoring::Int8 => Some(Plan {
                kernel: Kernel::best(),
                from: 0,
                adaptive: false,
            }),
            HostScoring::Int8Avx2 => Some(Plan {
                kernel: Kernel::avx2().unwrap_or(Kernel::Portable),
                from: 0,
                adaptive: false,
            }),
            HostScoring::Int8AvxVnni => Some(Plan {
                kernel: Kernel::avx_vnni()
                    .or_else(Kernel::avx2)
                    .unwrap_or(Kernel::Portable),
                from: 0,
                adaptive: false,
            }),
            HostScoring::Auto => {
                let kernel = Kernel::best();
                let from = match kernel {
                    Kernel::Vnni | Kernel::AvxVnni => Self::AUTO_INT8_FROM,
                    Kernel::Avx2 => Self::AUTO_INT8_AVX2_FROM,
                    Kernel::Portable => return None,
                };
                (max_memories >= from).then_some(Plan {
                    kernel,
                    from,
                    adaptive: true,
                })
            }
        }
    }
}

impl std::str::FromStr for HostScoring {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(HostScoring::F32),
            "int8" => Ok(HostScoring::Int8),
            "int8avx2" => Ok(HostScoring::Int8Avx2),
            "int8avxvnni" => Ok(HostScoring::Int8AvxVnni),
            "auto" => Ok(HostScoring::Auto),
            other => Err(format!(
                "unknown host scoring `{other}`: expected f32, int8, int8avx2, int8avxvnni or \
                 auto"
            )),
        }
    }
}

/// What a memory does when an add would take a (row, kv head) store above `max_memories`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum WhenFull {
    /// Evict the oldest pairs (FIFO).
    #[default]
    Evict,
    /// Empty the row, then store the new pairs, which the next search does not see
    /// (memorizing-transformers-pytorch; see [`crate::reset`]).
    Reset,
}

/// HNSW (usearch) parameters.
#[derive(Config, Debug, PartialEq)]
pub struct HnswConfig {
    /// Graph degree `M` (fixed when the index is created). Default: 32 (on clustered keys,
    /// 262K stored: M 32 / ef 1024 reached recall@32 0.952 in 2.0 s per 1,024 queries,
    /// M 16 needed ef 2048 for 0.972 at 7.9 s; measured on busy cores).
    #[config(default = 32)]
    pub connectivity: usize,
    /// Candidate list size while inserting (`ef_construction`). Default: 64.
    #[config(default = 64)]
    pub expansion_add: usize,
    /// Candidate list size while searching (`ef`); raise it for recall, lower it for speed.
    /// Default: none, i.e. chosen by size ([`HnswConfig::expansion_search_for`]).
    #[config(default = "None")]
    pub expansion_search: Option<usize>,
}

impl HnswConfig {
    /// The search expansion used for a store of `max_memories` entries: the configured one,
    /// or by size `max_memories / 64` rounded up to a power of two, within `[1024, 8192]`.
    ///
    /// Measured recall@32 against exact search. Clustered 32-d unit keys (256 clusters),
    /// connectivity 32: 16K stored, ef 256: 0.991; 65K, ef 512: 0.992; 262K, ef 1024: 0.952.
    /// Real attention keys (`cargo xtask bench memory --real-keys`: a kNN layer's keys after
    /// 150 steps on tiny Shakespeare, 15,872 stored per head, 512 held-out keys as queries)
    /// are much harder: ef 256: 0.77-0.87, ef 1024: 0.88-0.93, ef 4096: 0.93-0.98 over four
    /// heads, at 0.04 / 0.2 / 0.7 s per 512 queries against 0.03-0.06 s for exact search.
    /// HNSW recall falls as a store grows, so a fixed `ef` would silently lose recall on
    /// large memories; and at the sizes we train with exact search is both exact and faster
    /// (hence [`KnnMemoryConfig::auto_crossover`]).
    pub fn expansion_search_for(&self, max_memories: usize) -> usize {
        self.expansion_search
            .unwrap_or_else(|| (max_memories / 64).next_power_of_two().clamp(1024, 8192))
    }
}

/// Configuration of a kNN key-value memory (one per attention layer, one store per batch row
/// and key/value head inside it).
///
/// Grouped / multi-query attention: the layer's `n_heads` query heads share `n_kv_heads`
/// key/value heads, query head `j` reading kv head `j / (n_heads / n_kv_heads)` (consecutive
/// query heads form a group). The memory stores the `n_kv_heads` heads once each and searches
/// a query head's neighbours in its kv head's store.
#[derive(Config, Debug)]
pub struct KnnMemoryConfig {
    /// Query heads: a search takes `[batch, tokens, n_heads, d_head]` queries and returns
    /// their neighbours per query head.
    pub n_heads: usize,
    /// Width of each key and value.
    pub d_head: usize,
    /// Key/value heads, each with its own store per batch row (see the crate docs for why
    /// per head), shared by `n_heads / n_kv_heads` consecutive query heads; `Some(1)`:
    /// multi-query, one store per row searched by every query head. Must divide `n_heads`.
    /// Default: none, one per query head (`n_kv_heads = n_heads`).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Entries kept per (batch row, kv head); when full the oldest are evicted. Default: 16,384.
    #[config(default = 16384)]
    pub max_memories: usize,
    /// Search structure. Default: `auto`.
    #[config(default = "IndexKind::Auto")]
    pub kind: IndexKind,
    /// `auto` picks exact search while `max_memories` is at most this. Default: 262,144.
    /// Measured on 2 busy CPU cores, one segment (512 tokens x 8 heads, top-32, 16K stored
    /// per head): exact 0.44-0.51 s against HNSW 1.07 s at recall 0.99 on clustered keys; on
    /// real attention keys HNSW needs ef 4096 for recall ≥ 0.93, ~15x slower than exact (see
    /// [`HnswConfig::expansion_search_for`]). Exact grows linearly with the store, so HNSW only
    /// pays off for memories of several hundred thousand entries per (row, head).
    #[config(default = 262144)]
    pub auto_crossover: usize,
    /// HNSW parameters (used by `hnsw`, and by `auto` above the crossover).
    #[config(default = "HnswConfig::new()")]
    pub hnsw: HnswConfig,
    /// Exact backend: where top-k is selected. Default: `auto`.
    #[config(default = "TopkPlacement::Auto")]
    pub topk: TopkPlacement,
    /// Exact backend on the host: how the keys are scored. Default: `auto` (int8 first where
    /// the CPU has AVX-512 VNNI).
    #[config(default = "HostScoring::Auto")]
    pub scoring: HostScoring,
    /// What happens when a row is full. Default: `evict` (the oldest pairs go first).
    #[config(default = "WhenFull::Evict")]
    pub when_full: WhenFull,
}

impl KnnMemoryConfig {
    /// The heads the memory stores: `n_kv_heads`, else `n_heads`.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Query heads per kv head, `n_heads / kv_heads()` (1 without grouping).
    pub fn group(&self) -> usize {
        self.n_heads / self.kv_heads().max(1)
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), MemoryError> {
        let bad = |m: String| Err(MemoryError::Config(m));
        for (name, v) in [
            ("n_heads", self.n_heads),
            ("d_head", self.d_head),
            ("n_kv_heads", self.kv_heads()),
            ("max_memories", self.max_memories),
            ("hnsw.connectivity", self.hnsw.connectivity),
            ("hnsw.expansion_add", self.hnsw.expansion_add),
            (
                "hnsw.expansion_search",
                self.hnsw.expansion_search.unwrap_or(1),
            ),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        if !self.n_heads.is_multiple_of(self.kv_heads()) {
            return bad(format!(
                "n_kv_heads ({}) must divide n_heads ({})",
                self.kv_heads(),
                self.n_heads
            ));
        }
        if self.scoring == HostScoring::Int8 && self.d_head > crate::int8::MAX_D {
            return bad(format!(
                "scoring int8 takes d_head up to {}, got {}",
                crate::int8::MAX_D,
                self.d_head
            ));
        }
        if self.hnsw.connectivity < 2 {
            return bad(format!(
                "hnsw.connectivity must be at least 2, got {}",
                self.hnsw.connectivity
            ));
        }
        Ok(())
    }

    /// The backend `kind` resolves to (`auto` decided by `max_memories`).
    pub fn resolved_kind(&self) -> IndexKind {
        match self.kind {
            IndexKind::Auto if self.max_memories <= self.auto_crossover => IndexKind::Exact,
            IndexKind::Auto => IndexKind::Hnsw,
            k => k,
        }
    }

    /// An empty memory for `batch` rows on `device`.
    pub fn init(&self, batch: usize, device: &Device) -> Result<Box<dyn KnnIndex>, MemoryError> {
        self.validate()?;
        if batch == 0 {
            return Err(MemoryError::Config("batch must be positive, got 0".into()));
        }
        let index: Box<dyn KnnIndex> = match self.resolved_kind() {
            IndexKind::Hnsw => Box::new(UsearchIndex::new(self, batch)?),
            _ => Box::new(ExactIndex::new(self, batch, device)),
        };
        Ok(self.wrap(index))
    }

    /// `index` with this config's [`when_full`](Self::when_full) behaviour.
    pub fn wrap(&self, index: Box<dyn KnnIndex>) -> Box<dyn KnnIndex> {
        match self.when_full {
            WhenFull::Evict => index,
            WhenFull::Reset => Box::new(ResetWhenFull::new(index)),
        }
    }
}
