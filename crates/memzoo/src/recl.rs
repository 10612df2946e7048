//! `memzoo recl`: how far each of a group of runs really looks back — the relative effective
//! context length of Dai et al. (2019), computed by [`memzoo_train::recl`].

use std::path::PathBuf;

use memzoo_data::{Split, Token};
use memzoo_stack::TransformerXl;
use memzoo_train::recl::{self, LossTable, Recl};
use serde_json::json;

use crate::commands::{device, load_checkpoint};
use crate::config::{DataConfig, RunConfig};
use crate::data_setup::{document_texts, load_splits, tokenizer};
use crate::error::CliError;

/// What `memzoo recl` measures (its command-line arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct ReclOptions {
    /// A run directory of the group (repeat: --run-dir A --run-dir B ...); RECL compares them.
    #[arg(long = "run-dir", required = true)]
    pub run_dirs: Vec<PathBuf>,
    /// Context lengths, increasing multiples of the segment length (default: 0 to 8
    /// segments, one segment apart).
    #[arg(long, value_delimiter = ',')]
    pub contexts: Option<Vec<usize>>,
    /// Segment length of the scored blocks and of the windows' segments (default: the first
    /// run's train.tgt_len).
    #[arg(long)]
    pub seg_len: Option<usize>,
    /// Blocks of one segment scored at each context.
    #[arg(long, default_value_t = 64)]
    pub blocks: usize,
    /// Ratios r: the share of the hardest tokens compared (comma-separated).
    #[arg(long = "r", value_delimiter = ',', default_value = "0.1,1.0")]
    pub ratios: Vec<f64>,
    /// Relative gain below which a longer context stops counting (the paper: 0.01).
    #[arg(long, default_value_t = 0.01)]
    pub threshold: f64,
    /// XL memory at evaluation for the runs that have one (default: each run's own).
    #[arg(long)]
    pub mem_len: Option<usize>,
    /// Split: valid or test.
    #[arg(long, default_value = "test")]
    pub split: String,
}

/// The documents of a `[data]` section's split as token sequences: the crates of
/// `rust-code`, the generated corpus's documents, or the split as one document for a plain
/// text or data set.
pub fn split_documents(cfg: &DataConfig, split: Split) -> Result<Vec<Vec<Token>>, CliError> {
    let tok = tokenizer(cfg)?;
    Ok(match document_texts(cfg, split)? {
        Some(texts) => texts.iter().map(|t| tok.encode(t)).collect(),
        None => vec![load_splits(cfg)?.get(split).to_vec()],
    })
}

fn load_run(
    dir: &std::path::Path,
    device: &burn::tensor::Device,
) -> Result<(RunConfig, TransformerXl), CliError> {
    let config = RunConfig::from_run_dir(dir, &[])?.on_data()?;
    let model = config.model.init(device)?;
    let model = load_checkpoint(dir, model)?;
    Ok((config, model))
}

/// `memzoo recl`.
pub fn run(opts: &ReclOptions, device_name: &str, json_out: bool) -> Result<(), CliError> {
    let split = match opts.split.as_str() {
        "valid" => Split::Valid,
        "test" => Split::Test,
        other => return Err(CliError::flag("--split", other, "expected valid or test")),
    };
    if opts.run_dirs.is_empty() {
        return Err(CliError::flag(
            "--run-dir",
            "",
            "give at least one run directory",
        ));
    }
    if opts.blocks == 0 {
        return Err(CliError::flag("--blocks", 0, "must be positive"));
    }
    if let Some(r) = opts.ratios.iter().find(|r| !(**r > 0.0 && **r <= 1.0)) {
        return Err(CliError::flag("--r", r, "each ratio must be in (0, 1]"));
    }
    if !(opts.threshold.is_finite() && opts.threshold >= 0.0) {
        return Err(CliError::flag(
            "--threshold",
            opts.threshold,
            "must be a finite value >= 0",
        ));
    }
    let device = device(device_name)?;
    let first = RunConfig::from_run_dir(&opts.run_dirs[0], &[])?.on_data()?;
    let seg_len = opts.seg_len.unwrap_or(first.train.tgt_len);
    if seg_len == 0 {
        return Err(CliError::flag("--seg-len", 0, "must be positive"));
    }
    let contexts = opts
        .contexts
        .clone()
        .unwrap_or_else(|| (0..=8).map(|k| k * seg_len).collect());
    if contexts.len() < 2 || contexts.windows(2).any(|w| w[0] >= w[1]) {
        return Err(CliError::flag(
            "--contexts",
            format!("{contexts:?}"),
            "give at least two increasing context lengths",
        ));
    }
    if let Some(c) = contexts.iter().find(|c| !c.is_multiple_of(seg_len)) {
        return Err(CliError::flag(
            "--contexts",
            c,
            format!("each context must be a multiple of the segment length {seg_len}"),
        ));
    }
    let max_c = *contexts.last().expect("two or more");
    // The documents of the first run's data; every run must read the same ones.
    let docs = split_documents(&first.data, split)?;
    let lens: Vec<usize> = docs.iter().map(Vec::len).collect();
    let blocks = recl::probe_blocks(&lens, seg_len, max_c, 4 * seg_len, opts.blocks);
    if blocks.is_empty() {
        return Err(CliError::flag(
            "--contexts",
            max_c,
            format!(
                "no document of the {} split is longer than the largest context plus a \
                 segment ({} tokens; the longest has {})",
                split.as_str(),
                max_c + seg_len + 1,
                lens.iter().max().unwrap_or(&0)
            ),
        ));
    }
    let mut tables: Vec<LossTable> = Vec::new();
    for dir in &opts.run_dirs {
        let (config, model) = load_run(dir, &device)?;
        if serde_json::to_value(&config.data).ok() != serde_json::to_value(&first.data).ok() {
            return Err(CliError::Conflict(format!(
                "{} reads other data ([data]) than {}: RECL compares models on the same tokens",
                dir.display(),
                opts.run_dirs[0].display()
            )));
        }
        let model = match opts.mem_len {
            Some(m) if model.mem_len > 0 => model.with_mem_len(m),
            _ => model,
        };
        let table = recl::context_losses(&model, &docs, &blocks, seg_len, &contexts, 8)?;
        tables.push(table);
    }
    let results: Vec<(f64, Vec<Recl>)> = opts
        .ratios
        .iter()
        .map(|&r| Ok((r, recl::recl(&tables, r, opts.threshold)?)))
        .collect::<Result<_, CliError>>()?;
    let bpc = |t: &LossTable| -> Vec<f64> {
        t.mean_losses()
            .iter()
            .map(|l| l / std::f64::consts::LN_2)
            .collect()
    };
    if json_out {
        let runs: Vec<_> = opts
            .run_dirs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                json!({"run_dir": d, "bpc": bpc(&tables[i]),
                       "recl": results.iter().map(|(r, x)| json!({"r": r, "recl": x[i].recl,
                           "at_least": x[i].at_least, "gains": x[i].gains})).collect::<Vec<_>>()})
            })
            .collect();
        println!(
            "{}",
            json!({"split": split.as_str(), "contexts": contexts, "seg_len": seg_len,
                   "tokens": blocks.len() * seg_len, "threshold": opts.threshold, "runs": runs})
        );
        return Ok(());
    }
    println!(
        "RECL over {} tokens of the {} split ({} blocks of {seg_len}), contexts {contexts:?}, \
         gain threshold {}:",
        blocks.len() * seg_len,
        split.as_str(),
        blocks.len(),
        opts.threshold
    );
    for (i, dir) in opts.run_dirs.iter().enumerate() {
        let recls: Vec<String> = results
            .iter()
            .map(|(r, x)| {
                format!(
                    "r={r}: {}{}",
                    if x[i].at_least { ">= " } else { "" },
                    x[i].recl
                )
            })
            .collect();
        let curve: Vec<String> = bpc(&tables[i]).iter().map(|b| format!("{b:.3}")).collect();
        println!(
            "  {}: RECL {}; bpc by context {}",
            dir.display(),
            recls.join(", "),
            curve.join(" / ")
        );
    }
    Ok(())
}
