//! `cargo xtask study`: the papers' claims about memory, measured on real long documents.
//!
//! ```text
//! cargo xtask study                      # T1-T6 (about 85 minutes on 2 cores)
//! cargo xtask study --table t1b,t6b,t1v  # the extras: T1 on a book, T6's models trained to
//!                                        # copy, T1 with an XL trained with varied memory
//! cargo xtask study --table t1,t2        # some tables (models trained earlier are reused)
//! cargo xtask study --quick --out DIR    # a smoke run of the whole pipeline (minutes)
//! ```
//!
//! The documents are the `rust-code` corpus ([`memzoo_data::rust_code`]): the sources of the
//! crates pinned in memzoo's own `Cargo.lock`, one crate a document, split by crate. Every
//! model reads them as documents (each row of a batch a sequence of whole documents, the
//! memories reset where one starts), as the papers do. The tables:
//!
//! - **T1**, Transformer-XL's memory at evaluation (Dai et al. 2019, Tables 6 and 9): an XL
//!   trained with memory `M`, evaluated with memory 0 .. 8M, with and without `same_length`
//!   (and `clamp_len` at the training span); the same model trained without recurrence; a
//!   vanilla Transformer with absolute positions (`LayerKind::Absolute`). **T1V** (an extra):
//!   the same evaluation of an XL trained with varied memory lengths (it keeps 8M; each step
//!   reads 0 .. 8M of it, `XlConfig::train_memory_lengths`).
//! - **T2**, relative effective context length (Dai et al. 2019, Table 8) of {XL, XL without
//!   recurrence, vanilla, Memorizing}, with [`memzoo_train::recl`].
//! - **T3**, the Memorizing Transformer's memory size (Wu et al. 2022, Tables 4 and 5): a model
//!   with a kNN layer, with and without the XL cache, trained with one memory size and
//!   evaluated with 1.5K .. 64K, beside the same stacks without kNN memory; the loss on the
//!   tokens only a long memory can predict.
//! - **T4**, the Reformer's duplication task (Kitaev et al. 2020, Table 2): trained with full
//!   attention and LSH-1/2/4, each evaluated with full attention and LSH-1/2/4/8.
//! - **T5**, LSH against full attention on real text (Kitaev et al. 2020, Figures 4-5): bpc at
//!   equal steps, and time per training step against sequence length.
//! - **T6**, copying at a distance (no paper's table: the mechanism the others rest on): pieces
//!   of the test documents read twice, by T1's and T3's models and any `--copy-run`.
//! - Extras, run when named: **T1B**, T1 on a book; **T6B**, T6's mechanism check (models
//!   trained on pieces read twice).
//!
//! Results are JSON lines (`<out>/study.jsonl`; a table's lines replace that table's earlier
//! ones), one SVG chart per table (`<out>/t1.svg` ...) and a Markdown report
//! (`docs/study.md`, or `<out>/study.md` with `--out`), each table beside the paper's numbers
//! and the targets the study sets itself, met or missed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use clap::Args;
use memzoo_data::rust_code::{self, RustCodeManifest};
use memzoo_data::{DocBatcher, Duplication, Split, TaskStream, Token};
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::{LayerKind, LshConfig, TransformerXl, XlConfig};
use memzoo_train::recl;
use memzoo_train::{
    AdamConfig, EvalResult, RecurrentModel, RunOptions, ScheduleConfig, TrainConfig, checkpoint,
    evaluate_sharded,
};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The tables, in the order they run.
pub const TABLES: [&str; 10] = [
    "t1", "t1b", "t1v", "t2", "t3", "t4", "t5", "t6", "t6b", "t7",
];

/// The tables `cargo xtask study` runs when none is named: the papers' tables (T1-T5) and
/// T6 reading their models, about 85 minutes on 2 cores. The extras T1B (T1 on a book, about
/// 20 minutes) and T6B (models trained on pieces read twice, about 24 minutes) run when named.
pub const DEFAULT_TABLES: [&str; 6] = ["t1", "t2", "t3", "t4", "t5", "t6"];

/// The tables that read models other tables train (T2 and T6 read T1's and T3's): their time
/// does not include training.
const READER_TABLES: [&str; 2] = ["t2", "t6"];

/// `cargo xtask study` options.
#[derive(Args, Clone, Debug)]
pub struct StudyArgs {
    /// Tables to run (comma-separated: t1, t1b, t1v, t2, t3, t4, t5, t6, t6b, t7; default: t1-t6,
    /// the papers' tables and T6 on their models). T2 and T6 use T1's and T3's models (trained here
    /// if they are not yet).
    #[arg(long, value_delimiter = ',')]
    pub table: Option<Vec<String>>,
    /// A smoke run of the whole pipeline: tiny models, a few steps, a few documents. Checks
    /// that every table runs, not what it shows.
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON lines, charts and report go (default: docs/study/ and docs/study.md;
    /// with --out: DIR/study.jsonl, DIR/*.svg, DIR/study.md).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the trained models live (run directories; reused when their recipe matches).
    /// Default: `<workspace>/target/memzoo-study` (or `<out>/runs` with --out).
    #[arg(long)]
    pub runs: Option<PathBuf>,
    /// Device (flex, wgpu, tch, cuda, ...).
    #[arg(long, default_value = "flex")]
    pub device: String,
    /// CPU threads for the flex backend.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seed of every model's initialisation and data order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Changes one size of the scale (a field of `Scale`, e.g. `--set dup_steps=20000`,
    /// `--set knn_eval=[1536,8192]`); repeatable. A study at another scale belongs in its own
    /// `--out` and `--runs`.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
    /// Rewrite the report and charts from the JSON lines already measured; run nothing.
    #[arg(long)]
    pub report_only: bool,
    /// The book of table T1b (`t1b`: T1 on a book): a text file, default
    /// `$MEMZOO_TINY_SHAKESPEARE` or `../shared/data/tinyshakespeare.txt` beside the workspace.
    #[arg(long)]
    pub books: Option<PathBuf>,
    /// T6 also reads this run of `memzoo train` (a run directory: its latest checkpoint; or
    /// one of its checkpoint directories), so a user can test their own models' copying on
    /// the study's pieces. Repeatable.
    #[arg(long = "copy-run", value_name = "PATH")]
    pub copy_runs: Vec<PathBuf>,
}

/// The sizes of one study run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Scale {
    /// Bytes of training documents (crates of the train split, in a seeded order).
    pub train_bytes: usize,
    /// Bytes of test documents.
    pub test_bytes: usize,
    /// Documents shorter than this are left out (the memory needs long documents).
    pub min_doc: usize,
    /// Documents longer than this are left out (one crate must not fill a row alone).
    pub max_doc: usize,
    /// Layers, width, heads of the code models (T1-T3).
    pub n_layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Feed-forward width.
    pub d_inner: usize,
    /// Segment length (training and evaluation).
    pub tgt_len: usize,
    /// XL memory `M` in training.
    pub mem_len: usize,
    /// Rows per step.
    pub batch: usize,
    /// Training steps of each code model of T1 (XL, no recurrence, vanilla).
    pub steps: usize,
    /// Training steps of each code model of T3 (the memorizing stacks).
    pub steps_memorizing: usize,
    /// Training steps of each model of T1b (T1 on the book).
    pub steps_books: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// kNN memory per row and head in training (T3).
    pub knn_train: usize,
    /// kNN memories evaluated (T3).
    pub knn_eval: Vec<usize>,
    /// Blocks of `tgt_len` tokens scored at each context (T2).
    pub recl_blocks: usize,
    /// Largest context of T2 (a multiple of `tgt_len`).
    pub recl_max_context: usize,
    /// T4: sequence length and training steps.
    pub dup_len: usize,
    /// T4 training steps.
    pub dup_steps: usize,
    /// T4: evaluation batches of 16 sequences.
    pub dup_eval_batches: usize,
    /// T4: rotation seeds each LSH evaluation is averaged over.
    pub dup_eval_seeds: usize,
    /// T5: sequence length and training steps of the Reformers.
    pub lsh_len: usize,
    /// T5 training steps.
    pub lsh_steps: usize,
    /// T5: sequence lengths timed.
    pub timing_lengths: Vec<usize>,
    /// T6: distances of the repeat (a piece of this many bytes read twice).
    pub copy_distances: Vec<usize>,
    /// T6: tokens read at each distance (pieces of the test documents, each read twice).
    pub copy_tokens: usize,
    /// T6: training steps of the models trained on pieces read twice.
    pub copy_steps: usize,
}

impl Scale {
    /// The study's scale: about 90 minutes on 2 cores.
    pub fn full() -> Self {
        Self {
            train_bytes: 6_000_000,
            test_bytes: 400_000,
            min_doc: 96 * 1024,
            max_doc: 1024 * 1024,
            n_layers: 4,
            d_model: 128,
            n_heads: 4,
            d_inner: 512,
            tgt_len: 64,
            mem_len: 64,
            batch: 16,
            steps: 3000,
            steps_memorizing: 2000,
            steps_books: 1500,
            lr: 1e-3,
            knn_train: 8192,
            knn_eval: vec![1536, 8192, 32768, 65536],
            recl_blocks: 96,
            recl_max_context: 512,
            dup_len: 32,
            dup_steps: 5000,
            dup_eval_batches: 32,
            dup_eval_seeds: 5,
            lsh_len: 512,
            lsh_steps: 400,
            timing_lengths: vec![512, 1024, 2048, 4096, 8192],
            copy_distances: vec![32, 96, 512, 4096],
            copy_tokens: 65_536,
            copy_steps: 1500,
        }
    }

    /// A smoke run: every table, tiny.
    pub fn quick() -> Self {
        Self {
            train_bytes: 60_000,
            test_bytes: 8_000,
            min_doc: 2_000,
            max_doc: 20_000,
            n_layers: 2,
            d_model: 32,
            n_heads: 2,
            d_inner: 64,
            tgt_len: 16,
            mem_len: 16,
            batch: 2,
            steps: 4,
            steps_memorizing: 3,
            steps_books: 3,
            lr: 1e-3,
            knn_train: 64,
            knn_eval: vec![32, 64, 128],
            recl_blocks: 4,
            recl_max_context: 32,
            dup_len: 16,
            dup_steps: 4,
            dup_eval_batches: 2,
            dup_eval_seeds: 2,
            lsh_len: 64,
            lsh_steps: 3,
            timing_lengths: vec![64, 128],
            copy_distances: vec![8, 32],
            copy_tokens: 256,
            copy_steps: 3,
        }
    }
}

impl Scale {
    /// This scale with `FIELD=VALUE` settings applied (`VALUE` in JSON).
    ///
    /// # Errors
    /// A setting without `=`, an unknown field, or a value of the wrong type, named.
    pub fn with_sets(self, sets: &[String]) -> Result<Self, String> {
        let mut v = serde_json::to_value(&self).map_err(|e| e.to_string())?;
        for set in sets {
            let (field, value) = set
                .split_once('=')
                .ok_or_else(|| format!("--set {set:?}: expected FIELD=VALUE"))?;
            let slot = v
                .get_mut(field)
                .ok_or_else(|| format!("--set {set:?}: the scale has no field `{field}`"))?;
            *slot = serde_json::from_str(value)
                .map_err(|e| format!("--set {set:?}: `{value}` is not a JSON value: {e}"))?;
        }
        serde_json::from_value(v).map_err(|e| format!("--set {sets:?}: {e}"))
    }
}

/// The documents of a study run, as byte tokens.
pub struct CodeData {
    /// Training documents.
    pub train: Vec<Vec<Token>>,
    /// Test documents.
    pub test: Vec<Vec<Token>>,
    /// The test crates' names.
    pub test_names: Vec<String>,
    /// The train crates' names.
    pub train_names: Vec<String>,
}

/// Reads crates of `split` (in an order seeded by `seed`) from the cargo registry until
/// `budget` bytes, taking those of `min_doc..=max_doc` bytes.
fn read_split(
    manifest: &RustCodeManifest,
    registries: &[PathBuf],
    split: Split,
    scale: &Scale,
    budget: usize,
    seed: u64,
    quick: bool,
) -> Result<(Vec<Vec<Token>>, Vec<String>), String> {
    let present = |name: &str| registries.iter().any(|r| r.join(name).is_dir());
    let mut entries: Vec<_> = manifest
        .crates()
        .iter()
        .filter(|c| {
            c.split == split && (scale.min_doc..=scale.max_doc).contains(&(c.bytes as usize))
        })
        // A smoke run takes what this machine has; a real one names what is missing.
        .filter(|c| !quick || present(&c.document_name()))
        .collect();
    entries.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let (mut chosen, mut bytes) = (Vec::new(), 0);
    for c in entries {
        if bytes >= budget {
            break;
        }
        bytes += c.bytes as usize;
        chosen.push(c.document_name());
    }
    if chosen.is_empty() {
        return Err(format!(
            "no {} crate of the rust-code corpus has {}..={} bytes",
            split.as_str(),
            scale.min_doc,
            scale.max_doc
        ));
    }
    let names: Vec<String> = manifest
        .crates()
        .iter()
        .filter(|c| chosen.contains(&c.document_name()))
        .map(|c| c.name.clone())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let picked = manifest.select(&names).map_err(|e| e.to_string())?;
    // `select` keeps every version of a name: only the chosen documents, in the seeded order.
    let mut docs: Vec<_> = rust_code::build(&picked, registries)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|d| chosen.contains(&d.name))
        .collect();
    docs.sort_by_key(|d| chosen.iter().position(|n| *n == d.name));
    let kept = docs.iter().map(|d| d.name.clone()).collect();
    let tokens = docs
        .into_iter()
        .map(|d| d.text.into_iter().map(Token::from).collect())
        .collect();
    Ok((tokens, kept))
}

impl CodeData {
    /// The study's documents from the crates in cargo's registry.
    pub fn load(scale: &Scale, seed: u64, quick: bool) -> Result<Self, String> {
        let manifest = RustCodeManifest::embedded().map_err(|e| e.to_string())?;
        let registries = rust_code::registry_src_dirs();
        let (train, train_names) = read_split(
            &manifest,
            &registries,
            Split::Train,
            scale,
            scale.train_bytes,
            seed,
            quick,
        )?;
        let (test, test_names) = read_split(
            &manifest,
            &registries,
            Split::Test,
            scale,
            scale.test_bytes,
            seed,
            quick,
        )?;
        Ok(Self {
            train,
            test,
            test_names,
            train_names,
        })
    }

    /// A book's splits as `memzoo train --data FILE` makes them (the last 5% validation, the 5%
    /// before it test), each cut into `scale.batch` contiguous documents: one per batch row,
    /// its memory carried through its part (as a book is read in the papers), reset at the
    /// next. `quick`: the first 64 KB of the book.
    pub fn book(path: &Path, scale: &Scale, quick: bool) -> Result<Self, String> {
        if !path.is_file() {
            return Err(format!(
                "the study's book {} is missing: give one with --books FILE (or set \
                 MEMZOO_TINY_SHAKESPEARE)",
                path.display()
            ));
        }
        let mut text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if quick {
            text.truncate(64 * 1024);
        }
        // `memzoo train --data FILE`'s split (`DataConfig`'s default fractions).
        let splits = memzoo_data::Corpus::from_bytes(
            text,
            &memzoo_data::SplitRule::Fractions {
                valid: 0.05,
                test: 0.05,
            },
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let cut = |bytes: &[u8], split: &str| -> (Vec<Vec<Token>>, Vec<String>) {
            let parts = scale.batch.max(1);
            let len = bytes.len().div_ceil(parts).max(1);
            bytes
                .chunks(len)
                .enumerate()
                .map(|(i, c)| {
                    (
                        c.iter().map(|&b| Token::from(b)).collect(),
                        format!("{name} {split} {}/{parts}", i + 1),
                    )
                })
                .unzip()
        };
        let (train, train_names) = cut(&splits.train, "train");
        let (test, test_names) = cut(&splits.test, "test");
        Ok(Self {
            train,
            test,
            test_names,
            train_names,
        })
    }

    fn bytes(docs: &[Vec<Token>]) -> usize {
        docs.iter().map(Vec::len).sum()
    }
}

/// The default book of T1b: `$MEMZOO_TINY_SHAKESPEARE`, else tiny Shakespeare beside the
/// workspace (`../shared/data/tinyshakespeare.txt`).
fn default_book() -> PathBuf {
    std::env::var_os("MEMZOO_TINY_SHAKESPEARE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/data/tinyshakespeare.txt"))
}

/// Positions whose byte only a memory reaching further than `reach` tokens can copy: the
/// 8-byte string ending there occurred earlier in the document, and not within the last
/// `reach` bytes. `mask[p]` is about target `p` (the byte at `p`).
pub fn far_mask(doc: &[Token], reach: usize) -> Vec<bool> {
    const N: usize = 8;
    let mut last: HashMap<&[Token], usize> = HashMap::new();
    let mut mask = vec![false; doc.len()];
    for p in N - 1..doc.len() {
        let gram = &doc[p + 1 - N..=p];
        if let Some(&q) = last.get(gram) {
            mask[p] = p - q > reach;
        }
        last.insert(gram, p);
    }
    mask
}

/// T6: the kNN memory of a model read beside its trained one, to show what that memory itself
/// carries: no further back than the XL memory's reach (`tgt_len + mem_len` in the study).
const KNN_CUT: usize = 64;

/// One target mask per document (`mask[t]` about target `t`).
type TargetMasks = Vec<Vec<bool>>;

/// T6's documents: pieces of `d` tokens cut from `docs` in turn (the first piece of every
/// document, then the second, ...), each read twice in a row (`x ++ x`), until `budget`
/// tokens; with each piece's target mask, which selects the targets of the second reading
/// (`mask[t]` is about target `t`, the token at `t + 1`).
///
/// # Errors
/// When no document holds a whole piece.
pub fn repeated_pieces(
    docs: &[Vec<Token>],
    d: usize,
    budget: usize,
) -> Result<(Vec<Vec<Token>>, TargetMasks), String> {
    let mut pieces = Vec::new();
    let most = docs.iter().map(|x| x.len() / d.max(1)).max().unwrap_or(0);
    'fill: for k in 0..most {
        for doc in docs {
            if pieces.len() * 2 * d >= budget {
                break 'fill;
            }
            if let Some(p) = doc.get(k * d..(k + 1) * d) {
                pieces.push(p.iter().chain(p).copied().collect::<Vec<Token>>());
            }
        }
    }
    if d == 0 || pieces.is_empty() {
        return Err(format!("no test document holds a piece of {d} tokens"));
    }
    let mask: Vec<bool> = (0..2 * d).map(|t| t + 1 >= d && t + 1 < 2 * d).collect();
    let masks = vec![mask; pieces.len()];
    Ok((pieces, masks))
}

/// A run of `memzoo train` named by `path` (a run directory, or one of its checkpoint
/// directories): its name (`<run>@<step>`), the stack it trains (on its data, as `memzoo
/// eval` reads it) and the checkpoint.
///
/// # Errors
/// A path that is neither, a config that does not read, or a run with no checkpoint, named.
fn external_run(path: &Path) -> Result<(String, XlConfig, PathBuf), String> {
    let (run, ckpt) = if path.join("trainer.json").is_file() {
        let run = path
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| format!("{}: a checkpoint outside a run directory", path.display()))?;
        (run.to_path_buf(), path.to_path_buf())
    } else {
        let ckpt = checkpoint::latest(&path.join("checkpoints"))
            .map_err(|e| format!("{}: {e}", path.display()))?
            .ok_or_else(|| format!("{}: no checkpoint in this run", path.display()))?;
        (path.to_path_buf(), ckpt)
    };
    let config = memzoo::config::RunConfig::from_run_dir(&run, &[])
        .and_then(|c| c.on_data())
        .map_err(|e| format!("{}: {e}", run.display()))?
        .stack();
    let step = ckpt
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse::<u64>().ok())
        .map_or_else(|| "latest".to_string(), |n| n.to_string());
    let name = format!(
        "{}@{step}",
        run.file_name().and_then(|n| n.to_str()).unwrap_or("run")
    );
    Ok((name, config, ckpt))
}

/// The mean loss (nats) of T6's first and second readings: the selected targets are the
/// second reading's, the rest the first's.
fn readings(r: &EvalResult) -> (f64, f64) {
    let second = r.selected_loss.unwrap_or(f64::NAN);
    let first_tokens = r.tokens.saturating_sub(r.selected_tokens);
    let first = if first_tokens == 0 {
        f64::NAN
    } else {
        (r.loss * r.tokens as f64 - second * r.selected_tokens as f64) / first_tokens as f64
    };
    (first, second)
}

/// One line of the study's results.
fn line(table: &str, fields: Value) -> Value {
    let mut v = json!({ "table": table });
    if let (Some(o), Value::Object(f)) = (v.as_object_mut(), fields) {
        o.extend(f);
    }
    v
}

/// The study's context: arguments, scale, device, data, directories.
pub struct Study {
    scale: Scale,
    seed: u64,
    device: Device,
    runs: PathBuf,
    out: PathBuf,
    report: PathBuf,
    data: Option<CodeData>,
    far_masks: HashMap<usize, Vec<Vec<bool>>>,
    quick: bool,
    /// Runs of `memzoo train` that T6 reads besides the study's models (`--copy-run`).
    copy_runs: Vec<PathBuf>,
    /// Training seconds of the models reused from `runs` (a finished run of the same recipe)
    /// since the study started: a table's time from scratch is its wall time plus these.
    reused_seconds: std::cell::Cell<f64>,
    /// Seconds spent on the `--copy-run` runs in T6 (not part of the study's own time).
    external_seconds: f64,
    /// The documents the tables read now: the rust-code crates, or the book of T1b.
    corpus: Corpus,
    /// The book of T1b.
    books: PathBuf,
}

/// The documents a table reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Corpus {
    /// The rust-code crates (T1-T6).
    RustCode,
    /// A book (T1b), cut into `batch` contiguous parts per split.
    Books,
}

/// Which code model (T1-T3) and how it is built.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeModel {
    /// Transformer-XL: XL relative positions, memory `M`.
    Xl,
    /// The same without recurrence (memory 0 in training).
    XlNoRecurrence,
    /// Vanilla: absolute positions, no memory.
    Vanilla,
    /// Memorizing stack (T5 positions) without kNN layer, XL cache `M`.
    TFiveCache,
    /// The same without the XL cache.
    TFiveNone,
    /// Memorizing Transformer: a kNN layer, XL cache `M`.
    KnnCache,
    /// Memorizing Transformer without the XL cache.
    KnnNone,
    /// A kNN layer in the XL stack (XL positions in the other layers), XL cache `M`.
    KnnXl,
    /// Transformer-XL trained with varied memory lengths: it keeps `8M`, and each training
    /// step reads the most recent `0, M/2, M, 2M, 4M` or `8M` of it (T1V).
    XlVaried,
    /// Compressive Transformer (T7): XL memory `M` and a compressed memory of `M` slots fed
    /// at rate 4 (1D convolution) by what leaves it, with the reconstruction loss.
    Compressive,
    /// Recurrent Memory Transformer (T7): 16 memory tokens read before and written after
    /// every segment, backpropagated through 2 segments, no XL memory.
    Rmt,
    /// Compressive Transformer with most-used compression (T7): as [`CodeModel::Compressive`],
    /// the most attended of the leaving positions kept instead of their convolution.
    CompressiveMostUsed,
    /// Recurrent Memory Transformer + Transformer-XL (T7): [`CodeModel::Rmt`]'s memory tokens
    /// and an XL memory `M` of the segment tokens.
    RmtXl,
    /// Block-Recurrent Transformer (T7): XL memory `M` (the window over the previous block)
    /// and the middle layer recurrent with `M` state vectors (fixed gate), backpropagated
    /// through 2 blocks.
    BlockRecurrent,
}

impl CodeModel {
    fn name(self) -> &'static str {
        match self {
            CodeModel::Xl => "xl",
            CodeModel::XlNoRecurrence => "xl-no-recurrence",
            CodeModel::Vanilla => "vanilla",
            CodeModel::TFiveCache => "t5-xl-cache",
            CodeModel::TFiveNone => "t5-no-memory",
            CodeModel::KnnCache => "memorizing-xl-cache",
            CodeModel::KnnNone => "memorizing-no-cache",
            CodeModel::KnnXl => "knn-among-xl",
            CodeModel::XlVaried => "xl-varied-memory",
            CodeModel::Compressive => "compressive",
            CodeModel::CompressiveMostUsed => "compressive-most-used",
            CodeModel::Rmt => "rmt",
            CodeModel::RmtXl => "rmt-xl",
            CodeModel::BlockRecurrent => "block-recurrent",
        }
    }
}

impl Study {
    /// Sets up a study run from its arguments.
    pub fn new(args: &StudyArgs) -> Result<Self, String> {
        let root = workspace_root();
        let (out, report) = match &args.out {
            Some(dir) => (dir.clone(), dir.join("study.md")),
            None => (root.join("docs/study"), root.join("docs/study.md")),
        };
        let runs = match (&args.runs, &args.out) {
            (Some(r), _) => r.clone(),
            (None, Some(dir)) => dir.join("runs"),
            (None, None) => std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target"))
                .join("memzoo-study"),
        };
        let device = memzoo_backend::parse_device(&args.device).map_err(|e| e.to_string())?;
        Ok(Self {
            scale: (if args.quick {
                Scale::quick()
            } else {
                Scale::full()
            })
            .with_sets(&args.set)?,
            seed: args.seed,
            device,
            runs,
            out,
            report,
            data: None,
            far_masks: HashMap::new(),
            quick: args.quick,
            copy_runs: args.copy_runs.clone(),
            corpus: Corpus::RustCode,
            books: args.books.clone().unwrap_or_else(default_book),
            reused_seconds: std::cell::Cell::new(0.0),
            external_seconds: 0.0,
        })
    }

    /// Reads `corpus` from now on (its documents loaded when a table first asks).
    fn set_corpus(&mut self, corpus: Corpus) {
        if self.corpus != corpus {
            self.corpus = corpus;
            self.data = None;
            self.far_masks.clear();
        }
    }

    fn data(&mut self) -> Result<&CodeData, String> {
        if self.data.is_none() {
            let start = Instant::now();
            let d = match self.corpus {
                Corpus::RustCode => CodeData::load(&self.scale, self.seed, self.quick)?,
                Corpus::Books => CodeData::book(&self.books, &self.scale, self.quick)?,
            };
            eprintln!(
                "study: {} train documents ({} bytes), {} test documents ({} bytes) read in {:.1}s",
                d.train.len(),
                CodeData::bytes(&d.train),
                d.test.len(),
                CodeData::bytes(&d.test),
                start.elapsed().as_secs_f64()
            );
            self.data = Some(d);
        }
        Ok(self.data.as_ref().expect("loaded"))
    }

    /// The model of `kind` at this scale.
    fn code_config(&self, kind: CodeModel) -> XlConfig {
        let s = &self.scale;
        let base = XlConfig::new()
            .with_vocab_size(256)
            .with_n_layers(s.n_layers)
            .with_d_model(s.d_model)
            .with_n_heads(s.n_heads)
            .with_d_head(None)
            .with_d_inner(s.d_inner)
            .with_dropout(0.0)
            .with_dropatt(0.0)
            .with_tie_weights(true)
            .with_untie_rel_bias(true)
            .with_document_resets(true);
        let t5 = PositionConfig::new()
            .with_kind(PositionKind::T5)
            .with_num_buckets(32)
            .with_max_distance(s.mem_len + s.tgt_len);
        let knn_layers = |others: LayerKind| {
            (0..s.n_layers)
                .map(|l| {
                    if l == s.n_layers / 2 {
                        LayerKind::Knn
                    } else {
                        others
                    }
                })
                .collect::<Vec<_>>()
        };
        let knn_among = |c: XlConfig, others: LayerKind| {
            c.with_layers(knn_layers(others)).with_knn(
                memzoo_stack::KnnLayerConfig::new()
                    .with_top_k(32)
                    .with_max_memories(s.knn_train)
                    .with_attn_scale_init(20.0),
            )
        };
        let knn = |c: XlConfig| knn_among(c, LayerKind::T5);
        // The memorizing stack: pre-LN as the paper's decoder and memzoo's preset.
        let t5 = |c: XlConfig| c.with_positions(t5.clone()).with_pre_ln(true);
        match kind {
            CodeModel::Xl => base.with_mem_len(s.mem_len),
            CodeModel::XlVaried => {
                let m = s.mem_len;
                base.with_mem_len(8 * m).with_train_memory_lengths(vec![
                    0,
                    m / 2,
                    m,
                    2 * m,
                    4 * m,
                    8 * m,
                ])
            }
            CodeModel::XlNoRecurrence => base.with_mem_len(0),
            CodeModel::Vanilla => base
                .with_mem_len(0)
                .with_positions(PositionConfig::new().with_kind(PositionKind::Absolute)),
            CodeModel::TFiveCache => t5(base.with_mem_len(s.mem_len)),
            CodeModel::TFiveNone => t5(base.with_mem_len(0)),
            CodeModel::KnnCache => knn(t5(base.with_mem_len(s.mem_len))),
            CodeModel::KnnNone => knn(t5(base.with_mem_len(0))),
            // The kNN layer among XL layers (XL positions elsewhere; pre-LN as the kNN stack).
            CodeModel::KnnXl => knn_among(
                base.with_mem_len(s.mem_len).with_pre_ln(true),
                LayerKind::Xl,
            ),
            CodeModel::Compressive => base.with_mem_len(s.mem_len).with_compressive(Some(
                memzoo_stack::CompressiveConfig::new()
                    .with_cmem_len(s.mem_len)
                    .with_ratio(4),
            )),
            CodeModel::CompressiveMostUsed => base.with_mem_len(s.mem_len).with_compressive(Some(
                memzoo_stack::CompressiveConfig::new()
                    .with_cmem_len(s.mem_len)
                    .with_ratio(4)
                    .with_function(memzoo_stack::CompressionKind::MostUsed),
            )),
            CodeModel::Rmt | CodeModel::RmtXl => {
                let mem_len = if kind == CodeModel::RmtXl {
                    s.mem_len
                } else {
                    0
                };
                base.with_mem_len(mem_len).with_rmt(Some(
                    memzoo_stack::RmtConfig::new()
                        .with_mem_tokens(16)
                        .with_bptt_segments(2),
                ))
            }
            CodeModel::BlockRecurrent => base.with_mem_len(s.mem_len).with_block_recurrent(Some(
                memzoo_stack::BlockRecurrentConfig::new()
                    .with_state_len(s.mem_len)
                    .with_layer(s.n_layers / 2)
                    .with_bptt_segments(2),
            )),
        }
    }

    fn train_config(&self, steps: usize, batch: usize, tgt_len: usize, lr: f64) -> TrainConfig {
        TrainConfig::sized(steps, batch, tgt_len)
            .with_schedule(ScheduleConfig::cosine(lr, (steps / 20).min(200), 0.1))
            .with_weight_decay(0.01)
            .with_adam(AdamConfig::new())
            .with_clip_norm(Some(0.25))
            .with_seed(self.seed)
            .with_log_every((steps / 10).max(1))
            .with_eval_every(0)
            .with_checkpoint_every(0)
            .with_keep_checkpoints(1)
    }

    /// Trains `config` on `data` into `runs/<name>` unless a finished run of the same recipe
    /// is there (the recipe: model, training and, where given, `data_recipe`); returns the
    /// checkpoint directory and the training seconds.
    fn train_run(
        &self,
        name: &str,
        config: &XlConfig,
        train: &TrainConfig,
        data: &mut dyn memzoo_train::SegmentSource,
        data_recipe: Option<Value>,
    ) -> Result<(PathBuf, f64), String> {
        let dir = self.runs.join(name);
        let mut recipe = json!({"model": config, "train": train});
        if let (Some(d), Some(o)) = (data_recipe, recipe.as_object_mut()) {
            o.insert("data".into(), d);
        }
        let recipe = recipe.to_string();
        let recipe_file = dir.join("study-recipe.json");
        let done = dir.join("study-seconds.txt");
        if std::fs::read_to_string(&recipe_file).is_ok_and(|stored| same_recipe(&stored, &recipe))
            && let Ok(secs) = std::fs::read_to_string(&done)
            && let Ok(Some(ckpt)) = checkpoint::latest(&dir.join("checkpoints"))
        {
            eprintln!("study: {name}: reusing {}", ckpt.display());
            let secs: f64 = secs.trim().parse().unwrap_or(f64::NAN);
            if secs.is_finite() {
                self.reused_seconds.set(self.reused_seconds.get() + secs);
            }
            return Ok((ckpt, secs));
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let ad = self.device.clone().autodiff();
        ad.seed(train.seed);
        let model = config.init(&ad).map_err(|e| format!("{name}: {e}"))?;
        eprintln!(
            "study: training {name} ({} steps of {} x {} tokens)",
            train.steps, train.batch, train.tgt_len
        );
        let start = Instant::now();
        let options = RunOptions {
            run_dir: dir.clone(),
            resume: false,
            quiet: true,
        };
        let out = memzoo_train::train(model, train, data, None, &options)
            .map_err(|e| format!("training {name}: {e}"))?;
        let secs = start.elapsed().as_secs_f64();
        // A run stopped by a signal is not a finished model: no recipe is written for it (a
        // later study trains it again) and the study stops here.
        if out.interrupted || out.steps < train.steps {
            return Err(format!(
                "training {name} stopped at step {} of {}{}: the study stops (run it again to \
                 train this model from the start)",
                out.steps,
                train.steps,
                out.signal
                    .map_or(String::new(), |s| format!(" (signal {s})"))
            ));
        }
        eprintln!(
            "study: {name}: {} steps in {secs:.0}s, last training loss {:.3} nats",
            out.steps,
            out.train_loss.unwrap_or(f64::NAN)
        );
        let ckpt = checkpoint::latest(&dir.join("checkpoints"))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{name}: the run left no checkpoint"))?;
        std::fs::write(&recipe_file, &recipe).map_err(|e| e.to_string())?;
        std::fs::write(&done, format!("{secs:.1}")).map_err(|e| e.to_string())?;
        Ok((ckpt, secs))
    }

    /// Trains (or reuses) one code model; returns its checkpoint and training seconds.
    fn code_model(&mut self, kind: CodeModel) -> Result<(PathBuf, f64), String> {
        let config = self.code_config(kind);
        let s = self.scale.clone();
        let steps = match (self.corpus, kind) {
            (Corpus::Books, _) => s.steps_books,
            (
                _,
                CodeModel::Xl
                | CodeModel::XlNoRecurrence
                | CodeModel::Vanilla
                | CodeModel::XlVaried
                | CodeModel::Compressive
                | CodeModel::CompressiveMostUsed
                | CodeModel::Rmt
                | CodeModel::RmtXl
                | CodeModel::BlockRecurrent,
            ) => s.steps,
            _ => s.steps_memorizing,
        };
        let train = self.train_config(steps, s.batch, s.tgt_len, s.lr);
        let docs = self.data()?.train.clone();
        let mut data =
            DocBatcher::named("the study's train documents", &docs, s.batch, s.tgt_len, 0)
                .map_err(|e| e.to_string())?;
        let name = match self.corpus {
            Corpus::RustCode => kind.name().to_string(),
            Corpus::Books => format!("{}-books", kind.name()),
        };
        self.train_run(&name, &config, &train, &mut data, None)
    }

    /// Trains (or reuses) `kind` on T6's training pieces: pieces of the train documents at
    /// every distance of `copy_distances`, each read twice ([`repeated_pieces`]), for
    /// `copy_steps` steps. Half of what it reads can be copied from `d` bytes back, so a
    /// model whose memory reaches `d` has every reason to learn to copy.
    fn copy_model(&mut self, kind: CodeModel) -> Result<(PathBuf, f64), String> {
        let config = self.code_config(kind);
        let s = self.scale.clone();
        let train = self.train_config(s.copy_steps, s.batch, s.tgt_len, s.lr);
        let docs = self.data()?.train.clone();
        let mut pieces = Vec::new();
        for &d in &s.copy_distances {
            // Each distance gets the same number of tokens, read in turn.
            let budget = s.train_bytes / s.copy_distances.len();
            pieces.push(repeated_pieces(&docs, d, budget)?.0);
        }
        // Interleaved so that every distance has had the same share of tokens at any point
        // of training: the next piece comes from the distance read least so far.
        let mut mixed = Vec::new();
        let mut read = vec![0usize; pieces.len()];
        let mut next = vec![0usize; pieces.len()];
        while let Some(k) = (0..pieces.len())
            .filter(|&k| next[k] < pieces[k].len())
            .min_by_key(|&k| read[k])
        {
            let piece = &pieces[k][next[k]];
            read[k] += piece.len();
            next[k] += 1;
            mixed.push(piece.clone());
        }
        let mut data = DocBatcher::named("the study's train pieces", &mixed, s.batch, s.tgt_len, 0)
            .map_err(|e| e.to_string())?;
        let recipe = json!({"pieces_read_twice": s.copy_distances, "interleaved": "by tokens"});
        self.train_run(
            &format!("{}-copy", kind.name()),
            &config,
            &train,
            &mut data,
            Some(recipe),
        )
    }

    /// A code model's weights in `config` (the same parameters, other evaluation settings).
    fn load(&self, ckpt: &Path, config: &XlConfig) -> Result<TransformerXl, String> {
        let model = config.init(&self.device).map_err(|e| e.to_string())?;
        checkpoint::load_model(ckpt, model).map_err(|e| e.to_string())
    }

    /// Test bpc of `model` over the test documents, with the loss on the far targets (see
    /// [`far_mask`] with `reach`).
    fn evaluate_code(&mut self, model: &TransformerXl, reach: usize) -> Result<EvalResult, String> {
        let s = self.scale.clone();
        let test = self.data()?.test.clone();
        // The masks depend on the documents and `reach` only: computed once per reach.
        let masks = self
            .far_masks
            .entry(reach)
            .or_insert_with(|| {
                test.iter()
                    .map(|d| {
                        // Target t of a document is token t + 1.
                        let m = far_mask(d, reach);
                        m[1..].iter().copied().chain([false]).collect()
                    })
                    .collect()
            })
            .clone();
        let rows = s.batch.min(test.len()).max(1);
        let mut data = DocBatcher::named("the study's test documents", &test, rows, s.tgt_len, 0)
            .and_then(|b| b.with_target_masks(&masks))
            .map_err(|e| e.to_string())?;
        evaluate_sharded(model, &mut data, s.tgt_len, None, None).map_err(|e| e.to_string())
    }

    /// One T1/T3 line: the checkpoint read as `config`, scored on the test documents
    /// ([`Study::evaluate_code`]), `fields` and the scores together.
    fn score_code(
        &mut self,
        table: &str,
        ckpt: &Path,
        config: &XlConfig,
        reach: usize,
        train_seconds: f64,
        fields: Value,
    ) -> Result<Value, String> {
        let model = self.load(ckpt, config)?;
        let params = burn::module::Module::num_params(&model);
        let start = Instant::now();
        let r = self.evaluate_code(&model, reach)?;
        let mut v = line(table, fields);
        if let Some(o) = v.as_object_mut() {
            o.extend(
                json!({"test_bpc": r.bpc, "tokens": r.tokens, "params": params,
                       "far_bpc": r.selected_loss.map(|l| l / std::f64::consts::LN_2),
                       "far_tokens": r.selected_tokens, "train_seconds": train_seconds,
                       "eval_seconds": start.elapsed().as_secs_f64()})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            );
        }
        eprintln!("{v}");
        Ok(v)
    }

    // ------------------------------------------------------------------------------------
    // T1

    fn t1(&mut self, table: &str) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let m = s.mem_len;
        let reach = s.tgt_len + m;
        let mems = [0, m / 2, m, 2 * m, 4 * m, 8 * m];
        let mut out = Vec::new();
        let models = match table {
            "t1v" => vec![CodeModel::XlVaried],
            _ => vec![CodeModel::Xl, CodeModel::XlNoRecurrence, CodeModel::Vanilla],
        };
        for kind in models {
            let (ckpt, secs) = self.code_model(kind)?;
            let config = self.code_config(kind);
            let settings: Vec<(usize, bool)> = if kind == CodeModel::Vanilla {
                vec![(0, false)]
            } else {
                mems.iter()
                    .flat_map(|&mem| {
                        // same_length with memory 0 would leave a query no key but itself.
                        if mem == 0 {
                            vec![(0, false)]
                        } else {
                            vec![(mem, false), (mem, true)]
                        }
                    })
                    .collect()
            };
            for (mem, same) in settings {
                let mut c = config.clone().with_mem_len(mem);
                if same {
                    // The paper's evaluation: every query sees `mem` keys, distances clamped
                    // at the training span.
                    let span = s.tgt_len + m.max(config.mem_len);
                    let clamped = c.positions.clone().with_clamp_len(Some(span));
                    c = c.with_same_length(true).with_positions(clamped);
                }
                let v = self.score_code(
                    table,
                    &ckpt,
                    &c,
                    reach,
                    secs,
                    json!({"model": kind.name(), "train_mem": config.mem_len, "eval_mem": mem,
                           "same_length": same}),
                )?;
                out.push(v);
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------------------
    // T2

    fn t2(&mut self) -> Result<Vec<Value>, String> {
        let group = [
            CodeModel::Xl,
            CodeModel::XlNoRecurrence,
            CodeModel::Vanilla,
            CodeModel::KnnCache,
        ];
        let mut runs = Vec::new();
        for kind in group {
            runs.push((kind, self.code_model(kind)?.0));
        }
        self.recl_group("t2", &runs)
    }

    /// RECL of `group` on the test documents (one baseline: the group's best at each context),
    /// at r = 0.1, 0.5 and 1.0, and each model's bpc against the context: `table`'s lines.
    fn recl_group(
        &mut self,
        table: &str,
        group: &[(CodeModel, PathBuf)],
    ) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let contexts: Vec<usize> = (0..=s.recl_max_context / s.tgt_len)
            .map(|k| k * s.tgt_len)
            .collect();
        let docs = self.data()?.test.clone();
        let lens: Vec<usize> = docs.iter().map(Vec::len).collect();
        let blocks = recl::probe_blocks(
            &lens,
            s.tgt_len,
            s.recl_max_context,
            4 * s.tgt_len,
            s.recl_blocks,
        );
        if blocks.is_empty() {
            return Err(format!(
                "no test document is longer than the largest RECL context {}",
                s.recl_max_context
            ));
        }
        let mut tables = Vec::new();
        for (kind, ckpt) in group {
            let kind = *kind;
            let best = best_t1_memory(&read_lines(&self.out.join("study.jsonl")), kind.name());
            let config = eval_config_for_recl(&self.code_config(kind), best, &s);
            eprintln!(
                "study: {table} {} reads with XL memory {}",
                kind.name(),
                config.mem_len
            );
            let model = self.load(ckpt, &config)?;
            let start = Instant::now();
            let t = recl::context_losses(&model, &docs, &blocks, s.tgt_len, &contexts, 8)
                .map_err(|e| format!("{}: {e}", kind.name()))?;
            eprintln!(
                "study: {table} {}: losses at {} contexts x {} tokens in {:.0}s",
                kind.name(),
                contexts.len(),
                blocks.len() * s.tgt_len,
                start.elapsed().as_secs_f64()
            );
            tables.push(t);
        }
        let mut out = Vec::new();
        for ((kind, _), t) in group.iter().zip(&tables) {
            let bpc: Vec<f64> = t
                .mean_losses()
                .iter()
                .map(|l| l / std::f64::consts::LN_2)
                .collect();
            out.push(line(
                table,
                json!({"kind": "curve", "model": kind.name(), "contexts": contexts, "bpc": bpc}),
            ));
        }
        for r in [0.1, 0.5, 1.0] {
            let res = recl::recl(&tables, r, 0.01).map_err(|e| e.to_string())?;
            for ((kind, _), x) in group.iter().zip(res) {
                let v = line(
                    table,
                    json!({"kind": "recl", "model": kind.name(), "r": r, "recl": x.recl,
                           "at_least": x.at_least, "gains": x.gains,
                           "tokens": blocks.len() * s.tgt_len}),
                );
                eprintln!("{v}");
                out.push(v);
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------------------
    // T7

    /// Every memory of the stack on the same documents with T1's recipe: the XL memory, the
    /// compressed memory, memory tokens and a recurrent state, beside the XL without
    /// recurrence; each one's test bpc (and far bpc) as trained, its training time, and RECL
    /// across the group: which memory reaches furthest, for what cost.
    fn t7(&mut self) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let reach = s.tgt_len + s.mem_len;
        let group = [
            CodeModel::XlNoRecurrence,
            CodeModel::Xl,
            CodeModel::Compressive,
            CodeModel::CompressiveMostUsed,
            CodeModel::Rmt,
            CodeModel::RmtXl,
            CodeModel::BlockRecurrent,
        ];
        let mut out = Vec::new();
        let mut runs = Vec::new();
        for kind in group {
            let (ckpt, secs) = self.code_model(kind)?;
            runs.push((kind, ckpt.clone()));
            let config = self.code_config(kind);
            let v = self.score_code(
                "t7",
                &ckpt,
                &config,
                reach,
                secs,
                json!({"kind": "score", "model": kind.name()}),
            )?;
            out.push(v);
        }
        out.extend(self.recl_group("t7", &runs)?);
        Ok(out)
    }

    // ------------------------------------------------------------------------------------
    // T3

    fn t3(&mut self) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let reach = s.tgt_len + s.mem_len;
        let mut out = Vec::new();
        for (kind, cache) in [
            (CodeModel::TFiveCache, true),
            (CodeModel::TFiveNone, false),
            (CodeModel::KnnCache, true),
            (CodeModel::KnnNone, false),
        ] {
            let (ckpt, secs) = self.code_model(kind)?;
            let config = self.code_config(kind);
            let knn = matches!(kind, CodeModel::KnnCache | CodeModel::KnnNone);
            let sizes: Vec<usize> = if knn { s.knn_eval.clone() } else { vec![0] };
            for size in sizes {
                let c = if knn {
                    let k = config.knn.clone().with_max_memories(size);
                    config.clone().with_knn(k)
                } else {
                    config.clone()
                };
                let v = self.score_code(
                    "t3",
                    &ckpt,
                    &c,
                    reach,
                    secs,
                    json!({"model": kind.name(), "xl_cache": cache,
                           "knn_train": knn.then_some(s.knn_train), "knn_eval": size}),
                )?;
                out.push(v);
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------------------
    // T4

    /// The duplication model: a one-layer shared-QK Reformer, LSH with `rounds` rounds, or
    /// full attention (`rounds` 0: local attention with one chunk covering the sequence).
    fn dup_config(&self, rounds: usize) -> XlConfig {
        let len = self.scale.dup_len;
        let base = memzoo_stack::ReformerConfig::new()
            .with_n_layers(1)
            .with_d_model(if self.quick { 32 } else { 128 })
            .with_n_heads(2)
            .with_d_head(if self.quick { 16 } else { 64 })
            .with_d_ff(if self.quick { 64 } else { 256 })
            .with_vocab_size(16)
            .with_lsh(LshConfig::new().with_chunk_len(4))
            .with_dropout(0.0)
            // One layer must find the symbol len/2 back by its position: with no position
            // embedding it trains at chance (ln 15 nats), as a first run here did.
            .with_axial_positions(true);
        with_rounds(base, rounds, len)
    }

    fn t4(&mut self) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let mut out = Vec::new();
        let batch = 16;
        for train_rounds in [0, 1, 2, 4] {
            let config = self.dup_config(train_rounds);
            let train = TrainConfig::sized(s.dup_steps, batch, s.dup_len)
                .with_schedule(ScheduleConfig::cosine(1e-3, 0, 1.0))
                .with_adam(AdamConfig::new().with_epsilon(1e-5))
                .with_weight_decay(0.0)
                .with_clip_norm(None)
                .with_seed(self.seed)
                .with_log_every((s.dup_steps / 10).max(1))
                .with_eval_every(0)
                .with_checkpoint_every(0)
                .with_keep_checkpoints(1);
            let mut data = TaskStream::endless(
                Duplication::new(batch, s.dup_len, 16, self.seed).map_err(|e| e.to_string())?,
            );
            let name = format!("dup-{}", rounds_name(train_rounds));
            let (ckpt, secs) = self.train_run(&name, &config, &train, &mut data, None)?;
            for eval_rounds in [0, 1, 2, 4, 8] {
                // One draw of rotations swings a one-layer model with 8 buckets by tens of
                // points: LSH is evaluated with several rotation seeds, and their mean reported.
                let draws = if eval_rounds == 0 {
                    1
                } else {
                    s.dup_eval_seeds
                };
                let mut accuracies = Vec::new();
                for draw in 0..draws as u64 {
                    let mut c = self.dup_config(eval_rounds);
                    c.lsh.seed = c.lsh.seed.wrapping_add(draw);
                    let model = self.load(&ckpt, &c)?;
                    let model = model.with_eval_rounds(eval_rounds.max(1));
                    let mut valid = TaskStream::limited(
                        Duplication::new(batch, s.dup_len, 16, !self.seed)
                            .map_err(|e| e.to_string())?,
                        s.dup_eval_batches,
                    )
                    .map_err(|e| e.to_string())?;
                    let r = evaluate_sharded(&model, &mut valid, s.dup_len, None, None)
                        .map_err(|e| e.to_string())?;
                    accuracies.push(r.selected_accuracy.unwrap_or(f64::NAN));
                }
                let mean = accuracies.iter().sum::<f64>() / accuracies.len() as f64;
                let v = line(
                    "t4",
                    json!({"train": rounds_name(train_rounds), "eval": rounds_name(eval_rounds),
                           "accuracy": mean, "accuracy_per_seed": accuracies,
                           "sequences": s.dup_eval_batches * batch, "len": s.dup_len,
                           "steps": s.dup_steps, "train_seconds": secs}),
                );
                eprintln!("{v}");
                out.push(v);
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------------------
    // T5

    /// The T5 Reformer on code: 2 layers, d_model 128, LSH with `rounds` rounds over buckets
    /// of 32, or full attention (`rounds` 0).
    fn lsh_config(&self, rounds: usize, len: usize) -> XlConfig {
        let s = &self.scale;
        let base = memzoo_stack::ReformerConfig::new()
            .with_n_layers(2)
            .with_d_model(s.d_model)
            .with_n_heads(s.n_heads)
            .with_d_head(s.d_model / s.n_heads)
            .with_d_ff(s.d_inner)
            .with_vocab_size(256)
            .with_lsh(LshConfig::new().with_chunk_len(32))
            .with_dropout(0.0);
        with_rounds(base, rounds, len)
    }

    fn t5(&mut self) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let mut out = Vec::new();
        let batch = 4;
        let train_docs = self.data()?.train.clone();
        let test_docs = self.data()?.test.clone();
        for rounds in [0, 1, 2, 4, 8] {
            let config = self.lsh_config(rounds, s.lsh_len);
            let train = self.train_config(s.lsh_steps, batch, s.lsh_len, s.lr);
            let mut data = DocBatcher::named(
                "the study's train documents",
                &train_docs,
                batch,
                s.lsh_len,
                0,
            )
            .map_err(|e| e.to_string())?;
            let name = format!("lsh-{}", rounds_name(rounds));
            let (ckpt, secs) = self.train_run(&name, &config, &train, &mut data, None)?;
            let model = self.load(&ckpt, &config)?;
            let rows = batch.min(test_docs.len()).max(1);
            let mut test =
                DocBatcher::named("the study's test documents", &test_docs, rows, s.lsh_len, 0)
                    .map_err(|e| e.to_string())?;
            let r = evaluate_sharded(&model, &mut test, s.lsh_len, None, None)
                .map_err(|e| e.to_string())?;
            let v = line(
                "t5",
                json!({"kind": "quality", "attention": rounds_name(rounds), "steps": s.lsh_steps,
                       "len": s.lsh_len, "test_bpc": r.bpc, "tokens": r.tokens,
                       "train_seconds": secs}),
            );
            eprintln!("{v}");
            out.push(v);
        }
        // Time per training step against length: full attention and LSH-4 (batch 1).
        for &len in &s.timing_lengths {
            for rounds in [0, 4] {
                let config = self.lsh_config(rounds, len);
                let secs =
                    time_train_step(&config, &self.device, len, if self.quick { 1 } else { 3 })?;
                let v = line(
                    "t5",
                    json!({"kind": "time", "attention": rounds_name(rounds), "len": len,
                           "step_seconds": secs}),
                );
                eprintln!("{v}");
                out.push(v);
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------------------
    // T6

    /// Copying at a distance: pieces of the test documents read twice in a row
    /// ([`repeated_pieces`]); the drop in bpc from the first reading to the second is what a
    /// model copies from `d` bytes back. Each code model reads with the memory it trained
    /// with: the XL cache of `M`, the kNN memory of `knn_train` pairs.
    ///
    /// `t6` (`trained_to_copy` false) reads T1's and T3's models and the `--copy-run` runs;
    /// `t6b` (true) trains and reads the mechanism check: the XL and the Memorizing stacks
    /// trained on pieces read twice.
    fn t6(&mut self, trained_to_copy: bool) -> Result<Vec<Value>, String> {
        let s = self.scale.clone();
        let test = self.data()?.test.clone();
        let mut out = Vec::new();
        let kinds: &[CodeModel] = if trained_to_copy {
            &[CodeModel::Xl, CodeModel::KnnCache, CodeModel::KnnXl]
        } else {
            &[
                CodeModel::Xl,
                CodeModel::XlNoRecurrence,
                CodeModel::Vanilla,
                CodeModel::TFiveCache,
                CodeModel::KnnCache,
                CodeModel::KnnNone,
            ]
        };
        let table = if trained_to_copy { "t6b" } else { "t6" };
        let copy_runs = if trained_to_copy {
            Vec::new()
        } else {
            self.copy_runs.clone()
        };
        let mut models = Vec::new();
        for &kind in kinds {
            let (ckpt, secs) = if trained_to_copy {
                self.copy_model(kind)?
            } else {
                self.code_model(kind)?
            };
            let name = if trained_to_copy {
                format!("{}-copy", kind.name())
            } else {
                kind.name().to_string()
            };
            models.push((name, trained_to_copy, self.code_config(kind), ckpt, secs));
        }
        for path in &copy_runs {
            let (name, config, ckpt) = external_run(path)?;
            models.push((name, false, config, ckpt, f64::NAN));
        }
        let external = models.len() - copy_runs.len();
        let reach = s.tgt_len + s.mem_len;
        for (i, (name, trained_to_copy, config, ckpt, secs)) in models.into_iter().enumerate() {
            let is_external = i >= external;
            let model_start = Instant::now();
            // A kNN model reads with the memory it trained with, and beside it the same weights
            // with the kNN memory cut to `KNN_CUT` pairs (no further back than the XL memory):
            // what the kNN memory itself carries. A `--copy-run` also with T3's memory sizes.
            let trained = config.knn.max_memories;
            let sizes: Vec<Option<usize>> = if !config.layer_kinds().contains(&LayerKind::Knn) {
                vec![None]
            } else {
                let mut v = vec![Some(trained)];
                if trained > KNN_CUT {
                    v.push(Some(KNN_CUT));
                }
                if is_external {
                    // A user's run is also read with every memory size of T3 (Table 5:
                    // larger memories at evaluation without retraining).
                    for &m in &s.knn_eval {
                        if !v.contains(&Some(m)) {
                            v.push(Some(m));
                        }
                    }
                }
                v
            };
            for size in sizes {
                let mut config = config.clone();
                let mut label = name.clone();
                if let Some(m) = size {
                    config = config
                        .clone()
                        .with_knn(config.knn.clone().with_max_memories(m));
                    if m != trained {
                        label = format!("{name}, kNN memory {m}");
                    }
                }
                let model = self.load(&ckpt, &config)?;
                // What the kNN layers' gates learnt: g = sigmoid(b_g) per head, the share of a
                // head's output taken from the retrieved pairs (0.5 at initialisation).
                let gates: Vec<Vec<f32>> = model
                    .knn_attentions()
                    .map(|a| {
                        burn::tensor::activation::sigmoid(a.gate.val())
                            .into_data()
                            .try_to_vec::<f32>()
                            .unwrap_or_default()
                    })
                    .collect();
                // A user's run is also scored on the test documents as they are (the study's
                // own models are in T1 and T3).
                let test_bpc = if is_external {
                    Some(self.evaluate_code(&model, reach)?.bpc)
                } else {
                    None
                };
                for &d in &s.copy_distances {
                    let (docs, masks) = repeated_pieces(&test, d, s.copy_tokens)?;
                    let start = Instant::now();
                    let rows = s.batch.min(docs.len());
                    let mut data =
                        DocBatcher::named("the study's repeated pieces", &docs, rows, s.tgt_len, 0)
                            .and_then(|b| b.with_target_masks(&masks))
                            .map_err(|e| e.to_string())?;
                    let r = evaluate_sharded(&model, &mut data, s.tgt_len, None, None)
                        .map_err(|e| e.to_string())?;
                    let (first, second) = readings(&r);
                    let ln2 = std::f64::consts::LN_2;
                    let v = line(
                        table,
                        json!({"model": label, "run": name, "external": is_external,
                               "trained_to_copy": trained_to_copy,
                               "distance": d, "pieces": docs.len(),
                               "xl_mem": config.mem_len, "knn_memory": size,
                               "knn_gates": gates, "test_bpc": test_bpc,
                               "first_bpc": first / ln2, "second_bpc": second / ln2,
                               "second_tokens": r.selected_tokens, "train_seconds": secs,
                               "eval_seconds": start.elapsed().as_secs_f64()}),
                    );
                    eprintln!("{v}");
                    out.push(v);
                }
            }
            if is_external {
                self.external_seconds += model_start.elapsed().as_secs_f64();
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------------------------------

    /// Runs `tables`, then writes the JSON lines, charts and report.
    pub fn run(&mut self, tables: &[String]) -> Result<(), String> {
        std::fs::create_dir_all(&self.out).map_err(|e| format!("{}: {e}", self.out.display()))?;
        let jsonl = self.out.join("study.jsonl");
        let mut lines: Vec<Value> = read_lines(&jsonl);
        for table in tables {
            let start = Instant::now();
            self.reused_seconds.set(0.0);
            self.external_seconds = 0.0;
            let mut book_names = None;
            let new = match table.as_str() {
                "t1" => self.t1("t1")?,
                // T1 on a book: the same models and evaluation on the book's documents.
                "t1b" => {
                    self.set_corpus(Corpus::Books);
                    let r = self.t1("t1b");
                    let names = self
                        .data
                        .as_ref()
                        .map(|d| (d.train_names.len(), d.test_names.clone()));
                    self.set_corpus(Corpus::RustCode);
                    book_names = names;
                    r?
                }
                "t1v" => self.t1("t1v")?,
                "t2" => self.t2()?,
                "t3" => self.t3()?,
                "t4" => self.t4()?,
                "t5" => self.t5()?,
                "t6" => self.t6(false)?,
                "t6b" => self.t6(true)?,
                "t7" => self.t7()?,
                other => {
                    return Err(format!(
                        "unknown table `{other}`: expected {}",
                        TABLES.join(", ")
                    ));
                }
            };
            eprintln!("study: {table} took {:.0}s", start.elapsed().as_secs_f64());
            lines.retain(|l| l["table"] != table.as_str());
            let mut meta = line(
                table,
                json!({"kind": "meta", "scale": self.scale, "seed": self.seed,
                       "quick": self.quick, "seconds": start.elapsed().as_secs_f64(),
                       "reused_train_seconds": self.reused_seconds.get(),
                       "copy_run_seconds": self.external_seconds,
                       "reads_other_tables_models": READER_TABLES.contains(&table.as_str()),
                       "machine": machine(), "date": today(),
                       "train_crates": book_names.as_ref().map(|b| b.0)
                           .or_else(|| self.data.as_ref().map(|d| d.train_names.len())),
                       "test_crates": book_names.map(|b| b.1)
                           .or_else(|| self.data.as_ref().map(|d| d.test_names.clone()))}),
            );
            if let Some(o) = meta.as_object_mut() {
                o.insert("kind".into(), "meta".into());
            }
            lines.push(meta);
            lines.extend(new);
            // Written after every table, so a long study keeps what it has measured.
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            std::fs::write(&jsonl, text).map_err(|e| format!("{}: {e}", jsonl.display()))?;
            self.write_report(&lines)?;
        }
        eprintln!(
            "study: {} and {} written",
            jsonl.display(),
            self.report.display()
        );
        Ok(())
    }

    fn write_report(&self, lines: &[Value]) -> Result<(), String> {
        let charts = crate::study_report::charts(lines);
        for (file, svg) in &charts {
            let path = self.out.join(file);
            std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let rel = relative_dir(&self.report, &self.out);
        let md = crate::study_report::markdown(lines, &rel);
        std::fs::write(&self.report, md).map_err(|e| format!("{}: {e}", self.report.display()))
    }
}

/// `base` (a Reformer stack) with full attention: LSH layers whose one chunk covers the `len`
/// positions (one round, no look-back), so every query scores every earlier key — full
/// shared-QK attention, the Reformer paper's baseline, with the LSH model's parameters (a
/// model trained one way is evaluated the other with the same weights).
fn full_attention(base: XlConfig, len: usize) -> XlConfig {
    let lsh = base
        .lsh
        .clone()
        .with_chunk_len(len)
        .with_n_rounds(1)
        .with_n_buckets(Some(2))
        .with_n_chunks_before(0)
        .with_n_chunks_after(0);
    base.with_lsh(lsh)
}

/// The stack of the Reformer `base` over sequences of `len`: LSH with `rounds` hash rounds, or
/// full attention for `rounds` 0 ([`full_attention`]).
fn with_rounds(base: memzoo_stack::ReformerConfig, rounds: usize, len: usize) -> XlConfig {
    let lsh = base.lsh.clone().with_n_rounds(rounds.max(1));
    let stack = base.with_max_seq_len(len).with_lsh(lsh).stack();
    if rounds == 0 {
        full_attention(stack, len)
    } else {
        stack
    }
}

fn rounds_name(rounds: usize) -> String {
    if rounds == 0 {
        "full".into()
    } else {
        format!("lsh-{rounds}")
    }
}

/// The evaluation settings of a code model in T2: each model with an XL memory reads with the
/// memory that served it best in T1 (`best_mem`: the lowest test bpc without `same_length`;
/// else its training memory), distances clamped at the training span; the rest as trained.
fn eval_config_for_recl(config: &XlConfig, best_mem: Option<usize>, s: &Scale) -> XlConfig {
    let kinds = config.layer_kinds();
    match best_mem {
        Some(m) if kinds.iter().all(|k| *k == LayerKind::Xl) => {
            let clamped = config
                .positions
                .clone()
                .with_clamp_len(Some(s.tgt_len + s.mem_len));
            config.clone().with_mem_len(m).with_positions(clamped)
        }
        _ => config.clone(),
    }
}

/// The evaluation memory with the lowest T1 test bpc of `model` (without `same_length`), from
/// the study's earlier lines.
fn best_t1_memory(lines: &[Value], model: &str) -> Option<usize> {
    lines
        .iter()
        .filter(|l| l["table"] == "t1" && l["model"] == model && l["same_length"] == false)
        .filter_map(|l| Some((l["eval_mem"].as_u64()? as usize, l["test_bpc"].as_f64()?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(m, _)| m)
}

/// Seconds per training step (forward + backward, batch 1) of `config` at `len`, the median
/// of `n` after one warm-up step.
fn time_train_step(
    config: &XlConfig,
    device: &Device,
    len: usize,
    n: usize,
) -> Result<f64, String> {
    let ad = device.clone().autodiff();
    ad.seed(0);
    let model = config.init(&ad).map_err(|e| e.to_string())?;
    let data: Vec<i64> = (0..len as i64).map(|i| (i * 7919 + 13) % 251).collect();
    let x = || Tensor::<2, Int>::from_data(TensorData::new(data.clone(), [1, len]), &ad);
    let mut times = Vec::new();
    for i in 0..=n {
        let mut state = Default::default();
        let start = Instant::now();
        let (_, grads) = RecurrentModel::train_step(&model, x(), x(), &mut state, &[false], None)
            .map_err(|e| e.to_string())?;
        drop(grads);
        if i > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `out` as seen from the report's folder (for links to the charts).
fn relative_dir(report: &Path, out: &Path) -> String {
    let base = report.parent().unwrap_or(Path::new(""));
    match out.strip_prefix(base) {
        Ok(p) if p.as_os_str().is_empty() => ".".into(),
        Ok(p) => p.display().to_string(),
        Err(_) => out.display().to_string(),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The CPU model and whether it has AVX-512 (from /proc/cpuinfo).
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let avx512 = info.contains("avx512f");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{model}, {cores} threads, {}AVX-512",
        if avx512 { "" } else { "no " }
    )
}

fn today() -> String {
    std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `cargo xtask study`.
pub fn run(args: &StudyArgs) -> Result<(), String> {
    // Before the first rayon use: Burn's flex backend sizes its pool from it.
    // SAFETY: single-threaded at this point.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string()) };
    run_tables(args)
}

/// The study's tables as `args` asks (the thread count left as it is).
pub fn run_tables(args: &StudyArgs) -> Result<(), String> {
    let tables: Vec<String> = match &args.table {
        Some(t) => t.iter().map(|s| s.trim().to_lowercase()).collect(),
        None => DEFAULT_TABLES.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(bad) = tables.iter().find(|t| !TABLES.contains(&t.as_str())) {
        return Err(format!(
            "unknown table `{bad}` in --table: expected {}",
            TABLES.join(", ")
        ));
    }
    let mut study = Study::new(args)?;
    if args.report_only {
        let lines = read_lines(&study.out.join("study.jsonl"));
        if lines.is_empty() {
            return Err(format!(
                "--report-only: {} holds no results; run the study first",
                study.out.join("study.jsonl").display()
            ));
        }
        return study.write_report(&lines);
    }
    study.run(&tables)
}

/// Whether a run's stored recipe is `recipe`: equal as written, or equal once the fields added
/// since it was written are filled in, each only where `recipe` holds that field's default
/// (every new option defaults to the behaviour before it, so such a recipe is the one the run
/// was trained with).
pub(crate) fn same_recipe(stored: &str, recipe: &str) -> bool {
    if stored == recipe {
        return true;
    }
    let (Ok(mut old), Ok(new)) = (
        serde_json::from_str::<Value>(stored),
        serde_json::from_str::<Value>(recipe),
    ) else {
        return false;
    };
    let defaults = json!({
        "model": XlConfig::new(),
        "train": TrainConfig::new(),
    });
    fill_defaults(&mut old, &new, &defaults) && old == new
}

/// Fills into `old` every field of `new` it lacks, where `new` holds the field's value in
/// `default` (an optional section's defaults are its config's `new()`); false when a missing
/// field holds anything else.
fn fill_defaults(old: &mut Value, new: &Value, default: &Value) -> bool {
    let (Some(old), Some(new)) = (old.as_object_mut(), new.as_object()) else {
        return true;
    };
    for (key, value) in new {
        let section = match (default.get(key), key.as_str()) {
            (Some(Value::Null) | None, "rmt") => json!(memzoo_stack::RmtConfig::new()),
            (Some(Value::Null) | None, "compressive") => {
                json!(memzoo_stack::CompressiveConfig::new())
            }
            (Some(Value::Null) | None, "block_recurrent") => {
                json!(memzoo_stack::BlockRecurrentConfig::new())
            }
            (Some(d), _) => d.clone(),
            (None, _) => Value::Null,
        };
        match old.get_mut(key) {
            Some(o) => {
                if !fill_defaults(o, value, &section) {
                    return false;
                }
            }
            None if default.get(key) == Some(value) => {
                old.insert(key.clone(), value.clone());
            }
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T1B's book: the test split is the 5% before the last 5% (as `memzoo train --data FILE`
    /// splits), the train split all before it, each cut into `batch` contiguous parts that
    /// join back into the split's bytes.
    #[test]
    fn a_book_is_cut_into_one_document_per_row() {
        let dir = std::env::temp_dir().join(format!("memzoo-book-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("book.txt");
        let text: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        let scale = Scale {
            batch: 3,
            ..Scale::quick()
        };
        let book = CodeData::book(&path, &scale, false).unwrap();
        let join =
            |docs: &[Vec<Token>]| -> Vec<u8> { docs.iter().flatten().map(|&t| t as u8).collect() };
        // 1000 bytes: test 900..950, validation (unused) 950..1000, train 0..900.
        assert_eq!(join(&book.test), text[900..950]);
        assert_eq!(join(&book.train), text[..900]);
        assert_eq!((book.train.len(), book.test.len()), (3, 3));
        assert!(book.train.iter().all(|d| d.len() == 300));
        assert_eq!(book.test_names[0], "book.txt test 1/3");
        let Err(missing) = CodeData::book(&dir.join("none.txt"), &scale, false) else {
            panic!("a missing book was read");
        };
        assert!(
            missing.contains("none.txt") && missing.contains("--books"),
            "{missing}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// T6's pieces: cut in turn from the documents, doubled, the second reading's targets
    /// selected; checked against the documents' bytes directly.
    #[test]
    fn repeated_pieces_read_each_piece_twice() {
        let a: Vec<Token> = (0..10).collect();
        let b: Vec<Token> = (100..107).collect();
        let (docs, masks) = repeated_pieces(&[a, b], 3, 30).unwrap();
        // a gives 3 pieces, b 2, taken in turn: a0 b0 a1 b1 a2, 6 tokens each, 30 in all.
        let want: [[Token; 3]; 5] = [
            [0, 1, 2],
            [100, 101, 102],
            [3, 4, 5],
            [103, 104, 105],
            [6, 7, 8],
        ];
        assert_eq!(docs.len(), 5);
        for (doc, w) in docs.iter().zip(want) {
            assert_eq!(&doc[..3], &w);
            assert_eq!(&doc[3..], &w);
        }
        // Target t predicts token t + 1: the second reading is tokens 3..6, targets 2..5.
        for m in &masks {
            assert_eq!(m, &[false, false, true, true, true, false]);
        }
        assert_eq!(
            repeated_pieces(&[vec![1, 2]], 3, 30).unwrap_err(),
            "no test document holds a piece of 3 tokens"
        );
        assert_eq!(
            repeated_pieces(&docs, 3, 12).unwrap().0.len(),
            2,
            "the budget stops it"
        );
    }

    /// The two readings' losses recovered from the mean and the selected mean, against sums
    /// written out here: first reading 3 targets of loss 1, 2, 3; second 2 of loss 0.5, 1.5.
    #[test]
    fn readings_split_the_mean_by_the_mask() {
        let r = EvalResult {
            loss: (1.0 + 2.0 + 3.0 + 0.5 + 1.5) / 5.0,
            bpc: 0.0,
            ppl: 0.0,
            tokens: 5,
            selected_loss: Some(1.0),
            selected_tokens: 2,
            selected_accuracy: None,
        };
        let (first, second) = readings(&r);
        assert!((first - 2.0).abs() < 1e-12 && (second - 1.0).abs() < 1e-12);
        let all = EvalResult {
            selected_tokens: 5,
            ..r
        };
        assert!(
            readings(&all).0.is_nan(),
            "no first reading: NaN, not a division by zero"
        );
    }

    /// `--copy-run` names what it cannot read.
    #[test]
    fn external_runs_name_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("memzoo-copy-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = external_run(&dir).unwrap_err();
        assert!(e.contains(&dir.display().to_string()), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--set` changes the named field only and names what it refuses.
    #[test]
    fn scale_sets_change_one_field_and_name_bad_ones() {
        let s = Scale::quick()
            .with_sets(&["dup_steps=7".into(), "knn_eval=[5,6]".into()])
            .unwrap();
        assert_eq!((s.dup_steps, s.knn_eval.clone()), (7, vec![5, 6]));
        assert_eq!(
            Scale {
                dup_steps: 4,
                knn_eval: vec![32, 64, 128],
                ..s
            },
            Scale::quick()
        );
        for (bad, says) in [
            ("dup_steps", "expected FIELD=VALUE"),
            ("nope=1", "no field `nope`"),
            ("dup_steps=x", "`x` is not a JSON value"),
            ("dup_steps=-1", "dup_steps"),
        ] {
            let e = Scale::quick().with_sets(&[bad.into()]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// The far mask against a naive scan written here.
    #[test]
    fn far_mask_marks_repeats_beyond_reach() {
        let text = b"fn alpha() {} fn beta() {} fn alpha() {} fn alpha() {}";
        let doc: Vec<Token> = text.iter().map(|&b| b as Token).collect();
        for reach in [0, 5, 14, 27, 100] {
            let got = far_mask(&doc, reach);
            for p in 0..doc.len() {
                let naive = p >= 7 && {
                    let gram = &doc[p - 7..=p];
                    // The most recent earlier end of the same 8 bytes.
                    (7..p)
                        .rev()
                        .find(|&q| &doc[q - 7..=q] == gram)
                        .is_some_and(|q| p - q > reach)
                };
                assert_eq!(got[p], naive, "reach {reach}, position {p}");
            }
        }
        // "fn alpha() {}" repeats 28 bytes later, then 14.
        let m = far_mask(&doc, 20);
        assert!(m[27 + 8]);
        assert!(!m[41 + 8]);
    }
}
