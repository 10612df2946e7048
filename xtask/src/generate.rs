//! Generation speed of XL-small: tokens per second reusing the cached XL memory (the prompt is
//! read once, then one step per token) against recomputing the whole context for every token,
//! at several context lengths. The loops are `memzoo generate`'s library code
//! (`memzoo::train::generate`: one-token segments over a memory covering the context, against
//! one pass over the whole context per token), greedy decoding, random weights (speed does not
//! depend on them) and a random prompt.

use burn::module::Module;
use burn::tensor::Device;
use memzoo::train::generate::{GenerateConfig, SampleConfig, generate, generate_recompute};
use memzoo_stack::XlConfig;
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::BenchArgs;
use crate::measure::{Measurement, peak_rss_mb};

/// Context (prompt) lengths of the suite.
pub fn contexts(quick: bool) -> Vec<usize> {
    if quick {
        vec![128, 256]
    } else {
        vec![128, 256, 512, 1024]
    }
}

/// The suite: for every context length, one measurement with the cache
/// (`generate-cached-<ctx>`) and one recomputing (`generate-recompute-<ctx>`).
pub fn suite(args: &BenchArgs, device: &Device) -> Result<Vec<Measurement>, String> {
    // XL-small (6 layers, d_model 256, 8 heads x 32), no dropout.
    let config = XlConfig::small().with_dropout(0.0);
    let model = config.init(device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let tokens = args.steps.unwrap_or(if args.quick { 8 } else { 32 });
    let mut rng = StdRng::seed_from_u64(0);
    let mut out = Vec::new();
    for context in args.lengths.clone().unwrap_or_else(|| contexts(args.quick)) {
        let prompt: Vec<i64> = (0..context).map(|_| rng.random_range(0..256)).collect();
        // Memory as long as the whole context, as `memzoo generate` does: both loops then see
        // exactly the same tokens.
        let model = model.clone().with_mem_len(context + tokens);
        let greedy = |tokens, segment_len| {
            GenerateConfig::new(tokens, segment_len)
                .with_sampler(SampleConfig::new().with_temperature(0.0))
        };
        let err = |e: memzoo::train::GenerateError| e.to_string();
        // Warm-up (allocations, kernels) on a short run.
        generate(&model, &prompt, &greedy(2, 1), device).map_err(err)?;
        let cached = generate(&model, &prompt, &greedy(tokens, 1), device).map_err(err)?;
        let recomputed =
            generate_recompute(&model, &prompt, &greedy(tokens, context + tokens), device)
                .map_err(err)?;
        let (a, cached_s) = (cached.tokens, cached.seconds_per_token);
        let (b, recompute_s) = (recomputed.tokens, recomputed.seconds_per_token);
        let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        for (how, s) in [("cached", cached_s), ("recompute", recompute_s)] {
            out.push(Measurement {
                name: format!("generate-{how}-{context}"),
                implementation: "memzoo".into(),
                backend: args.device.clone(),
                threads: args.threads,
                config: serde_json::json!({"model": "xl-small", "context": context,
                    "tokens": tokens, "mode": how, "batch": 1, "greedy": true,
                    "prompt_read_excluded": how == "cached",
                    "speedup": recompute_s / cached_s, "tokens_agree": agree}),
                steps: tokens,
                step_s_median: s,
                step_s_min: s,
                step_s_max: s,
                tokens_per_s: 1.0 / s,
                params,
                peak_rss_mb: peak_rss_mb(),
                ..Default::default()
            });
        }
    }
    Ok(out)
}
