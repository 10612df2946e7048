//! The kNN memory alone: time per segment (search top-32 for 512 tokens x 8 heads, then add
//! them) at several stored sizes per row, exact search against usearch's HNSW, with recall@32
//! of HNSW against exact. Keys are clustered 32-d vectors (attention keys cluster).

use std::time::Instant;

use burn::tensor::Device;
use memzoo_memory::keys::{clustered_keys, fill, recall, retrieved_ids, segment_tensors};
use memzoo_memory::{IndexKind, KnnMemoryConfig, MemoryError};

use crate::BenchArgs;
use crate::measure::Measurement;

/// The suite.
pub fn suite(args: &BenchArgs, device: &Device) -> Result<Vec<Measurement>, String> {
    let sizes: Vec<usize> = if args.quick {
        vec![16_384]
    } else {
        vec![16_384, 65_536]
    };
    let (heads, d, tokens, k) = (8, 32, 512, 32);
    let mut out = Vec::new();
    for n in sizes {
        let keys = clustered_keys(n + tokens, d, 256, 0.6, 20);
        let queries = clustered_keys(tokens, d, 256, 0.6, 21);
        let mut exact_ids = Vec::new();
        for kind in [IndexKind::Exact, IndexKind::Hnsw] {
            let config = KnnMemoryConfig::new(heads, d)
                .with_max_memories(n + tokens)
                .with_kind(kind);
            let t = time_segment(&config, 1, &keys, &queries, n, tokens, k, device)?;
            let rec = if kind == IndexKind::Exact {
                exact_ids = t.ids.clone();
                1.0
            } else {
                recall(&t.ids, &exact_ids, k)
            };
            let seg = t.add_s + t.search_s;
            out.push(one_pass(
                format!("memory-{}-{n}", format!("{kind:?}").to_lowercase()),
                args,
                serde_json::json!({"stored_per_row": n, "heads": heads, "d_head": d,
                    "tokens": tokens, "k": k, "kind": format!("{kind:?}"), "fill_s": t.fill_s,
                    "add_s": t.add_s, "search_s": t.search_s, "recall_at_k": rec}),
                seg,
                tokens,
            ));
        }
    }
    Ok(out)
}

/// HNSW against exact search on real attention keys: the normalised keys of a saved exact
/// memory (`dir`: `header.json` + `keys.f32`, `[batch, heads, slots, d_head]`). Per head of
/// row 0, the last 512 stored keys serve as queries (queries and keys of the kNN layer share
/// the unit sphere; real queries are not saved) against the others.
pub fn real_keys(
    args: &BenchArgs,
    device: &Device,
    dir: &std::path::Path,
) -> Result<Vec<Measurement>, String> {
    let read = |name: &str| {
        std::fs::read(dir.join(name)).map_err(|e| format!("{}: {e}", dir.join(name).display()))
    };
    let header: serde_json::Value = serde_json::from_slice(&read("header.json")?)
        .map_err(|e| format!("{}: {e}", dir.join("header.json").display()))?;
    let field = |k: &str| {
        header[k]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| format!("header.json has no number `{k}`"))
    };
    let (batch, heads, d, slots) = (
        field("batch")?,
        field("n_heads")?,
        field("d_head")?,
        field("slots")?,
    );
    let bytes = read("keys.f32")?;
    if bytes.len() != batch * heads * slots * d * 4 {
        return Err(format!(
            "keys.f32 has {} bytes, the header says {batch} x {heads} x {slots} x {d} floats",
            bytes.len()
        ));
    }
    let keys: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (tokens, k) = (512, 32);
    if slots < tokens + k {
        return Err(format!(
            "the memory holds {slots} entries per head; at least {} are needed",
            tokens + k
        ));
    }
    let stored = slots - tokens;
    let mut out = Vec::new();
    for h in 0..heads {
        let pool = &keys[h * slots * d..(h + 1) * slots * d];
        let queries = &pool[stored * d..];
        let mut exact_ids = Vec::new();
        // Exact, then HNSW at the default search expansion and at 4x and 16x of it.
        let ef = memzoo_memory::HnswConfig::new().expansion_search_for(slots);
        let runs = [
            (IndexKind::Exact, None),
            (IndexKind::Hnsw, None),
            (IndexKind::Hnsw, Some(4 * ef)),
            (IndexKind::Hnsw, Some(16 * ef)),
        ];
        for (kind, ef) in runs {
            let config = KnnMemoryConfig::new(1, d)
                .with_max_memories(slots)
                .with_kind(kind)
                .with_hnsw(memzoo_memory::HnswConfig::new().with_expansion_search(ef));
            let t = time_segment(&config, 1, pool, queries, stored, tokens, k, device)?;
            let rec = if kind == IndexKind::Exact {
                exact_ids = t.ids.clone();
                1.0
            } else {
                recall(&t.ids, &exact_ids, k)
            };
            let kind_name = format!("{kind:?}").to_lowercase();
            let ef_used = config.hnsw.expansion_search_for(slots);
            let label = match kind {
                IndexKind::Hnsw => format!("hnsw-ef{ef_used}"),
                _ => kind_name.clone(),
            };
            out.push(Measurement {
                name: format!("memory-real-keys-{label}-head{h}"),
                implementation: "memzoo".into(),
                backend: args.device.clone(),
                threads: args.threads,
                config: serde_json::json!({"source": dir.display().to_string(),
                    "stored": stored, "head": h, "d_head": d, "tokens": tokens, "k": k,
                    "kind": kind_name, "expansion_search": ef_used, "search_s": t.search_s,
                    "recall_at_k": rec}),
                steps: 1,
                step_s_median: t.search_s,
                step_s_min: t.search_s,
                step_s_max: t.search_s,
                tokens_per_s: tokens as f64 / t.search_s,
                params: 0,
                peak_rss_mb: crate::measure::peak_rss_mb(),
                ..Default::default()
            });
            if kind == IndexKind::Hnsw {
                println!(
                    "real keys, head {h}: HNSW (ef {ef_used}) recall@{k} = {rec:.3} over {stored} stored, search {:.3} s",
                    t.search_s
                );
            }
        }
    }
    Ok(out)
}

/// The exact-vs-HNSW crossover (`cargo xtask bench memory-crossover`, the table in
/// `memzoo_memory`'s docs): one segment (search top-32 for 512 tokens, then add them) at each
/// stored size, per index kind, with HNSW's recall@32 against exact. Env:
/// `MEMZOO_BENCH_SIZES` (default `16384,65536,262144`), `MEMZOO_BENCH_HEADS` (default 8),
/// `MEMZOO_BENCH_KV_HEADS` (default: one per head), `MEMZOO_BENCH_KINDS` (default
/// `exact,hnsw`), `MEMZOO_BENCH_EF` (HNSW expansion_search), `MEMZOO_BENCH_M` (HNSW
/// connectivity).
pub fn crossover(args: &BenchArgs, device: &Device) -> Result<Vec<Measurement>, String> {
    fn env<T: std::str::FromStr>(name: &str) -> Result<Option<Vec<T>>, String> {
        let Ok(text) = std::env::var(name) else {
            return Ok(None);
        };
        text.split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .map_err(|_| format!("{name}={text}: `{s}` is not a value"))
            })
            .collect::<Result<Vec<T>, _>>()
            .map(Some)
    }
    let one = |v: Option<Vec<usize>>| v.and_then(|v| v.first().copied());
    let sizes = env::<usize>("MEMZOO_BENCH_SIZES")?.unwrap_or(vec![16_384, 65_536, 262_144]);
    let heads = one(env("MEMZOO_BENCH_HEADS")?).unwrap_or(8);
    let kv_heads = one(env("MEMZOO_BENCH_KV_HEADS")?);
    let kinds =
        env::<IndexKind>("MEMZOO_BENCH_KINDS")?.unwrap_or(vec![IndexKind::Exact, IndexKind::Hnsw]);
    let expansion = one(env("MEMZOO_BENCH_EF")?);
    let connectivity = one(env("MEMZOO_BENCH_M")?);
    let (d, t, k) = (32, 512, 32);
    let mut out = Vec::new();
    for &n in &sizes {
        let keys = clustered_keys(n + t, d, 256, 0.6, 20);
        let queries = clustered_keys(t, d, 256, 0.6, 21);
        let mut exact_ids = Vec::new();
        for &kind in &kinds {
            let mut c = KnnMemoryConfig::new(heads, d)
                .with_kind(kind)
                .with_max_memories(n + t)
                .with_n_kv_heads(kv_heads);
            if let Some(ef) = expansion {
                c.hnsw.expansion_search = Some(ef);
            }
            if let Some(m) = connectivity {
                c.hnsw.connectivity = m;
            }
            let r = time_segment(&c, 1, &keys, &queries, n, t, k, device)?;
            let rec = if kind == IndexKind::Exact {
                exact_ids = r.ids.clone();
                1.0
            } else if exact_ids.is_empty() {
                f64::NAN
            } else {
                recall(&r.ids, &exact_ids, k)
            };
            let seg = r.add_s + r.search_s;
            out.push(one_pass(
                format!(
                    "memory-crossover-{}-{n}",
                    format!("{kind:?}").to_lowercase()
                ),
                args,
                serde_json::json!({"stored_per_row": n, "heads": heads,
                    "kv_heads": kv_heads, "d_head": d, "tokens": t, "k": k,
                    "kind": format!("{kind:?}"), "fill_s": r.fill_s, "add_s": r.add_s,
                    "search_s": r.search_s, "recall_at_k": rec,
                    "expansion_search": expansion, "connectivity": connectivity}),
                seg,
                t,
            ));
        }
    }
    Ok(out)
}

/// One benchmark point: time per segment at a given memory size.
#[derive(Debug, Clone)]
pub struct SegmentTiming {
    /// Seconds to fill the memory to `stored` (setup, not per segment).
    pub fill_s: f64,
    /// Seconds to add one segment.
    pub add_s: f64,
    /// Seconds to search top-k for one segment's queries.
    pub search_s: f64,
    /// The ids found for the segment's queries, `[batch, tokens, heads, k]`.
    pub ids: Vec<i64>,
}

/// Fills a fresh memory built from `config` to `stored` entries per (row, head), then times
/// one segment: search top-`k` for `tokens` queries (drawn from the same distribution as the
/// keys), then add the segment's `tokens` pairs. `keys` is a pool of `[n, d_head]` vectors.
#[allow(clippy::too_many_arguments)]
pub fn time_segment(
    config: &KnnMemoryConfig,
    batch: usize,
    keys: &[f32],
    queries: &[f32],
    stored: usize,
    tokens: usize,
    k: usize,
    device: &Device,
) -> Result<SegmentTiming, String> {
    let err = |e: MemoryError| e.to_string();
    let mut index = config.init(batch, device).map_err(err)?;
    let (h, hk, d) = (config.n_heads, config.kv_heads(), config.d_head);
    let start = Instant::now();
    fill(index.as_mut(), keys, stored, 4096, device).map_err(err)?;
    device.sync().ok();
    let fill_s = start.elapsed().as_secs_f64();
    let nq = queries.len() / d;
    let (q, _) = segment_tensors(queries, nq, 0, tokens, batch, h, d, device);
    let start = Instant::now();
    let found = index.search(q, k).map_err(err)?;
    let ids = retrieved_ids(&found);
    let search_s = start.elapsed().as_secs_f64();
    let (nk, nv) = segment_tensors(keys, keys.len() / d, stored, tokens, batch, hk, d, device);
    let start = Instant::now();
    index.add(nk, nv).map_err(err)?;
    device.sync().ok();
    let add_s = start.elapsed().as_secs_f64();
    Ok(SegmentTiming {
        fill_s,
        add_s,
        search_s,
        ids,
    })
}

/// A memory measurement of one pass (adding a segment's pairs and searching them) of `seg`
/// seconds over `tokens` tokens.
fn one_pass(
    name: String,
    args: &BenchArgs,
    config: serde_json::Value,
    seg: f64,
    tokens: usize,
) -> Measurement {
    Measurement {
        name,
        implementation: "memzoo".into(),
        backend: args.device.clone(),
        threads: args.threads,
        config,
        steps: 1,
        step_s_median: seg,
        step_s_min: seg,
        step_s_max: seg,
        tokens_per_s: tokens as f64 / seg,
        params: 0,
        peak_rss_mb: crate::measure::peak_rss_mb(),
        ..Default::default()
    }
}
