//! Train a small Memorizing Transformer: an XL whose middle layer also attends, for every
//! query, to the top-k (key, value) pairs found by a kNN search over everything it has read
//! in the current document.
//!
//! ```text
//! cargo run --release --example memorizing_train [-- --device flex --steps 1200]
//! ```
//!
//! The data are the repeated passages of `xl_train` (6 random letters, then 6 times a dot
//! and the same letters), one document after another in each of 16 rows. A document is 49
//! tokens, 7 segments of 7: at its first segment the row's kNN memory is cleared and its XL
//! memory hidden (`reset`), then every segment adds its 7 keys and values per head, so the
//! memory holds the whole document read so far (at most 49 entries per row and head).
//!
//! What to expect from this run: every segment is fresh text. The loss on the repeated
//! letters (`selected_bpc` in the trainer's validation lines, on held-out documents) falls
//! from ~4.7 bits towards 0 (after 300-500 steps) as the model learns to copy; here it can
//! copy through its XL memory (8 positions; the source is 7 back). With `--xl-memory false` a
//! letter's source is (but for one position in 7) outside the segment, so the copy has to come
//! through the kNN lookup, which needs a content match (an induction step): after 2,000 steps
//! that run is only at ~4.5 bits, learning slowly (see also `memzoo recall`). `--knn false`
//! removes the kNN layer (a plain 3-layer XL).

use burn::module::Module;
use clap::Parser;
use memzoo_examples::{
    Common, CopyTraining, eval_copy, memorizing_task, small_memorizing, train_copy,
};

/// Train a small Memorizing Transformer on letters copied from earlier in the document.
#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Training steps (one segment each).
    #[arg(long, default_value_t = 1200)]
    steps: usize,
    /// Peak learning rate (after 20 warm-up steps).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// A kNN attention layer in the middle (false: a plain 3-layer XL).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    knn: bool,
    /// The XL memory of 8 positions (false: none).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    xl_memory: bool,
}

fn main() {
    memzoo_examples::exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> Result<(), String> {
    let device = args.common.device()?.autodiff();
    device.seed(0);
    let model = small_memorizing(args.knn, args.xl_memory)
        .init(&device)
        .map_err(|e| e.to_string())?;
    let task = memorizing_task();
    println!(
        "Memorizing Transformer: 3 layers (kNN attention in layer 2: {}, top-8; XL memory: \
         {}), {} parameters; {} rows x segments of {}; {} steps, lr {}",
        args.knn,
        args.xl_memory,
        model.num_params(),
        task.batch,
        task.seg_len,
        args.steps,
        args.lr
    );
    let run_dir = args.common.run_dir("memorizing_train");
    let how = CopyTraining {
        steps: args.steps,
        lr: args.lr,
        warmup: 20,
        log_every: 100,
    };
    let model = train_copy(model, &task, how, run_dir.path())?;
    let (copied, rest) = eval_copy(&model.valid(), &task, 128, 5)?;
    println!(
        "held-out documents: repeated letters {copied:.3} bits (guessing: 4.700), rest {rest:.3} bits/char"
    );
    Ok(())
}
