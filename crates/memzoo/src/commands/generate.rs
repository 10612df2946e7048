//! `memzoo generate`: continues a prompt with a run's latest checkpoint, of any family.

use std::path::Path;

use burn::tensor::Device;
use memzoo_data::{TextCodec, machine_memory};
use memzoo_train::SegmentModel;
use memzoo_train::generate::{
    GenerateConfig, GenerateError, SampleConfig, generate as generate_tokens, generate_recompute,
};
use serde_json::json;

use super::checks::{check_mem_len_flag, check_model_memory, check_prompt_vocab};
use super::loading::load_xl_config;
use super::{device, gib};
use crate::config::RunConfig;
use crate::error::CliError;

/// Options of `memzoo generate`.
pub struct GenerateOptions {
    /// Text to continue.
    pub prompt: String,
    /// Tokens to generate.
    pub tokens: usize,
    /// Temperature, top-k, top-p and seed.
    pub sampler: SampleConfig,
    /// Tokens per segment (the window of a Reformer); `None`: the run's `train.tgt_len`.
    pub segment_len: Option<usize>,
    /// XL memory length while generating (Transformer-XL runs); `None`: the run's.
    pub mem_len: Option<usize>,
    /// Also time the recompute-the-context baseline.
    pub compare_recompute: bool,
}

/// `memzoo generate`: continues `--prompt` with a run's latest checkpoint, of any family
/// ([`memzoo_train::generate()`]).
pub fn generate(
    run_dir: &Path,
    device_name: &str,
    opts: &GenerateOptions,
    json_out: bool,
) -> Result<(), CliError> {
    opts.sampler.validate()?;
    if opts.segment_len == Some(0) {
        return Err(GenerateError::SegmentLen(0).into());
    }
    // The generated tokens and their text stay in memory: refuse what cannot fit.
    let bytes = opts.tokens as f64 * 16.0;
    if let Some(total) = machine_memory()
        && bytes > total as f64
    {
        return Err(CliError::TooLarge {
            what: format!("--tokens {}: the generated tokens", opts.tokens),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: String::new(),
        });
    }
    let device = device(device_name)?;
    let config = RunConfig::from_run_dir(run_dir, &[])?;
    check_mem_len_flag(opts.mem_len, &config, run_dir)?;
    check_model_memory(&config, false)?;
    let segment_len = opts.segment_len.unwrap_or(config.train.tgt_len);
    // Bytes (at `data.byte_offset`), or the words of an imported word-level model
    // (`vocab.json` in the run).
    let codec = TextCodec::for_dir_with_offset(run_dir, config.data.byte_offset)?;
    check_prompt_vocab(&config, &codec, &opts.prompt)?;
    let model = load_xl_config(run_dir, &config, &device)?;
    let model = match opts.mem_len {
        Some(m) => model.with_mem_len(m),
        None => model,
    };
    generate_with(&model, &codec, segment_len, opts, &device, json_out)
}

fn generate_with<M: SegmentModel>(
    model: &M,
    codec: &TextCodec,
    segment_len: usize,
    opts: &GenerateOptions,
    device: &Device,
    json_out: bool,
) -> Result<(), CliError> {
    let prompt = codec.encode_prompt(&opts.prompt)?;
    let config = GenerateConfig::new(opts.tokens, segment_len).with_sampler(opts.sampler.clone());
    let out = generate_tokens(model, &prompt, &config, device)?;
    let text = codec.decode_continuation(&out.tokens)?;
    let recompute = if opts.compare_recompute {
        let r = generate_recompute(model, &prompt, &config, device)?;
        Some((r.seconds_per_token, r.tokens == out.tokens))
    } else {
        None
    };
    let cached_s = out.seconds_per_token;
    let how = if model.carries_state() {
        format!("segments of {segment_len}, state carried")
    } else {
        format!("a window of {segment_len}, recomputed")
    };
    if json_out {
        println!(
            "{}",
            json!({"prompt": opts.prompt, "text": text, "tokens": out.tokens.len(),
                   "family": model.family(), "segment_len": segment_len,
                   "cached_tokens_per_s": 1.0 / cached_s,
                   "recompute_tokens_per_s": recompute.map(|(s, _)| 1.0 / s),
                   "speedup": recompute.map(|(s, _)| s / cached_s),
                   "same_tokens": recompute.map(|(_, same)| same)})
        );
    } else {
        println!("{}{}", opts.prompt, text);
        eprintln!(
            "\n[{:.1} tokens/s, {} ({how})]",
            1.0 / cached_s,
            model.family()
        );
        if let Some((s, same)) = recompute {
            let ratio = if model.carries_state() {
                format!("the carried state is {:.1}x faster", s / cached_s)
            } else {
                "no cache: both read the window".into()
            };
            eprintln!(
                "[{:.1} tokens/s recomputing the context ({ratio}); the same tokens: {same}]",
                1.0 / s
            );
        }
    }
    Ok(())
}
