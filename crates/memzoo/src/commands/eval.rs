//! `memzoo eval`: a run's latest checkpoint over a split of its data.

use std::path::PathBuf;
use std::time::Instant;

use memzoo_data::Split;
use memzoo_stack::LayerKind;
use memzoo_train::{EvalResult, evaluate_sharded};
use serde_json::json;

use super::checks::{check_mem_len_flag, check_model_memory, check_vocab};
use super::device;
use super::loading::{load_xl_config, source};
use crate::config::RunConfig;
use crate::error::CliError;

/// What `memzoo eval` reads, and with which memory (its flags).
#[derive(clap::Args, Debug, Clone)]
pub struct EvalArgs {
    /// The run directory to evaluate.
    #[arg(long, default_value = "runs/default")]
    pub run_dir: PathBuf,
    /// Split: valid, test or train.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Memory length at evaluation (default: the run's; the paper evaluates with a longer one).
    #[arg(long)]
    pub mem_len: Option<usize>,
    /// Segment length at evaluation (default: the run's `train.tgt_len`).
    #[arg(long)]
    pub tgt_len: Option<usize>,
    /// Only the first N segments.
    #[arg(long)]
    pub max_segments: Option<usize>,
    /// kNN memory per row and head at evaluation (default: the run's
    /// `model.knn.max_memories`): a larger one than trained with, without retraining (the
    /// Memorizing Transformer's Table 5).
    #[arg(long)]
    pub knn_memories: Option<usize>,
    /// Pairs each query retrieves from the kNN memory at evaluation (default: the run's
    /// `model.knn.top_k`).
    #[arg(long)]
    pub knn_top_k: Option<usize>,
    /// Rows read side by side (default: the run's `train.batch`); fewer rows are longer, so
    /// that a large memory fills.
    #[arg(long)]
    pub rows: Option<usize>,
}

/// `memzoo eval` with the run's own kNN memory.
pub fn eval(
    run_dir: &std::path::Path,
    device_name: &str,
    split: &str,
    mem_len: Option<usize>,
    tgt_len: Option<usize>,
    max_segments: Option<usize>,
    json_out: bool,
) -> Result<(), CliError> {
    let args = EvalArgs {
        run_dir: run_dir.to_path_buf(),
        split: split.to_string(),
        mem_len,
        tgt_len,
        max_segments,
        knn_memories: None,
        knn_top_k: None,
        rows: None,
    };
    eval_with(&args, device_name, json_out).map(|_| ())
}

/// `memzoo eval`: prints the result and returns it.
pub fn eval_with(
    args: &EvalArgs,
    device_name: &str,
    json_out: bool,
) -> Result<EvalResult, CliError> {
    let EvalArgs {
        run_dir,
        split,
        mem_len,
        tgt_len,
        max_segments,
        knn_memories,
        knn_top_k,
        rows,
    } = args;
    let (run_dir, mem_len, tgt_len, max_segments) =
        (run_dir.as_path(), *mem_len, *tgt_len, *max_segments);
    let split = match split.as_str() {
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
    for (flag, value) in [
        ("--knn-memories", knn_memories),
        ("--knn-top-k", knn_top_k),
        ("--rows", rows),
    ] {
        if *value == Some(0) {
            return Err(CliError::flag(flag, 0, "must be positive"));
        }
    }
    let device = device(device_name)?;
    // The kNN memory's size and reach, and the rows, at evaluation, on the run's own config.
    let sets: Vec<String> = [
        knn_memories.map(|n| format!("model.knn.max_memories={n}")),
        knn_top_k.map(|k| format!("model.knn.top_k={k}")),
        rows.map(|r| format!("train.batch={r}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    // As in training: on data made of documents, documents per row with memory resets.
    let config = RunConfig::from_run_dir(run_dir, &sets)?.on_data()?;
    let knn_flag = knn_memories
        .map(|n| ("--knn-memories", n))
        .or(knn_top_k.map(|k| ("--knn-top-k", k)));
    if let Some((flag, value)) = knn_flag
        && !config.stack().layer_kinds().contains(&LayerKind::Knn)
    {
        return Err(CliError::flag(
            flag,
            value,
            format!("the run in {} has no kNN layer", run_dir.display()),
        ));
    }
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
    let stack = config.stack();
    let knn = stack
        .layer_kinds()
        .contains(&LayerKind::Knn)
        .then_some((stack.knn.max_memories, stack.knn.top_k));
    let r = evaluate_sharded(&model, data, len, max_segments, replicas);
    let r = r?;
    let secs = start.elapsed().as_secs_f64();
    if json_out {
        println!(
            "{}",
            json!({"split": split.as_str(), "mem_len": eval_mem_len, "tgt_len": len,
                   "rows": config.train.batch,
                   "knn_memories": knn.map(|k| k.0), "knn_top_k": knn.map(|k| k.1),
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
        if let Some((memories, top_k)) = knn {
            println!("  kNN memory {memories} per row and head, top {top_k}");
        }
        if let Some(sel) = r.selected_loss {
            println!(
                "  on the {} recallable positions: {:.4} bpc",
                r.selected_tokens,
                sel / std::f64::consts::LN_2
            );
        }
    }
    Ok(r)
}
