//! Generate with a Transformer-XL, reusing its memory: the prompt is read once, then every new
//! token costs one step over the cached states instead of a pass over the whole context.
//!
//! ```text
//! cargo run --release --example xl_generate [-- --device flex --steps 1500 --tokens 64]
//! cargo run --release --example xl_generate -- --run-dir runs/shakespeare --prompt "ROMEO:"
//! ```
//!
//! Without `--run-dir` it first trains the small XL of `xl_train` on the repeated-passage text
//! (a few seconds), then asks it to continue a new passage: the repeats must be copied from the
//! memory. With `--run-dir` it loads the latest checkpoint of a `memzoo train` run instead.
//! Either way it then times generation with the cached memory against recomputing the whole
//! context for every token (both are `memzoo::train::generate`, the library code of `memzoo
//! generate`): `--tokens` new tokens after a prompt of `--context` tokens (default 256; with
//! `--run-dir`, the `--prompt` text), greedy, one token per step with the memory as long as the
//! whole context, against one pass over the whole context per token: the same function.

use burn::module::Module;
use memzoo::commands::load_xl;
use memzoo::train::generate::{GenerateConfig, SampleConfig, generate, generate_recompute};
use memzoo_examples::{CopyTask, arg, arg_or, copy_text, device_from_args, small_xl};

fn main() {
    memzoo_examples::exit_on_error(run());
}

fn run() -> Result<(), String> {
    let device = device_from_args();
    let tokens: usize = arg_or("--tokens", 64);
    let context: usize = arg_or("--context", 256);
    if tokens == 0 || context == 0 {
        return Err(format!(
            "--tokens ({tokens}) and --context ({context}) must be positive"
        ));
    }
    // Greedy, `segment_len` tokens read per step.
    let greedy = |tokens, segment_len| {
        GenerateConfig::new(tokens, segment_len)
            .with_sampler(SampleConfig::new().with_temperature(0.0))
    };

    let (model, prompt_text) = match arg("--run-dir") {
        Some(dir) => {
            let (_, model) =
                load_xl(std::path::Path::new(&dir), &device).map_err(|e| e.to_string())?;
            println!("loaded the latest checkpoint of {dir}");
            let prompt = arg("--prompt").unwrap_or_else(|| "The ".into());
            if prompt.is_empty() {
                return Err("--prompt must not be empty".into());
            }
            (model, prompt)
        }
        None => {
            let steps: usize = arg_or("--steps", 1500);
            let train_device = device.clone().autodiff();
            train_device.seed(0);
            let task = CopyTask::default();
            println!("training the small XL (mem_len 8) for {steps} steps on repeated passages...");
            let model = small_xl(8).init(&train_device).map_err(|e| e.to_string())?;
            let model =
                memzoo_examples::train_on_copy_task(model, &task, steps, 3e-3, 20, 500)?.valid();

            // A new passage and its first repeat as the prompt: the model should go on
            // repeating it, reading the letters back from its memory (one token at a time:
            // the source is 7 positions back, never in the current input).
            let (text, _) = copy_text(1, task.passage, task.gap, task.repeats, 1234);
            let cut = 2 * task.passage + 2 * task.gap;
            let prompt: Vec<i64> = text[..cut].iter().map(|&b| b as i64).collect();
            let want = &text[cut..text.len() - 1];
            let out = generate(&model, &prompt, &greedy(want.len(), 1), &device)
                .map_err(|e| e.to_string())?
                .tokens;
            let got: Vec<u8> = out.iter().map(|&t| t as u8).collect();
            let letters = (0..want.len()).filter(|&i| want[i] != b'.');
            let right = letters.clone().filter(|&i| got[i] == want[i]).count();
            println!(
                "prompt    {}\ngenerated {}\nexpected  {}\n{right} of {} repeated letters copied from memory",
                String::from_utf8_lossy(&text[..cut]),
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want),
                letters.count()
            );
            let (long, _) = copy_text(context, task.passage, task.gap, task.repeats, 99);
            (
                model,
                String::from_utf8_lossy(&long[..context]).into_owned(),
            )
        }
    };

    // Cached memory against recomputation. The memory is made as long as the whole context,
    // so both see exactly the same tokens and (greedy) produce the same text.
    let prompt: Vec<i64> = prompt_text.bytes().map(|b| b as i64).collect();
    let total = prompt.len() + tokens;
    let model = model.clone().with_mem_len(model.mem_len.max(total));
    let cached =
        generate(&model, &prompt, &greedy(tokens, 1), &device).map_err(|e| e.to_string())?;
    let (cached, cached_s) = (cached.tokens, cached.seconds_per_token);
    if arg("--run-dir").is_some() {
        let text: Vec<u8> = cached.iter().map(|&t| t as u8).collect();
        println!("{prompt_text}{}", String::from_utf8_lossy(&text));
    }
    let recomputed = generate_recompute(&model, &prompt, &greedy(tokens, total), &device)
        .map_err(|e| e.to_string())?;
    let (recomputed, recompute_s) = (recomputed.tokens, recomputed.seconds_per_token);
    let same = cached
        .iter()
        .zip(&recomputed)
        .filter(|(a, b)| a == b)
        .count();
    println!(
        "context {} -> {total} tokens: {:.1} tokens/s with the XL memory, {:.1} tokens/s \
         recomputing the context ({:.1}x); the two agree on {same} of {tokens} tokens",
        prompt.len(),
        1.0 / cached_s,
        1.0 / recompute_s,
        recompute_s / cached_s
    );
    Ok(())
}
