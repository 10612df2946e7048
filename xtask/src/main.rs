//! memzoo's benchmark harness.
//!
//! ```text
//! cargo xtask bench xl-small [--device flex] [--threads 2] [--quick] [--steps N] [--out FILE]
//! cargo xtask bench models --compare peers.jsonl
//! cargo xtask bench attention generate --quick --out bench/run.jsonl   # + SVG plots in bench/
//! cargo xtask bench memory-crossover            # exact vs HNSW per stored size (MEMZOO_BENCH_*)
//! cargo xtask bench scale [--families xl,memorizing,reformer,generate] [--quick] [--no-peers]
//!     [--index-kinds exact,hnsw,hnsw64]
//!     [--out FILE.jsonl] [--plot DIR]           # cost against memory / store / sequence length
//! cargo xtask bench reformer-step-6-rev-2048-128   # one Reformer step, reversible or plain
//! cargo xtask bench quality [--families xl,reformer,memorizing,compressive,rmt,block-recurrent]
//!     [--steps 400]
//!     [--eval-at 50,100,200,300,400] [--out FILE.jsonl] [--plot DIR] [--no-peers] [--data PATH]
//! cargo xtask study [--table t1,t2,t3,t4,t5] [--quick] [--out DIR]
//! ```
//!
//! Every measurement is printed as one JSON line (and appended to `--out`); a Markdown table
//! summarises the run. `--compare FILE` reads JSON lines of another implementation (same
//! `name` field, e.g. from `../shared/peers/bench_peers.py`) and prints the ratios.
//!
//! `quality` trains memzoo and its PyTorch peers (`xtask/peers/quality.py`, run when the
//! peers' venvs exist) on the same data, config and recipe and writes both learning curves
//! (validation bpc at each `--eval-at` step), a table and one SVG chart per family: see
//! [`quality`].

mod attention;
mod flops;
mod generate;
mod masks;
mod measure;
mod memory;
mod models;
mod plot;
mod quality;
mod scale;
mod study;
mod study_report;
#[cfg(test)]
mod tests;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use measure::Measurement;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "memzoo developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run benchmarks: a suite (`models`) or one config (`xl-small`).
    Bench(BenchArgs),
    /// The papers' claims about memory on real long documents (`docs/study.md`).
    Study(study::StudyArgs),
}

/// Options shared by every benchmark.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Suites (models, attention, memory, generate, masks, quality) or single configs (xl-small,
    /// attention-xl-2048, ...).
    #[arg(required = true)]
    pub targets: Vec<String>,
    /// Device string (flex, wgpu, wgpu-gl, cuda, tch, ...).
    #[arg(long, default_value = "flex")]
    pub device: String,
    /// CPU threads for the flex backend (sets RAYON_NUM_THREADS).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Data-parallel replicas of the model benchmarks (`xl-small`, `memorizing-small*`), each
    /// training on its share of the batch's rows at once; default: as the trainer (one per
    /// thread on flex, 1 elsewhere).
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Fewer steps: a quick look, not a measurement to report.
    #[arg(long)]
    pub quick: bool,
    /// Timed steps (default 20, quick 4); `quality`: training steps (default 400).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Untimed warm-up steps (default 3, quick 1).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Append the JSON lines to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Sequence lengths of the attention suite / context lengths of the generate suite / the
    /// x values of `scale`'s curves (comma-separated), instead of the defaults.
    #[arg(long, value_delimiter = ',')]
    pub lengths: Option<Vec<usize>>,
    /// Write SVG plots of the attention and generate suites into this directory (default:
    /// next to `--out`, when given).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// JSON lines of another implementation to compare with (matched by `name`).
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// `memory` suite: also measure HNSW recall on real attention keys, read from a saved
    /// exact kNN memory (a checkpoint's `knn-0` directory of a `memzoo train --model
    /// memorizing` run).
    #[arg(long)]
    pub real_keys: Option<PathBuf>,
    /// `quality`: the families to train (comma-separated: xl, reformer, memorizing,
    /// compressive, rmt, block-recurrent; default: all six). `scale`: the curves (xl,
    /// memorizing, reformer, generate, or one family's generation curve, `generate-<family>`;
    /// default: xl, memorizing).
    #[arg(long, value_delimiter = ',')]
    pub families: Option<Vec<String>>,
    /// `quality`: the steps at which both sides score the whole validation split
    /// (comma-separated; default: 50, 100, 200, 300, 400 within --steps, and --steps).
    #[arg(long, value_delimiter = ',')]
    pub eval_at: Option<Vec<usize>>,
    /// `quality`, `scale`: memzoo only, no PyTorch peer.
    #[arg(long)]
    pub no_peers: bool,
    /// `scale`'s Memorizing curve: the kNN indexes measured at each store size
    /// (comma-separated: `exact`, `exactf32` / `exactint8` / `exactint8avx2` /
    /// `exactint8avxvnni` (exact search scored that way on the host, the last two with the
    /// AVX2 or AVX-VNNI kernel even where the CPU has AVX-512 VNNI;
    /// `exact`: the default, `auto`), `hnsw` with the expansion chosen by size,
    /// `hnsw<ef>` with a fixed expansion `ef`, e.g. `hnsw32`; default: exact, hnsw, hnsw64).
    #[arg(long, value_delimiter = ',')]
    pub index_kinds: Option<Vec<String>>,
    /// `quality`: the seed of both sides (initialisation, data order, dropout). Default: 0.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `quality`: the text file (default: ../shared/data/tinyshakespeare.txt beside the
    /// workspace).
    #[arg(long)]
    pub data: Option<PathBuf>,
}

impl BenchArgs {
    pub fn steps(&self) -> usize {
        self.steps.unwrap_or(if self.quick { 4 } else { 20 })
    }
    pub fn warmup(&self) -> usize {
        self.warmup.unwrap_or(if self.quick { 1 } else { 3 })
    }
}

fn main() {
    memzoo_backend::tune_allocator();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench(args),
        Command::Study(args) => study::run(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn bench(args: BenchArgs) -> Result<(), String> {
    if args.steps == Some(0) {
        return Err("--steps must be positive, got 0".into());
    }
    if let Some(bad) = args.lengths.iter().flatten().find(|&&l| l == 0) {
        return Err(format!("--lengths must be positive, got {bad}"));
    }
    let simd = measure::check_simd()?;
    if let Some(setting) = measure::simd_setting() {
        eprintln!("bench: MEMZOO_SIMD={simd}: {setting} (the peers capped alike)");
    }
    // Must happen before the first rayon use: Burn's flex backend sizes its pool from it.
    // SAFETY: single-threaded at this point, nothing else reads the environment concurrently.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string()) };
    let device = memzoo_backend::parse_device(&args.device).map_err(|e| e.to_string())?;

    let mut results: Vec<Measurement> = Vec::new();
    for target in &args.targets {
        let configs: Vec<&str> = match target.as_str() {
            "models" => vec![
                "xl-small",
                "xl-small-trainer",
                "reformer-small",
                "memorizing-small",
                "memorizing-small-noknn",
            ],
            "memory-crossover" => {
                for m in memory::crossover(&args, &device)? {
                    emit(&m, args.out.as_ref())?;
                    results.push(m);
                }
                continue;
            }
            "memory" => {
                let mut ms = memory::suite(&args, &device)?;
                if let Some(dir) = &args.real_keys {
                    ms.extend(memory::real_keys(&args, &device, dir)?);
                }
                for m in ms {
                    emit(&m, args.out.as_ref())?;
                    results.push(m);
                }
                continue;
            }
            "attention" => {
                for m in attention::suite(&args)? {
                    emit(&m, args.out.as_ref())?;
                    results.push(m);
                }
                continue;
            }
            "masks" => {
                for m in masks::suite(&args)? {
                    emit(&m, args.out.as_ref())?;
                    results.push(m);
                }
                continue;
            }
            "generate" => {
                for m in generate::suite(&args, &device)? {
                    emit(&m, args.out.as_ref())?;
                    results.push(m);
                }
                continue;
            }
            "quality" => {
                quality::run(&args, &device)?;
                continue;
            }
            "scale" => {
                // The suite prints and appends each point as it comes.
                results.extend(scale::suite(&args, &device)?);
                continue;
            }
            point if point.starts_with("scale-") => {
                for m in scale::point(point, &args, &device)? {
                    emit(&m, args.out.as_ref())?;
                    results.push(m);
                }
                continue;
            }
            other => vec![other],
        };
        for config in configs {
            let m = match config {
                "xl-small" => models::xl_small(&args, &device)?,
                "xl-small-trainer" => models::xl_small_trainer(&args, &device)?,
                "xl-small-eval" => models::xl_small_eval(&args, &device)?,
                "reformer-small" => models::reformer_small(&args, &device)?,
                "memorizing-small" => models::memorizing_small(&args, &device, true, 8192)?,
                "memorizing-small-full" => models::memorizing_small(&args, &device, true, 16384)?,
                "memorizing-small-noknn" => models::memorizing_small(&args, &device, false, 0)?,
                a if a.starts_with("attention-") => attention::one(a, &args, &device)?,
                r if r.starts_with("reformer-step-") => models::reformer_step(r, &args, &device)?,
                other => {
                    return Err(format!(
                        "unknown benchmark `{other}`: expected models, attention, memory, \
                         memory-crossover, \
                         generate, masks, quality, xl-small, xl-small-trainer, xl-small-eval, \
                         reformer-small, reformer-step-<layers>-<rev|plain>-<len>[-<d_model>], \
                         memorizing-small[-full|-noknn] or attention-<full|lsh|xl|knn>-<len>"
                    ));
                }
            };
            emit(&m, args.out.as_ref())?;
            results.push(m);
        }
    }
    if results.is_empty() {
        // Only `quality`, which prints its own table.
        return Ok(());
    }
    println!();
    println!("{}", measure::markdown(&results));
    let plot_dir = args.plot.clone().or_else(|| {
        args.out
            .as_ref()
            .map(|p| p.parent().map(PathBuf::from).unwrap_or_default())
    });
    if let Some(dir) = plot_dir {
        for path in plot::write_plots(&results, &dir)?
            .into_iter()
            .chain(scale::write_plots(&results, &dir)?)
        {
            eprintln!("plot: {}", path.display());
        }
    }
    if let Some(path) = &args.compare {
        let peers = measure::read_jsonl(path)?;
        println!("{}", measure::compare(&results, &peers));
    }
    Ok(())
}

/// Prints one JSON line and appends it to `out`; a run under a SIMD cap says so in a `simd`
/// field ([`measure::simd_setting`]).
pub(crate) fn emit<T: serde::Serialize>(m: &T, out: Option<&PathBuf>) -> Result<(), String> {
    let line = match measure::simd_setting() {
        None => serde_json::to_string(m).map_err(|e| e.to_string())?,
        Some(setting) => {
            let mut value = serde_json::to_value(m).map_err(|e| e.to_string())?;
            if let Some(fields) = value.as_object_mut() {
                fields.insert("simd".into(), setting.into());
            }
            value.to_string()
        }
    };
    println!("{line}");
    if let Some(path) = out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        writeln!(f, "{line}").map_err(|e| e.to_string())?;
    }
    Ok(())
}
