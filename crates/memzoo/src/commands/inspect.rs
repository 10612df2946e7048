//! `memzoo inspect`: one self-contained HTML page showing what a run's memory does on a text
//! (the page itself is built in [`crate::inspect`]).

use std::path::PathBuf;
use std::time::Instant;

use memzoo_data::TextCodec;
use serde_json::json;

use super::checks::{check_mem_len_flag, check_model_memory};
use super::device;
use super::loading::{latest_checkpoint, load_checkpoint_dir};
use crate::config::RunConfig;
use crate::error::CliError;

/// What `memzoo inspect` reads and writes.
#[derive(Debug, Clone)]
pub struct InspectArgs {
    /// The run directory (its config and, unless `checkpoint`, its latest checkpoint).
    pub run_dir: PathBuf,
    /// A checkpoint directory of the run to read instead of the latest.
    pub checkpoint: Option<PathBuf>,
    /// The text file.
    pub text: PathBuf,
    /// The page to write (default: `inspect.html` in the run directory).
    pub out: Option<PathBuf>,
    /// Read at most this many bytes of the text (cut at a character boundary).
    pub max_bytes: usize,
    /// Tokens per segment (default: the run's `train.tgt_len`).
    pub tgt_len: Option<usize>,
    /// XL memory length (default: the run's).
    pub mem_len: Option<usize>,
    /// Retrieved neighbours kept per query and head.
    pub neighbours: usize,
}

/// `memzoo inspect`: one self-contained HTML page showing what the run's memory does on a
/// text ([`crate::inspect`]). Returns the page's path.
pub fn inspect(args: &InspectArgs, device_name: &str, json_out: bool) -> Result<PathBuf, CliError> {
    if args.max_bytes == 0 {
        return Err(CliError::flag("--max-bytes", 0, "must be positive"));
    }
    if args.tgt_len == Some(0) {
        return Err(CliError::flag("--tgt-len", 0, "must be positive"));
    }
    if !args.run_dir.is_dir() {
        return Err(CliError::flag(
            "--run-dir",
            args.run_dir.display(),
            "no such directory",
        ));
    }
    let bytes = std::fs::read(&args.text)
        .map_err(|e| CliError::io(format!("reading --text {}", args.text.display()), e))?;
    let total = bytes.len();
    if total == 0 {
        return Err(CliError::flag(
            "--text",
            args.text.display(),
            "the file is empty: there is nothing to inspect",
        ));
    }
    // Cut at a character boundary (a UTF-8 sequence is never split).
    let mut cut = total.min(args.max_bytes);
    while cut < total && cut > 0 && (bytes[cut] & 0xC0) == 0x80 {
        cut -= 1;
    }
    let bytes = &bytes[..cut];
    let device = device(device_name)?;
    let config = RunConfig::from_run_dir(&args.run_dir, &[])?;
    check_mem_len_flag(args.mem_len, &config, &args.run_dir)?;
    check_model_memory(&config, false)?;
    let codec = TextCodec::for_dir_with_offset(&args.run_dir, config.data.byte_offset)?;
    let text = String::from_utf8_lossy(bytes);
    let tokens = codec.encode_corpus(&text)?;
    let pieces = match &codec {
        TextCodec::Bytes(_) => crate::inspect::byte_pieces(bytes),
        other => tokens
            .iter()
            .map(|&id| other.decode_continuation(&[id]))
            .collect::<Result<_, _>>()?,
    };
    let model = config.stack().init(&device)?;
    let (model, source) = match &args.checkpoint {
        Some(dir) => (load_checkpoint_dir(dir, model)?, dir.clone()),
        None => {
            let dir = latest_checkpoint(&args.run_dir)?;
            (load_checkpoint_dir(&dir, model)?, dir)
        }
    };
    let model = match args.mem_len {
        Some(m) => model.with_mem_len(m),
        None => model,
    };
    let opts = crate::inspect::InspectOptions {
        tgt_len: args.tgt_len.unwrap_or(config.train.tgt_len),
        neighbours: args.neighbours,
        ..Default::default()
    };
    let start = Instant::now();
    let name = args.text.display().to_string();
    let mut ins = crate::inspect::inspect(&model, &tokens, pieces, &name, &opts)?;
    ins.model = source.display().to_string();
    ins.bytes_read = bytes.len();
    ins.bytes_total = total;
    let page = crate::inspect::render(&ins);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.run_dir.join("inspect.html"));
    std::fs::write(&out, &page)
        .map_err(|e| CliError::io(format!("writing the page {}", out.display()), e))?;
    let secs = start.elapsed().as_secs_f64();
    let s = &ins.summary;
    if json_out {
        println!(
            "{}",
            json!({"page": out, "page_bytes": page.len(), "tokens": s.tokens + 1,
                   "bpc_with": s.bpc_with, "bpc_without": s.bpc_without,
                   "bytes_read": ins.bytes_read, "bytes_total": total, "seconds": secs})
        );
    } else {
        println!(
            "{}: {} tokens, {:.4} bits/token with memory, {:.4} without ({secs:.1}s); page {} ({:.1} MB)",
            name,
            s.tokens + 1,
            s.bpc_with,
            s.bpc_without,
            out.display(),
            page.len() as f64 / 1e6
        );
        if ins.bytes_read < total {
            println!(
                "  (the first {} of {total} bytes: --max-bytes)",
                ins.bytes_read
            );
        }
    }
    Ok(out)
}
