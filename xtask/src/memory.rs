//! The kNN memory alone: time per segment (search top-32 for 512 tokens x 8 heads, then add
//! them) at several stored sizes per row, exact search against usearch's HNSW, with recall@32
//! of HNSW against exact. Keys are clustered 32-d vectors (attention keys cluster).

use burn::tensor::Device;
use memzoo_memory::bench::{clustered_keys, recall, time_segment};
use memzoo_memory::{IndexKind, KnnMemoryConfig};

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
            let t = time_segment(&config, 1, &keys, &queries, n, tokens, k, device)
                .map_err(|e| e.to_string())?;
            let rec = if kind == IndexKind::Exact {
                exact_ids = t.ids.clone();
                1.0
            } else {
                recall(&t.ids, &exact_ids, k)
            };
            let seg = t.add_s + t.search_s;
            out.push(Measurement {
                name: format!("memory-{}-{n}", format!("{kind:?}").to_lowercase()),
                implementation: "memzoo".into(),
                backend: args.device.clone(),
                threads: args.threads,
                config: serde_json::json!({"stored_per_row": n, "heads": heads, "d_head": d,
                    "tokens": tokens, "k": k, "kind": format!("{kind:?}"), "fill_s": t.fill_s,
                    "add_s": t.add_s, "search_s": t.search_s, "recall_at_k": rec}),
                steps: 1,
                step_s_median: seg,
                step_s_min: seg,
                step_s_max: seg,
                tokens_per_s: tokens as f64 / seg,
                params: 0,
                peak_rss_mb: crate::measure::peak_rss_mb(),
            });
        }
    }
    Ok(out)
}
