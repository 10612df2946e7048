//! The `memzoo` command line: train, evaluate and sample from long-context language models.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use memzoo::commands;
use memzoo::config::{ModelKind, Preset, RunConfig};
use memzoo::error::CliError;

#[derive(Parser)]
#[command(
    name = "memzoo",
    version,
    about = "Transformers that remember beyond their context window",
    long_about = "Train, evaluate and sample from long-context language models on any Burn backend.\n\
                  `memzoo train` with no arguments trains a small Transformer-XL on a generated \
                  corpus whose text can only be predicted from far back."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every model command shares.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Device: flex, wgpu[:N|:cpu], wgpu-gl[...], wgpu-vulkan[...], cuda[:N], tch, tch-cuda[:N].
    /// `train` also takes a list of devices of one backend (`cuda:0,cuda:1`): each trains its
    /// share of the batch's rows.
    #[arg(long, default_value = "flex", global = true)]
    pub device: String,
    /// Print one JSON object with the result instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (default: a small Transformer-XL on the generated long-range corpus).
    Train {
        #[command(flatten)]
        common: Common,
        /// TOML file with [model], [train] and [data] sections.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override a config field, e.g. --set model.mem_len=256 (repeatable).
        #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
        sets: Vec<String>,
        /// Model family: its tiny preset (xl-tiny, reformer-tiny, memorizing-tiny).
        #[arg(long, value_enum, conflicts_with = "resume")]
        model: Option<ModelKind>,
        /// A recipe from the papers or memzoo's references: the layer stack in [model] and the
        /// schedule in [train] (--config and --set apply on top; the run's config.toml names
        /// it).
        #[arg(long, value_enum, conflicts_with_all = ["model", "resume"])]
        preset: Option<Preset>,
        /// Data: a text file (.txt, .gz, .zip), a known data set name, or rust-code (after
        /// `memzoo data prepare rust-code`); default: generated. Documents (generated,
        /// rust-code) are read per row with memory resets at each document start.
        #[arg(long)]
        data: Option<String>,
        /// Optimizer steps (same as --set train.steps=N).
        #[arg(long)]
        steps: Option<usize>,
        /// Run directory: config.toml, metrics.jsonl, checkpoints/.
        #[arg(long, default_value = "runs/default")]
        run_dir: PathBuf,
        /// Continue the run in --run-dir from its latest checkpoint.
        #[arg(long, conflicts_with = "overwrite")]
        resume: bool,
        /// Replace the run in --run-dir (its checkpoints, metrics.jsonl and config.toml);
        /// without it, training into a directory that holds a run is refused.
        #[arg(long)]
        overwrite: bool,
        /// No dashboard and no log lines, only the final summary (every metric is in the run's
        /// metrics.jsonl). Without it: the dashboard on a terminal, plain log lines when the
        /// output is piped or redirected.
        #[arg(long)]
        quiet: bool,
    },
    /// Evaluate a run's latest checkpoint over a whole split, memory carried in order.
    Eval {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: commands::EvalArgs,
    },
    /// One self-contained HTML page showing what a run's memory does on a text: per token the
    /// loss with the memory and with the same weights reading none, per layer and head where
    /// the attention went (XL or compressed memory, memory tokens, retrieved kNN pairs,
    /// segment), the retrieved neighbours, LSH buckets (docs/inspect.md).
    Inspect {
        #[command(flatten)]
        common: Common,
        /// The run directory.
        #[arg(long, default_value = "runs/default")]
        run_dir: PathBuf,
        /// The text to read (read as `memzoo eval` reads a split: segments, memory carried).
        #[arg(long)]
        text: PathBuf,
        /// The page to write (default: RUN_DIR/inspect.html).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Read at most this many bytes of the text.
        #[arg(long, default_value_t = 262_144)]
        max_bytes: usize,
        /// A checkpoint directory to read instead of the run's latest.
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// Segment length (default: the run's train.tgt_len).
        #[arg(long)]
        tgt_len: Option<usize>,
        /// XL memory length (default: the run's).
        #[arg(long)]
        mem_len: Option<usize>,
        /// Retrieved neighbours kept per token and head (kNN layers).
        #[arg(long, default_value_t = 3)]
        neighbours: usize,
    },
    /// Sample text from a run's latest checkpoint (any family), carrying its memory across
    /// segments as in training.
    Generate {
        #[command(flatten)]
        common: Common,
        /// The run directory.
        #[arg(long, default_value = "runs/default")]
        run_dir: PathBuf,
        /// Text to continue.
        #[arg(long, default_value = "")]
        prompt: String,
        /// Tokens to generate.
        #[arg(long, default_value_t = 200)]
        tokens: usize,
        /// Sampling temperature (0: greedy).
        #[arg(long, default_value_t = 1.0)]
        temperature: f64,
        /// Sample among the k most likely tokens only.
        #[arg(long)]
        top_k: Option<usize>,
        /// Sample from the smallest set of tokens whose probability reaches p.
        #[arg(long)]
        top_p: Option<f64>,
        /// Seed of the sampler.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Tokens per segment: memory is carried across completed segments, the current one's
        /// tokens are read on top of it as they come (a Reformer reads a window of this
        /// length). Default: the run's train.tgt_len.
        #[arg(long)]
        segment_len: Option<usize>,
        /// Memory length while generating (Transformer-XL runs; with --segment-len 1 and a
        /// memory covering the context, every token is one step over the cached states).
        #[arg(long)]
        mem_len: Option<usize>,
        /// Also time generation by recomputing the whole context for every token.
        #[arg(long)]
        compare_recompute: bool,
    },
    /// Import a checkpoint from the PyTorch world into a new run directory (config.toml and a
    /// step-0 checkpoint that eval, generate and train --resume read).
    Import {
        /// Source format: hf-transfo-xl (an HF TransfoXL directory: config.json and
        /// model.safetensors or pytorch_model.bin) or labml-xl (labml-nn's TransformerXL
        /// state dict: model.safetensors or model.pth, or that file, and an optional
        /// config.json with mem_len), hf-reformer (an HF Reformer directory: config.json,
        /// model.safetensors or pytorch_model.bin, optionally rotations.safetensors) or
        /// lucidrains-reformer (reformer-pytorch's ReformerLM: its state dict and a config.json
        /// of its arguments, optionally rotations.safetensors).
        #[arg(long)]
        from: String,
        /// The checkpoint directory (labml-xl: or the weight file itself), or a Hugging Face
        /// Hub model id (`owner/name`, e.g. transfo-xl/transfo-xl-wt103) where no such path
        /// exists: downloaded into the Hugging Face cache (HF_HUB_CACHE or HF_HOME; HF_ENDPOINT,
        /// HF_TOKEN), or read from it alone with HF_HUB_OFFLINE=1 or --offline.
        src: PathBuf,
        /// The Hub revision (branch, tag or commit) of a Hub model id.
        #[arg(long, default_value = "main")]
        revision: String,
        /// Read a Hub model id from the Hugging Face cache alone, never the network.
        #[arg(long)]
        offline: bool,
        /// The run directory to write.
        #[arg(long)]
        run_dir: PathBuf,
        /// The run's data (a text file or data set name; default: the generated corpus).
        #[arg(long)]
        data: Option<String>,
        /// Replace the run in --run-dir.
        #[arg(long)]
        overwrite: bool,
        /// Print one JSON object with the result instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Export a run's latest checkpoint in a PyTorch-world format.
    Export {
        #[command(flatten)]
        common: Common,
        /// Target format: hf-transfo-xl or hf-reformer (config.json and model.safetensors with
        /// HF's names), labml-xl or lucidrains-reformer (the state-dict names).
        #[arg(long)]
        to: String,
        /// The run directory.
        #[arg(long, default_value = "runs/default")]
        run_dir: PathBuf,
        /// The directory to write.
        out: PathBuf,
    },
    /// Data sets: list, fetch, prepare, stats.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// The Reformer paper's duplication task (`0 w 0 w`): train a 1-layer LSH model and report
    /// copy accuracy evaluated with 1, 2 and 4 hash rounds.
    Duplication {
        #[command(flatten)]
        common: Common,
        /// Hash rounds during training.
        #[arg(long, default_value_t = 4)]
        train_rounds: usize,
        /// Sequence length (2 copies of a (len/2 - 1)-symbol word).
        #[arg(long, default_value_t = 32)]
        len: usize,
        /// Training steps.
        #[arg(long, default_value_t = 2000)]
        steps: usize,
        /// Stop after this many seconds (0: no limit).
        #[arg(long, default_value_t = 0.0)]
        seconds: f64,
    },
    /// The long-range recall comparison: the Memorizing Transformer against the same
    /// Transformer-XL without kNN memory, on passages recalled far beyond the XL memory.
    Recall {
        #[command(flatten)]
        common: Common,
        /// Training steps per model.
        #[arg(long, default_value_t = 6000)]
        steps: usize,
        /// Learning rate (AdamW).
        #[arg(long, default_value_t = 3e-3)]
        lr: f64,
        /// Rows per batch (segments of 32 tokens).
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Which models: both, memorizing or xl.
        #[arg(long, default_value = "both")]
        model: String,
        /// Seed of the data stream and of the weights (the device's generator).
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// How far each run really looks back: the relative effective context length (RECL,
    /// Dai et al. 2019) of a group of runs on the same data, with each run's bpc by context.
    Recl {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        options: memzoo::recl::ReclOptions,
    },
    /// List device strings and which backends this binary has; with `--measure DEVICE`, time
    /// that device's float32 matrix products at the shapes the papers' presets train with;
    /// with `--verify DEVICE`, check its large-shape operations against the host.
    Devices {
        /// A device string (`flex`, `wgpu-vulkan`, `cuda:0`, ...) whose products to time.
        #[arg(long)]
        measure: Option<String>,
        /// Timed products per shape (after one untimed), their median reported.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// A device string whose large-shape operations (sums, top-k, index ranges, the
        /// Reformer's device sort, the kNN device search, past 65,535 elements) to check
        /// against the host; an error when one memzoo's models use is wrong.
        #[arg(long, conflicts_with = "measure")]
        verify: Option<String>,
        /// Print JSON (with `--measure` or `--verify`).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// The known data sets.
    List,
    /// Download a known data set (resumable, checksum-verified).
    Fetch {
        /// Data set name (see `memzoo data list`).
        name: String,
        /// Destination directory.
        #[arg(long, default_value = "data")]
        dir: PathBuf,
        /// Download from this URL instead of the manifest's (a mirror).
        #[arg(long)]
        url: Option<String>,
    },
    /// Load and split a data set or file, and report the split sizes; `rust-code` builds the
    /// Rust code corpus from cargo's registry sources into DIR/rust-code/.
    Prepare {
        /// Data set name, file path, or rust-code.
        source: String,
        /// Where data sets are downloaded.
        #[arg(long, default_value = "data")]
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Statistics of a data set, file or the generated corpus: size, symbols, entropy.
    Stats {
        /// Data set name, file path, `generated`, or `rust-code` (once prepared).
        source: String,
        /// Where data sets are downloaded.
        #[arg(long, default_value = "data")]
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The exit status and the error message, in one place: 0; 128 + the signal's number for a
/// run stopped by a signal (after its checkpoint); [`CliError::exit_code`] for an error, printed
/// on stderr as `error: ...`.
fn main() {
    memzoo::backend::tune_allocator();
    // A cap on the CPU kernels' vector extensions that no kernel knows is a usage error, before
    // any kernel runs (`memzoo_backend::simd`).
    if let Err(e) = memzoo::backend::simd::simd_level_from_env() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(None) => {}
        Ok(Some(signal)) => std::process::exit(128 + signal),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

/// Runs one command; `Some(signal)` when a training run was stopped by that signal.
fn run(command: Command) -> Result<Option<i32>, CliError> {
    match command {
        Command::Train {
            common,
            config,
            sets,
            model,
            preset,
            data,
            steps,
            run_dir,
            resume,
            overwrite,
            quiet,
        } => {
            let mut sets = sets;
            // `--model FAMILY` is that family's tiny preset.
            let preset = preset.or(model.map(Preset::tiny));
            if let Some(d) = data {
                sets.insert(
                    0,
                    format!("data.source={}", serde_json::to_string(&d).unwrap()),
                );
            }
            if let Some(s) = steps {
                sets.push(format!("train.steps={s}"));
            }
            let config = if resume {
                RunConfig::from_run_dir(&run_dir, &sets)
            } else {
                RunConfig::resolve_preset(preset, config.as_deref(), &sets)
            };
            return commands::train(
                &config?,
                &common.device,
                &run_dir,
                resume,
                overwrite,
                quiet,
                common.json,
            );
        }
        Command::Recl { common, options } => {
            memzoo::recl::run(&options, &common.device, common.json)
        }
        Command::Eval { common, args } => {
            commands::eval_with(&args, &common.device, common.json).map(|_| ())
        }
        Command::Inspect {
            common,
            run_dir,
            text,
            out,
            max_bytes,
            checkpoint,
            tgt_len,
            mem_len,
            neighbours,
        } => commands::inspect(
            &commands::InspectArgs {
                run_dir,
                checkpoint,
                text,
                out,
                max_bytes,
                tgt_len,
                mem_len,
                neighbours,
            },
            &common.device,
            common.json,
        )
        .map(|_| ()),
        Command::Generate {
            common,
            run_dir,
            prompt,
            tokens,
            temperature,
            top_k,
            top_p,
            seed,
            segment_len,
            mem_len,
            compare_recompute,
        } => commands::generate(
            &run_dir,
            &common.device,
            &commands::GenerateOptions {
                prompt,
                tokens,
                sampler: memzoo::train::generate::SampleConfig::new()
                    .with_temperature(temperature)
                    .with_top_k(top_k)
                    .with_top_p(top_p)
                    .with_seed(seed),
                segment_len,
                mem_len,
                compare_recompute,
            },
            common.json,
        ),
        Command::Import {
            from,
            src,
            revision,
            offline,
            run_dir,
            data,
            overwrite,
            json,
        } => {
            let src = memzoo::import::source_dir(&src, &revision, offline)?;
            memzoo::import::import(&from, &src, &run_dir, data, overwrite, json)
        }
        Command::Export {
            common,
            to,
            run_dir,
            out,
        } => {
            let device = memzoo::backend::parse_device(&common.device)?;
            memzoo::import::export(&to, &run_dir, &out, &device, common.json)
        }
        Command::Data { command } => match command {
            DataCommand::List => commands::data_list(),
            DataCommand::Fetch { name, dir, url } => commands::data_fetch(&name, &dir, url),
            DataCommand::Prepare { source, dir, json } => {
                commands::data_prepare(&source, &dir, json)
            }
            DataCommand::Stats { source, dir, json } => commands::data_stats(&source, &dir, json),
        },
        Command::Duplication {
            common,
            train_rounds,
            len,
            steps,
            seconds,
        } => commands::duplication(
            &common.device,
            train_rounds,
            len,
            steps,
            seconds,
            common.json,
        ),
        Command::Recall {
            common,
            steps,
            lr,
            batch,
            model,
            seed,
        } => commands::recall(&common.device, &model, steps, lr, batch, seed, common.json),
        Command::Devices {
            measure: Some(device),
            repeats,
            json,
            ..
        } => commands::devices_measure(&device, repeats, json),
        Command::Devices {
            verify: Some(device),
            json,
            ..
        } => commands::devices_verify(&device, json),
        Command::Devices { .. } => {
            for (name, feature) in memzoo::backend::DEVICE_NAMES {
                let spec: memzoo::backend::DeviceSpec = name.parse().expect("known name");
                let state = if spec.is_compiled() {
                    "compiled in"
                } else {
                    "not compiled"
                };
                println!("{name:12} feature `{feature}`: {state}");
            }
            Ok(())
        }
    }
    .map(|()| None)
}
