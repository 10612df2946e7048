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
//! greedily: the repeats should be copied. The sampler is `memzoo generate`'s
//! (`memzoo::commands::sample`).

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use memzoo::commands::{SampleOptions, sample};
use memzoo_examples::{arg_or, copy_text, device_from_args, small_memorizing, train_memorizing};
use memzoo_knn::{MemorizingState, MemorizingTransformer};
use rand::{SeedableRng, rngs::StdRng};

fn main() {
    memzoo_examples::exit_on_error(run());
}

/// Logits of the last position of `hidden` (`[1, q, d_model]`).
fn last_logits(model: &MemorizingTransformer, hidden: Tensor<3>) -> Result<Vec<f32>, String> {
    let [_, q, d] = hidden.dims();
    model
        .logits(hidden.narrow(1, q - 1, 1).reshape([1, 1, d]))
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .map_err(|e| format!("{e:?}"))
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
    let tokens =
        |t: &[i64]| Tensor::<2, Int>::from_data(TensorData::new(t.to_vec(), [1, t.len()]), &device);
    let greedy = SampleOptions {
        prompt: String::new(),
        tokens: want.len(),
        temperature: 0.0,
        top_k: None,
        top_p: None,
        seed: 0,
        compare_recompute: false,
    };
    let mut rng = StdRng::seed_from_u64(0);
    let mut state = MemorizingState::new();
    let prompt: Vec<i64> = text[..cut].iter().map(|&b| b as i64).collect();
    // `reset`: a document starts here (an empty kNN memory, no XL memory).
    let hidden = model
        .forward_state(tokens(&prompt), &mut state, &[true])
        .map_err(|e| e.to_string())?;
    let mut logits = last_logits(&model, hidden)?;
    let start = std::time::Instant::now();
    let mut out = Vec::with_capacity(want.len());
    for _ in 0..want.len() {
        let next = sample(&logits, &greedy, &mut rng) as i64;
        out.push(next as u8);
        let hidden = model
            .forward_state(tokens(&[next]), &mut state, &[false])
            .map_err(|e| e.to_string())?;
        logits = last_logits(&model, hidden)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let letters = (0..want.len()).filter(|&i| want[i] != b'.');
    let right = letters.clone().filter(|&i| out[i] == want[i]).count();
    println!(
        "prompt    {}\ngenerated {}\nexpected  {}\n{right} of {} repeated letters right; \
         {:.0} tokens/s; the kNN memory now holds {} entries per head (every token read)",
        String::from_utf8_lossy(&text[..cut]),
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(want),
        letters.count(),
        want.len() as f64 / secs,
        state.knn_len(0, 0)
    );

    // Save the kNN memory (header, keys, values, checksums) and open it again.
    let dir = std::env::temp_dir().join(format!("memzoo-example-knn-{}", std::process::id()));
    state.save_knn(&dir).map_err(|e| e.to_string())?;
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
