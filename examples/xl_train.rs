//! Train a small Transformer-XL on text that can only be predicted from memory, and watch the
//! loss on those letters fall to almost nothing.
//!
//! ```text
//! cargo run --release --example xl_train [-- --device flex --steps 2000 --mem-len 8]
//! ```
//!
//! The data (`memzoo_data::tasks::copy_text`): documents of 6 random letters, then 6 times a
//! dot and the same 6 letters, then a newline. Each repeated letter sits 7 positions after its
//! source, further back than a 4-token segment reaches: only the XL memory (the cached states
//! of earlier segments, 8 positions) lets the model see it. The first copy of a passage is
//! random (4.70 bits a letter whatever the model does); the repeats (`selected_bpc` in the
//! trainer's validation lines) fall towards 0 bits once the model has learned to read its
//! memory (here after 600-800 steps). With `--mem-len 0` they stay at ~4.7 bits. Other flags:
//! `--lr`, `--seed`, `--run-dir`, and the task's `--passage`, `--gap`, `--repeats`,
//! `--seg-len`, `--batch` (a longer copy distance takes far longer to learn); `--help` lists
//! them.

use burn::module::Module;
use clap::Parser;
use memzoo_examples::{Common, CopyArgs, CopyTraining, eval_copy, small_xl, train_copy};

/// Train a small Transformer-XL on letters copied from beyond its segment.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    task: CopyArgs,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Training steps (one segment each).
    #[arg(long, default_value_t = 2000)]
    steps: usize,
    /// XL memory length (0: no memory).
    #[arg(long, default_value_t = 8)]
    mem_len: usize,
    /// Peak learning rate (after 20 warm-up steps).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
}

fn main() {
    memzoo_examples::exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> Result<(), String> {
    let device = args.common.device()?.autodiff();
    device.seed(args.seed);
    let task = args.task.task();
    let config = small_xl(args.mem_len);
    let model = config.init(&device).map_err(|e| e.to_string())?;
    println!(
        "Transformer-XL: {} layers, d_model {}, mem_len {}, {} parameters; segments of {} \
         tokens x {} rows; repeated letters copy from {} positions back; {} steps, lr {}",
        config.n_layers,
        config.d_model,
        args.mem_len,
        model.num_params(),
        task.seg_len,
        task.batch,
        task.distance(),
        args.steps,
        args.lr
    );
    let run_dir = args.common.run_dir("xl_train");
    let how = CopyTraining {
        steps: args.steps,
        lr: args.lr,
        warmup: 20,
        log_every: 200,
    };
    let model = train_copy(model, &task, how, run_dir.path())?;

    // Fresh documents, memory carried from segment to segment, no gradients. Rows start
    // mid-document with an empty memory, so the first segments of each row cannot copy yet.
    let (copied, rest) = eval_copy(&model.valid(), &task, 256, 5)?;
    println!(
        "held-out text: repeated letters {copied:.3} bits (guessing: 4.700), rest {rest:.3} bits/char"
    );
    Ok(())
}
