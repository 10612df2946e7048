//! Trains a small Reformer on the duplication task (`0 w 0 w`) and prints the accuracy on the
//! second halves with 1, 2 and 4 hash rounds.
//!
//! `cargo run -p memzoo-reformer --example reformer_duplication -- [seconds] [train_rounds] [len] [layers]`

use burn::tensor::Device;
use memzoo_reformer::ReformerConfig;
use memzoo_reformer::duplication::{DuplicationConfig, train};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let seconds = arg(1, 180.0);
    let train_rounds = arg(2, 2.0) as usize;
    let len = arg(3, 32.0) as usize;
    let layers = arg(4, 1.0) as usize;
    let model = ReformerConfig::new()
        .with_vocab_size(16)
        .with_d_model(64)
        .with_n_layers(layers)
        .with_n_heads(2)
        .with_d_head(32)
        .with_d_ff(128)
        .with_max_seq_len(len)
        .with_bucket_size(4)
        .with_n_rounds(train_rounds)
        .with_dropout(0.0)
        .with_ff_chunk_len(0);
    let cfg = DuplicationConfig::new(model)
        .with_len(len)
        .with_vocab(16)
        .with_steps(1_000_000)
        .with_max_seconds(seconds)
        .with_batch(16)
        .with_lr(2e-3)
        .with_train_rounds(train_rounds)
        .with_eval_rounds(vec![1, 2, 4, 8])
        .with_eval_size(128)
        .with_log_every(100);
    let report = train(&cfg, &Device::flex().autodiff()).expect("training failed");
    println!("{}", serde_json::to_string(&report).unwrap());
}
