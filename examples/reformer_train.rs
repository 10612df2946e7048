//! Train a small Reformer (LSH attention, reversible layers) on the duplication task of the
//! Reformer paper, then evaluate it with more hash rounds than it was trained with.
//!
//! ```text
//! cargo run --release --example reformer_train [-- --device flex --steps 1000 --len 16]
//! ```
//!
//! A sequence is `0 w 0 w`, `w` a string of random symbols `1..16`: the second `w` can only
//! be predicted by finding its first copy. Each step hashes queries into buckets with fresh
//! random rotations (LSH), attends within chunks of sorted buckets, and computes gradients
//! with the reversible backward: every layer's input is rebuilt from its output instead of
//! being stored. The loss is reported on the second `w` only (guessing costs log2 15 = 3.91
//! bits a symbol); at the end, the share of the second `w` predicted right with 1, 2 and 4
//! hash rounds (more rounds: fewer pairs missed by the hashing).
//!
//! Flags: `--len` (even; 32 learns too, in about 1,500 steps), `--layers`, `--rounds` (in
//! training), `--lr`, `--batch`, `--axial false` (no position embeddings: much slower to
//! learn).

use burn::module::Module;
use burn::optim::AdamWConfig;
use memzoo_examples::{arg_or, bits, device_from_args};
use memzoo_reformer::ReformerConfig;
use memzoo_reformer::attention::ForwardOptions;
use memzoo_reformer::duplication::{accuracy, generate};

fn main() {
    memzoo_examples::exit_on_error(run());
}

fn run() -> Result<(), String> {
    let device = device_from_args().autodiff();
    device.seed(0);
    let steps: usize = arg_or("--steps", 1000);
    let len: usize = arg_or("--len", 16);
    let layers: usize = arg_or("--layers", 2);
    let rounds: usize = arg_or("--rounds", 2);
    let lr: f64 = arg_or("--lr", 1e-3);
    let batch: usize = arg_or("--batch", 16);
    let axial: bool = arg_or("--axial", true);
    let vocab = 16;
    if batch == 0 {
        return Err("--batch must be positive, got 0".into());
    }

    let config = ReformerConfig::new()
        .with_n_layers(layers)
        .with_d_model(64)
        .with_n_heads(2)
        .with_d_head(32)
        .with_d_ff(128)
        .with_vocab_size(vocab)
        .with_max_seq_len(len)
        .with_bucket_size(4)
        .with_n_rounds(rounds)
        .with_dropout(0.0)
        .with_axial_positions(axial)
        .with_reversible(true);
    let mut model = config.init(&device).map_err(|e| e.to_string())?;
    println!(
        "Reformer: {layers} reversible layers, LSH attention (buckets of {}, {rounds} rounds), \
         {} parameters; duplication sequences of {len} symbols, batch {batch}",
        config.bucket_size,
        model.num_params()
    );
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
    let start = std::time::Instant::now();
    let mut window = (0.0f32, 0usize);
    for step in 0..steps {
        let data = generate(batch, len, vocab, step as u64 + 1).map_err(|e| e.to_string())?;
        let (tokens, targets, weights) = data.tensors(&device);
        // Fresh rotations and dropout masks for every step.
        let opts = ForwardOptions::train(step as u64).with_rounds(rounds);
        // Loss on the second `w` and gradients by the reversible backward.
        let (loss, grads) = model
            .train_step_with(tokens, targets, Some(weights), &opts)
            .map_err(|e| e.to_string())?;
        window.0 += loss.into_scalar::<f32>();
        window.1 += 1;
        model = optim.step(lr, model, grads);
        if (step + 1) % 100 == 0 {
            println!(
                "step {:5}  loss on the copy {:.3} bits/symbol  ({:.0}s)",
                step + 1,
                bits(window.0 / window.1 as f32),
                start.elapsed().as_secs_f64()
            );
            window = (0.0, 0);
        }
    }

    let eval = generate(256, len, vocab, u64::MAX).map_err(|e| e.to_string())?;
    let model = model.valid();
    let inner = device.without_autodiff();
    for r in [1, 2, 4] {
        let acc = accuracy(&model, &eval, r, &inner).map_err(|e| e.to_string())?;
        println!(
            "evaluated with {r} hash round(s): {:.1}% of the copy right (guessing: 6.7%)",
            100.0 * acc
        );
    }
    Ok(())
}
