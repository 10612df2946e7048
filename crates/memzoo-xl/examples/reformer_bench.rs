//! Benchmarks of the Reformer crate, one configuration per process (peak memory is per process).
//!
//! - `reformer_bench attention full|lsh|lsh_tensor LEN [REPS]`: causal attention alone, forward +
//!   backward, batch 1, 8 heads x 64 (LSH: bucket 64, 4 rounds; `lsh` the fused kernel,
//!   `lsh_tensor` tensor ops).
//! - `reformer_bench step LAYERS rev|plain LEN [D_MODEL] [REPS]`: one train step of a Reformer LM
//!   (Reformer-small widths unless D_MODEL given), batch 1.
//!
//! Prints one JSON line.

use burn::tensor::Device;
use memzoo_reformer::LshKernel;
use memzoo_reformer::bench::{BenchAttention, attention_fwd_bwd};
use memzoo_xl::reformer::{ReformerConfig, train_step_timing};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let device = Device::flex().autodiff();
    match args.get(1).map(String::as_str) {
        Some("attention") => {
            let kind = match args.get(2).map(String::as_str) {
                Some("full") => BenchAttention::Full,
                other => BenchAttention::Lsh {
                    bucket_size: 64,
                    n_rounds: 4,
                    kernel: if other == Some("lsh_tensor") {
                        LshKernel::Tensor
                    } else {
                        LshKernel::Auto
                    },
                },
            };
            let t = attention_fwd_bwd(kind, num(3, 1024), 8, 64, num(4, 1), &device);
            println!("{}", serde_json::to_string(&t).unwrap());
        }
        Some("step") => {
            let layers = num(2, 6);
            let reversible = args.get(3).map(String::as_str) != Some("plain");
            let len = num(4, 4096);
            let d_model = num(5, 256);
            let cfg = ReformerConfig::new()
                .with_n_layers(layers)
                .with_reversible(reversible)
                .with_max_seq_len(len.max(64))
                .with_d_model(d_model)
                .with_d_ff(4 * d_model)
                .with_d_head(d_model / 8);
            let t = train_step_timing(&cfg, 1, len, num(6, 1), &device).expect("bench failed");
            println!("{}", serde_json::to_string(&t).unwrap());
        }
        _ => eprintln!(
            "usage: reformer_bench attention full|lsh LEN [REPS] | step LAYERS rev|plain LEN [D_MODEL] [REPS]"
        ),
    }
}
