//! Train a small Memorizing Transformer: an XL whose middle layer also attends, for every
//! query, to the top-k (key, value) pairs found by a kNN search over everything it has read
//! in the current document. Prints the loss and how full the kNN memory is.
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
//! What to expect from this run: every segment is fresh text, so the training loss is also
//! a held-out loss. The loss on the repeated letters falls from ~4.7 bits towards 0 (after
//! 300-500 steps) as the model learns to copy; here it can copy through its XL memory (8
//! positions; the source is 7 back). With `--xl-memory false` a letter's source is (but for
//! one position in 7) outside the segment, so the copy has to come through the kNN lookup,
//! which needs a content match (an induction step): after 2,000 steps that run is only at
//! ~4.5 bits, learning slowly (see also `memzoo_knn::recall_task`). The gate printed is the
//! mean share of each head's output taken from the retrieved pairs. `--knn false` removes the
//! kNN layer (a plain 3-layer XL).

use burn::module::Module;
use memzoo_examples::{arg_or, device_from_args, small_memorizing, train_memorizing};

fn main() {
    memzoo_examples::exit_on_error(run());
}

fn run() -> Result<(), String> {
    let device = device_from_args().autodiff();
    device.seed(0);
    let steps: usize = arg_or("--steps", 1200);
    let lr: f64 = arg_or("--lr", 3e-3);
    let knn: bool = arg_or("--knn", true);
    let xl_memory: bool = arg_or("--xl-memory", true);
    let model = small_memorizing(knn, xl_memory)
        .init(&device)
        .map_err(|e| e.to_string())?;
    println!(
        "Memorizing Transformer: 3 layers (kNN attention in layer 2: {knn}, top-8; XL memory: \
         {xl_memory}), {} parameters; 16 rows x segments of 7; {steps} steps, lr {lr}",
        model.num_params()
    );
    train_memorizing(model, steps, lr, 100)?;
    Ok(())
}
