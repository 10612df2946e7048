//! Train a small Transformer-XL on text that can only be predicted from memory, and watch the
//! loss on those letters fall to almost nothing.
//!
//! ```text
//! cargo run --release --example xl_train [-- --device flex --steps 2000 --mem-len 8]
//! ```
//!
//! The data: documents of 6 random letters, then 6 times a dot and the same 6 letters, then a
//! newline. Each repeated letter sits 7 positions after its source, further back than a
//! 4-token segment reaches: only the XL memory (the cached states of earlier segments, 8
//! positions) lets the model see it. The first copy of a passage is random (4.70 bits a
//! letter whatever the model does); the repeats fall towards 0 bits once the model has
//! learned to read its memory (here after 600-800 steps). With `--mem-len 0` they stay at
//! ~4.7 bits. Other flags: `--lr`, `--seed`, and the task's `--passage`, `--gap`,
//! `--repeats`, `--seg-len`, `--batch` (a longer copy distance takes far longer to learn).

use burn::module::Module;
use memzoo_examples::{
    CopyTask, arg_or, device_from_args, eval_on_copy_task, small_xl, train_on_copy_task,
};

fn main() {
    memzoo_examples::exit_on_error(run());
}

fn run() -> Result<(), String> {
    let device = device_from_args().autodiff();
    device.seed(arg_or("--seed", 0));
    let steps: usize = arg_or("--steps", 2000);
    let mem_len: usize = arg_or("--mem-len", 8);
    let lr: f64 = arg_or("--lr", 3e-3);
    let d = CopyTask::default();
    let task = CopyTask {
        passage: arg_or("--passage", d.passage),
        gap: arg_or("--gap", d.gap),
        repeats: arg_or("--repeats", d.repeats),
        seg_len: arg_or("--seg-len", d.seg_len),
        batch: arg_or("--batch", d.batch),
    };

    let config = small_xl(mem_len);
    let model = config.init(&device).map_err(|e| e.to_string())?;
    println!(
        "Transformer-XL: {} layers, d_model {}, mem_len {mem_len}, {} parameters; segments of {} \
         tokens x {} rows; repeated letters copy from {} positions back; {steps} steps, lr {lr}",
        config.n_layers,
        config.d_model,
        model.num_params(),
        task.seg_len,
        task.batch,
        task.distance()
    );
    let model = train_on_copy_task(model, &task, steps, lr, 20, 200)?;

    // Fresh documents, memory carried from segment to segment, no gradients. Rows start
    // mid-document with an empty memory, so the first segments of each row cannot copy yet.
    let (copied, rest) = eval_on_copy_task(&model.valid(), &task, 256, 99)?;
    println!(
        "held-out text: repeated letters {copied:.3} bits (guessing: 4.700), rest {rest:.3} bits/char"
    );
    Ok(())
}
