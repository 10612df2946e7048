//! `cargo xtask bench masks`: the seeded dropout masks (`memzoo_fused::dropout`) drawn by each
//! path this CPU has: `mask_values` (AVX-512 where the CPU has it), `mask_values_avx2` and
//! `mask_values_portable` (`rand_chacha`), and `keep_words` (the best path's mask packed into
//! bits, as a GPU receives it). The same masks on every path (the test
//! `dropout_mask_is_the_sequential_generators`); here only their time, allocation included.
//! `--threads 1` for one core's rate.

use memzoo_fused::dropout::{keep_words, mask_values, mask_values_avx2, mask_values_portable};

use crate::BenchArgs;
use crate::measure::{Measurement, median, time_steps};

/// Elements per mask: 4M, an XL-small step's activations are of this order.
const ELEMENTS: usize = 1 << 22;

/// A mask path: `(n, p, seed)` to the mask (its length, kept from the optimiser).
type Draw = fn(usize, f64, u64) -> usize;

pub fn suite(args: &BenchArgs) -> Result<Vec<Measurement>, String> {
    let (warmup, steps) = (args.warmup(), args.steps.unwrap_or(10));
    let paths: [(&str, Draw); 4] = [
        ("best", |n, p, s| {
            std::hint::black_box(mask_values(n, p, s)).len()
        }),
        ("avx2", |n, p, s| {
            std::hint::black_box(mask_values_avx2(n, p, s)).len()
        }),
        ("portable", |n, p, s| {
            std::hint::black_box(mask_values_portable(n, p, s)).len()
        }),
        ("bits", |n, p, s| {
            std::hint::black_box(keep_words(n, p, s)).len()
        }),
    ];
    let mut out = Vec::new();
    for (name, draw) in paths {
        let mut seed = 0;
        let mut times = time_steps(warmup, steps, || {
            seed += 1;
            std::hint::black_box(draw(ELEMENTS, 0.1, seed));
        });
        times.sort_by(f64::total_cmp);
        let s = median(&times);
        out.push(Measurement {
            name: format!("masks-{name}"),
            implementation: "memzoo".into(),
            backend: "host".into(),
            threads: args.threads,
            config: serde_json::json!({"elements": ELEMENTS, "p": 0.1,
                "ns_per_element": s / ELEMENTS as f64 * 1e9}),
            steps,
            step_s_median: s,
            step_s_min: times[0],
            step_s_max: times[times.len() - 1],
            // Elements per second, in the table's tokens/s column.
            tokens_per_s: ELEMENTS as f64 / s,
            peak_rss_mb: crate::measure::peak_rss_mb(),
            ..Default::default()
        });
    }
    Ok(out)
}
