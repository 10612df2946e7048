//! Train a small Reformer (LSH attention, reversible layers) on the duplication task of the
//! Reformer paper, then evaluate it with more hash rounds than it was trained with.
//!
//! ```text
//! cargo run --release --example reformer_train [-- --device flex --steps 1000 --len 16]
//! ```
//!
//! A sequence is `0 w 0 w`, `w` a string of random symbols `1..16`
//! (`memzoo_data::tasks::duplication`): the second `w` can only be predicted by finding its
//! first copy. Each step hashes queries into buckets with fresh random rotations (LSH),
//! attends within chunks of sorted buckets, and computes gradients with the reversible
//! backward: every layer's input is rebuilt from its output instead of being stored. The loss
//! counts the second `w` only (guessing costs ln 15 = 2.71 nats a symbol); at the end, the
//! share of the second `w` predicted right with 1, 2 and 4 hash rounds (more rounds: fewer
//! pairs missed by the hashing).
//!
//! Flags: `--len` (even; 32 learns too, in about 1,500 steps), `--layers`, `--rounds` (in
//! training), `--lr`, `--batch`, `--axial false` (no position embeddings: much slower to
//! learn); `--help` lists them.

use burn::module::Module;
use clap::Parser;
use memzoo::stack::{LshConfig, ReformerConfig};
use memzoo::train::tasks::{DuplicationConfig, duplication};
use memzoo_examples::Common;

/// Train a small Reformer on the duplication task `0 w 0 w`.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Training steps.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Sequence length (even: two copies of a (len/2 - 1)-symbol word after a 0).
    #[arg(long, default_value_t = 16)]
    len: usize,
    /// Reversible layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Hash rounds in training.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Learning rate (constant).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Axial position embeddings (false: none).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    axial: bool,
}

fn main() {
    memzoo_examples::exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> Result<(), String> {
    let device = args.common.device()?.autodiff();
    device.seed(0);
    let vocab = 16;
    let config = ReformerConfig::new()
        .with_n_layers(args.layers)
        .with_d_model(64)
        .with_n_heads(2)
        .with_d_head(32)
        .with_d_ff(128)
        .with_vocab_size(vocab)
        .with_max_seq_len(args.len)
        .with_lsh(
            LshConfig::new()
                .with_chunk_len(4)
                .with_n_rounds(args.rounds),
        )
        .with_dropout(0.0)
        .with_axial_positions(args.axial)
        .with_reversible(true);
    let params = config
        .init(&device)
        .map_err(|e| e.to_string())?
        .num_params();
    println!(
        "Reformer: {} reversible layers, LSH attention (buckets of {}, {} rounds), {params} \
         parameters; duplication sequences of {} symbols, batch {}",
        args.layers, config.lsh.chunk_len, args.rounds, args.len, args.batch
    );
    let cfg = DuplicationConfig::new(config)
        .with_len(args.len)
        .with_vocab(vocab)
        .with_steps(args.steps)
        .with_batch(args.batch)
        .with_lr(args.lr)
        .with_train_rounds(args.rounds)
        .with_eval_rounds(vec![1, 2, 4])
        .with_eval_size(256)
        .with_log_every(100);
    let run_dir = args.common.run_dir("reformer_train");
    let options = memzoo::train::RunOptions {
        run_dir: run_dir.path().to_path_buf(),
        resume: false,
        quiet: true,
    };
    let report = duplication(&cfg, &device, &options).map_err(|e| e.to_string())?;
    for (r, acc) in report.accuracy {
        println!(
            "evaluated with {r} hash round(s): {:.1}% of the copy right (guessing: 6.7%)",
            100.0 * acc
        );
    }
    Ok(())
}
