//! `memzoo eval`: a run's latest checkpoint over a split of its data.

use std::path::Path;
use std::time::Instant;

use memzoo_data::Split;
use memzoo_train::evaluate_sharded;
use serde_json::json;

use super::checks::{check_mem_len_flag, check_model_memory, check_vocab};
use super::device;
use super::loading::{load_xl_config, source};
use crate::config::RunConfig;
use crate::error::CliError;

/// `memzoo eval`.
pub fn eval(
    run_dir: &Path,
    device_name: &str,
    split: &str,
    mem_len: Option<usize>,
    tgt_len: Option<usize>,
    max_segments: Option<usize>,
    json_out: bool,
) -> Result<(), CliError> {
    let split = match split {
        "valid" => Split::Valid,
        "test" => Split::Test,
        "train" => Split::Train,
        other => {
            return Err(CliError::flag(
                "--split",
                other,
                "unknown split: expected valid or test (or train)",
            ));
        }
    };
    if max_segments == Some(0) {
        return Err(CliError::flag(
            "--max-segments",
            0,
            "must be positive (leave it out for the whole split)",
        ));
    }
    if tgt_len == Some(0) {
        return Err(CliError::flag("--tgt-len", 0, "must be positive"));
    }
    let device = device(device_name)?;
    // As in training: on data made of documents, documents per row with memory resets.
    let config = RunConfig::from_run_dir(run_dir, &[])?.on_data()?;
    check_mem_len_flag(mem_len, &config, run_dir)?;
    check_model_memory(&config, false)?;
    let len = tgt_len.unwrap_or(config.train.tgt_len);
    let codec = crate::data_setup::run_codec(&config.data, run_dir)?;
    let splits = crate::data_setup::load_splits_with(&config.data, codec)?;
    check_vocab(&config, &splits)?;
    let mut data = source(&config, &splits, split, len)?;
    let data = &mut *data;
    // Rows split over replicas as in training (`train.replicas`; unset: one per thread on flex).
    let replicas = config.train.replicas.map(|r| r.min(config.train.batch));
    let start = Instant::now();
    let model = load_xl_config(run_dir, &config, &device)?;
    let model = match mem_len {
        Some(m) => model.with_mem_len(m),
        None => model,
    };
    let eval_mem_len = model.mem_len;
    let r = evaluate_sharded(&model, data, len, max_segments, replicas);
    let r = r?;
    let secs = start.elapsed().as_secs_f64();
    if json_out {
        println!(
            "{}",
            json!({"split": split.as_str(), "mem_len": eval_mem_len, "tgt_len": len,
                   "loss": r.loss, "bpc": r.bpc, "ppl": r.ppl, "tokens": r.tokens, "seconds": secs,
                   "recall_loss": r.selected_loss, "recall_tokens": r.selected_tokens})
        );
    } else {
        println!(
            "{} split: loss {:.4} nats, {:.4} bpc, ppl {:.3} over {} tokens (mem_len {}, tgt_len {len}, {secs:.1}s)",
            split.as_str(),
            r.loss,
            r.bpc,
            r.ppl,
            r.tokens,
            eval_mem_len
        );
        if let Some(sel) = r.selected_loss {
            println!(
                "  on the {} recallable positions: {:.4} bpc",
                r.selected_tokens,
                sel / std::f64::consts::LN_2
            );
        }
    }
    Ok(())
}
