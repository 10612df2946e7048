//! Generate with a Memorizing Transformer, one token at a time: every token read goes into
//! the kNN memory (its keys and values, per head), which then holds the whole document; the
//! memory can be saved and reopened.
//!
//! ```text
//! cargo run --release --example memorizing_generate [-- --device flex --steps 800]
//! ```
//!
//! It first trains the small model of `memorizing_train` (a few seconds), then gives it the
//! start of a new document (a passage of 6 letters and one repeat) and lets it continue
//! greedily: the repeats should be copied. Generation is `memzoo generate`'s library code
//! (`memzoo::train::generate`): segments of the training length, the memories carried across
//! completed segments, retrieving from the kNN memory and adding to it.

use burn::module::Module;
use memzoo::stack::MemorizingState;
use memzoo::train::generate::{Generator, SampleConfig};
use memzoo_examples::{arg_or, copy_text, device_from_args, small_memorizing, train_memorizing};

/// The segment length `train_memorizing` trains with.
const SEGMENT_LEN: usize = 7;

fn main() {
    memzoo_examples::exit_on_error(run());
}

fn run() -> Result<(), String> {
    let device = device_from_args();
    let steps: usize = arg_or("--steps", 800);
    let train_device = device.clone().autodiff();
    train_device.seed(0);
    println!("training the small Memorizing Transformer for {steps} steps...");
    let model = small_memorizing(true, true)
        .init(&train_device)
        .map_err(|e| e.to_string())?;
    let model = train_memorizing(model, steps, 3e-3, 400)?.valid();

    // A new document: the passage and its first repeat as the prompt.
    let (text, _) = copy_text(1, 6, 1, 6, 1234);
    let cut = 14;
    let want = &text[cut..text.len() - 1];
    let err = |e: memzoo::train::GenerateError| e.to_string();
    let mut greedy = SampleConfig::new()
        .with_temperature(0.0)
        .init()
        .map_err(err)?;
    // A new document: the first segment clears the memories.
    let mut generator = Generator::new(&model, SEGMENT_LEN, &device).map_err(err)?;
    let prompt: Vec<i64> = text[..cut].iter().map(|&b| b as i64).collect();
    generator.read(&prompt).map_err(err)?;
    let start = std::time::Instant::now();
    let out: Vec<u8> = generator
        .sample(&mut greedy, want.len())
        .map_err(err)?
        .into_iter()
        .map(|t| t as u8)
        .collect();
    let secs = start.elapsed().as_secs_f64();
    let letters = (0..want.len()).filter(|&i| want[i] != b'.');
    let right = letters.clone().filter(|&i| out[i] == want[i]).count();
    println!(
        "prompt    {}\ngenerated {}\nexpected  {}\n{right} of {} repeated letters right; \
         {:.0} tokens/s; the kNN memory now holds {} entries per head (every completed \
         segment of {SEGMENT_LEN})",
        String::from_utf8_lossy(&text[..cut]),
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(want),
        letters.count(),
        want.len() as f64 / secs,
        generator.state().knn_len(0, 0)
    );

    // Save the kNN memory (header, keys, values, checksums) and open it again.
    let dir = std::env::temp_dir().join(format!("memzoo-example-knn-{}", std::process::id()));
    generator
        .state()
        .save_knn(&dir)
        .map_err(|e| e.to_string())?;
    let reopened =
        MemorizingState::open_knn(&dir, model.n_knn_layers(), &model.knn_memory, &device)
            .map_err(|e| e.to_string())?;
    println!(
        "saved to {} and reopened: {} entries per head",
        dir.display(),
        reopened.knn_len(0, 0)
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
