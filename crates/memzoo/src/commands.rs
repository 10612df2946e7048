//! The CLI's commands, as library functions (the binary only parses arguments).

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::Device;
use memzoo_data::{Manifest, RustCodeManifest, Split, TextCodec, rust_code};
use memzoo_stack::{LshConfig, TransformerXl};
use memzoo_train::generate::{
    GenerateConfig, GenerateError, SampleConfig, generate as generate_tokens, generate_recompute,
};
use memzoo_train::{
    RecurrentModel, RunOptions, SegmentModel, SegmentSource, checkpoint, evaluate_sharded, replace,
    train_on_devices,
};
use serde_json::json;

use crate::config::RunConfig;
use crate::data_setup::{batcher, load_corpus};
use crate::error::CliError;

pub(crate) fn device(name: &str) -> Result<Device, CliError> {
    Ok(memzoo_backend::parse_device(name)?)
}

/// What to do instead of starting a run where one is (`memzoo train`).
const TRAIN_ELSEWHERE: &str =
    "continue it with --resume, train into a new --run-dir, or pass --overwrite to replace it";

/// `memzoo train`: a new run in `run_dir` (refused where a run already is, unless
/// `overwrite`, which replaces that run once the new run's config, devices, data and
/// vocabulary have been checked: the old run is set aside until the new one writes its first
/// checkpoint, and put back if it fails before, [`memzoo_train::replace`]), or with
/// `resume` the continuation of the run there. Returns the signal (SIGINT 2, SIGTERM 15) that
/// stopped the run, if one did: it finished its step and wrote a checkpoint first.
pub fn train(
    config: &RunConfig,
    device_name: &str,
    run_dir: &Path,
    resume: bool,
    overwrite: bool,
    quiet: bool,
    json_out: bool,
) -> Result<Option<i32>, CliError> {
    // On data made of documents every family resets memory where a document starts.
    let config = &config.clone().on_data()?;
    config.validate()?;
    check_machine_memory(config)?;
    if resume && overwrite {
        return Err(CliError::Conflict(
            "--resume continues the run in --run-dir and --overwrite replaces it: \
             pass one of them"
                .into(),
        ));
    }
    // A replacement that a process which died left unfinished, finished or undone before
    // anything looks at the run (again under the lock below: another process may die there).
    let what = match resume {
        true => "memzoo train --resume",
        false => "memzoo train",
    };
    if let Some(note) = replace::recover_locked(run_dir, what)? {
        eprintln!("warning: {note}");
    }
    if resume {
        check_steps_left(config, run_dir)?;
    }
    // The run there, to replace once every input below is known to be good (`--overwrite`).
    let replaced = match checkpoint::existing_run(run_dir) {
        Some(found) if !resume => {
            if !overwrite {
                return Err(CliError::RunExists {
                    dir: run_dir.to_path_buf(),
                    found,
                    advice: TRAIN_ELSEWHERE,
                });
            }
            Some(found)
        }
        _ => None,
    };
    // `--device A,B`: the rows of each batch split over the devices (the model on the first).
    let devices = memzoo_backend::parse_device_list(device_name)?
        .iter()
        .map(|spec| Ok(spec.init()?.autodiff()))
        .collect::<Result<Vec<Device>, CliError>>()?;
    devices.iter().for_each(|d| d.seed(config.train.seed));
    let device = devices[0].clone();
    // Bytes, or the run's own tokenizer (words, SentencePiece) when its directory has one: the
    // run resumed, or a new run in a directory where it was put. A run that `--overwrite`
    // replaces takes its tokenizer away with it.
    let codec = match replaced {
        Some(_) => None,
        None => crate::data_setup::run_codec(&config.data, run_dir)?,
    };
    let splits = crate::data_setup::load_splits_with(&config.data, codec)?;
    check_vocab(config, &splits)?;
    let t = &config.train;
    // Data made of documents (the generated corpus, rust-code) are read as documents laid out
    // per row by every family, with the row's memory cleared where its document starts.
    let mut train_data = source(config, &splits, Split::Train, t.tgt_len)?;
    let mut valid_data = source(config, &splits, Split::Valid, t.tgt_len)?;

    // One process per run directory, from here until the run ends (released on any exit).
    let _lock = memzoo_train::lock::RunLock::acquire(run_dir, what)?;
    // A replacement that a process which died left unfinished: finished or undone first.
    if let Some(note) = replace::recover(run_dir)? {
        eprintln!("warning: {note}");
    }
    // Config, machine memory, devices, data and vocabulary are good: only now does the old run
    // go aside (a bad new input leaves it as it was). Looked at again under the lock: another
    // process may have trained there since.
    let mut set_aside = false;
    if !resume && let Some(found) = checkpoint::existing_run(run_dir) {
        if replaced.is_none() {
            return Err(CliError::RunExists {
                dir: run_dir.to_path_buf(),
                found,
                advice: TRAIN_ELSEWHERE,
            });
        }
        set_aside = replace::set_aside(run_dir)?;
        if !json_out {
            println!(
                "--overwrite: the run in {} ({found}) is set aside in {} until the new run \
                 writes its first checkpoint",
                run_dir.display(),
                run_dir.join(replace::REPLACED).display()
            );
        }
    }
    let start = Instant::now();
    let mut without_memory = None;
    let run = (|| -> Result<_, CliError> {
        std::fs::create_dir_all(run_dir).map_err(|e| {
            CliError::io(
                format!("cannot create run directory {}", run_dir.display()),
                e,
            )
        })?;
        if !resume {
            std::fs::write(run_dir.join("config.toml"), config.to_toml()).map_err(|e| {
                CliError::io(
                    format!("cannot write to run directory {}", run_dir.display()),
                    e,
                )
            })?;
        }
        let options = RunOptions {
            run_dir: run_dir.to_path_buf(),
            resume,
            quiet: quiet || json_out,
        };
        if !json_out {
            println!(
                "training {} on {} ({} train tokens) on {device_name}, run dir {}",
                config.family(),
                splits.name,
                splits.train.len(),
                run_dir.display()
            );
        }
        let model = config.model.init(&device)?;
        let o = train_on_devices(
            model,
            t,
            &devices,
            &mut *train_data,
            Some(&mut *valid_data),
            &options,
        )?;
        // On text with recallable positions: the same weights reading no memory, to show what
        // the memory bought (a stack that carries no memory, e.g. the tiny Reformer, has none
        // to compare).
        if o.valid.is_some_and(|v| v.selected_loss.is_some())
            && !o.interrupted
            && o.model.carries_state()
        {
            let no_memory = o.model.clone().with_eval_mem_len(0);
            let r = evaluate_sharded(
                &no_memory,
                &mut *valid_data,
                t.tgt_len,
                t.eval_segments,
                t.replicas,
            )?;
            without_memory = Some(r);
        }
        let outcome = (o.steps, o.valid, o.interrupted, o.signal);
        Ok(outcome)
    })();
    // The new run failed: before its first checkpoint, the old run goes back; after, it was
    // deleted when that checkpoint was written (a no-op without a replacement).
    if set_aside && let Some(note) = replace::recover(run_dir)? {
        eprintln!("{note}");
    }
    let (steps, valid, interrupted, signal) = run?;
    let summary = json!({
        "run_dir": run_dir,
        "steps": steps,
        "interrupted": interrupted,
        "signal": signal,
        "valid": valid,
        "valid_without_memory": without_memory,
        "seconds": start.elapsed().as_secs_f64(),
    });
    if json_out {
        println!("{summary}");
    } else if let Some(v) = valid {
        let saved = match checkpoint::latest(&run_dir.join("checkpoints")) {
            Ok(Some(p)) => format!("checkpoint in {}", p.display()),
            Ok(None) => "no checkpoint written".into(),
            Err(e) => format!("the latest checkpoint cannot be read: {e}"),
        };
        println!(
            "done: {steps} steps, valid loss {:.4} nats, {:.4} bpc ({}s); {saved}",
            v.loss,
            v.bpc,
            start.elapsed().as_secs(),
        );
    }
    if !json_out
        && let (Some(with), Some(without)) = (valid, without_memory)
        && let (Some(w), Some(wo)) = (with.selected_loss, without.selected_loss)
    {
        println!("{}", recall_summary(w, wo, with.selected_tokens));
    }
    Ok(signal)
}

/// `--resume` of a run whose latest checkpoint is at or past `train.steps` would train nothing
/// and end as if it had: refused, naming both numbers (a missing or damaged checkpoint is left
/// to the trainer's error).
fn check_steps_left(config: &RunConfig, run_dir: &Path) -> Result<(), CliError> {
    let Ok(Some((dir, _))) = checkpoint::latest_with_note(&run_dir.join("checkpoints")) else {
        return Ok(());
    };
    let Ok(state) = checkpoint::read_trainer_state(&dir) else {
        return Ok(());
    };
    if state.step > 0 && state.step >= config.train.steps {
        return Err(CliError::Conflict(format!(
            "--resume: {} is at step {}, and train.steps (--steps) is {}: nothing would be \
             trained; pass --steps above {}",
            dir.display(),
            state.step,
            config.train.steps,
            state.step
        )));
    }
    Ok(())
}

/// The plain-words summary of a run on text with recallable positions (the generated corpus):
/// bits per recallable byte with the memory, with the same weights reading none, what guessing
/// a letter costs (the recalled letters are drawn uniformly from a-z: `log2(26)` bits), and one
/// sentence on what that means. Losses in nats.
pub fn recall_summary(with_memory: f64, without_memory: f64, tokens: u64) -> String {
    let bits = |nats: f64| nats / std::f64::consts::LN_2;
    let (with, without) = (bits(with_memory), bits(without_memory));
    let guess = 26f64.log2();
    let verdict = if with < guess / 2.0 && without > guess - 0.5 {
        let worse = if without > guess + 0.5 {
            ", worse than a guess: they still bet on copying what is not there"
        } else {
            ""
        };
        format!(
            "The memory does the work: with it the model predicts letters it cannot see in its \
             segment ({with:.2} bits against {guess:.2} for a guess); the same weights without \
             it cannot ({without:.2} bits{worse})."
        )
    } else if with < guess - 0.5 {
        "The memory helps, but the recall is only partly learnt: train longer \
         (--set train.steps=...)."
            .to_string()
    } else {
        "The recall is not learnt yet (the model predicts those letters no better than a \
         guess): train longer (--set train.steps=...)."
            .to_string()
    };
    format!(
        "recall: {tokens} validation bytes repeat letters stated before the current segment, \
         which only memory can predict: {with:.2} bits each with the XL memory, {without:.2} \
         with the same weights reading no memory; guessing a letter costs log2(26) = \
         {guess:.2} bits. {verdict}"
    )
}

/// The model of a run directory with its latest checkpoint, on `device` (no autodiff).
pub fn load_xl(run_dir: &Path, device: &Device) -> Result<(RunConfig, TransformerXl), CliError> {
    let config = RunConfig::from_run_dir(run_dir, &[])?;
    let model = load_xl_config(run_dir, &config, device)?;
    Ok((config, model))
}

/// The stack the run trained ([`RunConfig::stack`]: `[model]`, or the Reformer's or the
/// Memorizing Transformer's preset) with the latest checkpoint of `run_dir`, whose family must
/// be the stack's.
fn load_xl_config(
    run_dir: &Path,
    config: &RunConfig,
    device: &Device,
) -> Result<TransformerXl, CliError> {
    load_checkpoint(run_dir, config.stack().init(device)?)
}

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

/// `--mem-len` (eval, generate) sets a Transformer-XL run's memory length: on a run of another
/// family it is refused, naming the family, not ignored.
fn check_mem_len_flag(
    mem_len: Option<usize>,
    config: &RunConfig,
    run_dir: &Path,
) -> Result<(), CliError> {
    if mem_len.is_some() && config.family() == "reformer" {
        return Err(CliError::Conflict(format!(
            "--mem-len sets the XL memory of relative-attention layers, but {} holds a {} run \
             (LSH and local layers)",
            run_dir.display(),
            config.family()
        )));
    }
    Ok(())
}

/// The config field of the model's vocabulary size, and its value.
fn model_vocab(config: &RunConfig) -> (&'static str, usize) {
    ("model.vocab_size", config.model.vocab_size)
}

/// Token ids must index the model's vocabulary: the largest one in the data is named rather
/// than panicking inside the embedding lookup.
fn check_vocab(config: &RunConfig, splits: &crate::data_setup::Splits) -> Result<(), CliError> {
    let (field, vocab) = model_vocab(config);
    for (split, tokens) in [
        ("train", &splits.train),
        ("valid", &splits.valid),
        ("test", &splits.test),
    ] {
        if let Some(&max) = tokens.iter().max()
            && max as usize >= vocab
        {
            return Err(CliError::Vocab {
                field,
                vocab,
                split,
                data: splits.name.clone(),
                id: max.into(),
                byte_offset: config.data.byte_offset,
            });
        }
    }
    Ok(())
}

/// The prompt's ids must index the model's vocabulary (named as [`check_vocab`] does).
fn check_prompt_vocab(config: &RunConfig, codec: &TextCodec, prompt: &str) -> Result<(), CliError> {
    let (field, vocab) = model_vocab(config);
    if let Some(&max) = codec.encode_prompt(prompt)?.iter().max()
        && max as usize >= vocab
    {
        return Err(CliError::Vocab {
            field,
            vocab,
            split: "prompt",
            data: "--prompt".into(),
            id: max as u32,
            byte_offset: config.data.byte_offset,
        });
    }
    Ok(())
}

/// Bytes in GiB, for messages.
fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

use memzoo_data::machine_memory;

/// Refuses a Reformer whose LSH attention cannot fit in this machine's memory (the scores of
/// one layer: batch x heads x rounds x padded length x chunk window, f32, about four live
/// copies in the backward), naming the estimate, instead of being killed for memory. Every run
/// whose stack is a Reformer ([`RunConfig::family`]) is checked, imported or native; the
/// message names the `[model]` fields.
fn check_machine_memory(config: &RunConfig) -> Result<(), CliError> {
    check_model_memory(config, true)?;
    if config.family() != "reformer" {
        return Ok(());
    }
    let (stack, t) = (config.stack(), &config.train);
    let lsh = &stack.lsh;
    let rounds = "model.lsh.n_rounds";
    let chunk = lsh.chunk_len.max(1);
    let len = t.tgt_len.div_ceil(chunk) * chunk;
    let window = chunk * (1 + lsh.n_chunks_before + lsh.n_chunks_after);
    let bytes = [stack.n_heads, lsh.n_rounds, len, window, 4 * 4]
        .iter()
        .map(|&v| v as f64)
        .product::<f64>()
        * t.batch as f64;
    let Some(total) = machine_memory() else {
        return Ok(());
    };
    if bytes > total as f64 {
        return Err(CliError::TooLarge {
            what: format!(
                "{rounds} = {} with train.batch {} x train.tgt_len {} ({} heads, chunk window \
                 {window}): one LSH layer's attention",
                lsh.n_rounds, t.batch, t.tgt_len, stack.n_heads,
            ),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: format!("; lower {rounds}, train.batch or train.tgt_len"),
        });
    }
    Ok(())
}

/// About how many bytes a stack of `x` takes (f32): its parameters (with `training`, also
/// their gradients and AdamW's two moments: 4 copies), and one step's largest activations over
/// `batch` rows of `len` tokens (the logits, and every layer's attention scores over memory and
/// segment, three live copies each in a training step). Computed in f64: sizes whose product
/// overflows an integer are estimated all the same.
fn stack_bytes(x: &memzoo_stack::XlConfig, batch: usize, len: usize, training: bool) -> f64 {
    let f = |v: usize| v as f64;
    let (d, h, layers) = (f(x.d_model), f(x.n_heads.max(1)), f(x.n_layers));
    let dh = x.d_head.map_or(d / h, f);
    let embed = f(x.vocab_size) * f(x.d_embed.unwrap_or(x.d_model));
    let output = if x.tie_weights {
        0.0
    } else {
        f(x.vocab_size) * d
    };
    let layer = 5.0 * d * h * dh + 2.0 * d * f(x.d_inner);
    let params = embed + output + layers * layer;
    let (copies, live) = if training { (4.0, 3.0) } else { (1.0, 1.0) };
    let rows = f(batch) * f(len);
    let logits = rows * f(x.vocab_size) * live;
    let scores = layers * f(batch) * h * f(len) * (f(len) + f(x.mem_len)) * live;
    let hidden = layers * rows * (d + f(x.d_inner)) * live;
    4.0 * (params * copies + logits + scores + hidden)
}

/// Refuses a model whose parameters and one step's activations cannot fit in this machine's
/// memory ([`stack_bytes`]; every family: the XL stack, the Reformer's, the Memorizing
/// Transformer's with its kNN memories), naming the sizes, instead of aborting on the
/// allocation. `training`: with gradients and optimizer moments.
fn check_model_memory(config: &RunConfig, training: bool) -> Result<(), CliError> {
    let t = &config.train;
    let (prefix, stack) = ("model", config.stack());
    // The kNN memories: keys and values, f32, per row, head and kNN layer.
    let knn_layers = stack
        .layer_kinds()
        .iter()
        .filter(|&&k| k == memzoo_stack::LayerKind::Knn)
        .count();
    let dh = stack.d_head.unwrap_or(stack.d_model / stack.n_heads.max(1)) as f64;
    let knn = [t.batch, stack.knn.max_memories, stack.n_heads, knn_layers]
        .iter()
        .map(|&v| v as f64)
        .product::<f64>()
        * dh
        * 2.0
        * 4.0;
    let bytes = stack_bytes(&stack, t.batch, t.tgt_len, training) + knn;
    let Some(total) = machine_memory() else {
        return Ok(());
    };
    if bytes > total as f64 {
        return Err(CliError::TooLarge {
            what: format!(
                "a {} model of {prefix}.n_layers {} x {prefix}.d_model {} ({prefix}.d_inner {}, \
                 {prefix}.vocab_size {}) with train.batch {} x train.tgt_len {}{}",
                config.family(),
                stack.n_layers,
                stack.d_model,
                stack.d_inner,
                stack.vocab_size,
                t.batch,
                t.tgt_len,
                if training {
                    " (weights, gradients, AdamW's moments and one step's activations)"
                } else {
                    " (weights and one pass's activations)"
                }
            ),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: format!(
                "; lower {prefix}.d_model, {prefix}.d_inner, {prefix}.n_layers, \
                 {prefix}.vocab_size, train.batch or train.tgt_len"
            ),
        });
    }
    Ok(())
}

/// Refuses an import whose model (`xl`, read from the source's config alone) cannot fit in this
/// machine's memory: its weights twice (the tensors read and the model built from them,
/// [`stack_bytes`] without activations), naming the sizes, before either is allocated.
pub(crate) fn check_import_memory(from: &str, xl: &memzoo_stack::XlConfig) -> Result<(), CliError> {
    let bytes = 2.0 * stack_bytes(xl, 0, 0, false);
    let Some(total) = machine_memory() else {
        return Ok(());
    };
    if bytes > total as f64 {
        return Err(CliError::TooLarge {
            what: format!(
                "the {from} model of its config.json: n_layers {} x d_model {} (d_inner {}, \
                 vocabulary {}), its weights read and built",
                xl.n_layers, xl.d_model, xl.d_inner, xl.vocab_size
            ),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: String::new(),
        });
    }
    Ok(())
}

/// The data a model reads in segments of `len`: documents per row (with resets) on data made
/// of documents (the generated corpus, rust-code), for every family; the ordered stream
/// otherwise.
fn source(
    config: &RunConfig,
    splits: &crate::data_setup::Splits,
    split: Split,
    len: usize,
) -> Result<Box<dyn SegmentSource>, CliError> {
    let batch = config.train.batch;
    // Text read with the run's own tokenizer is one stream.
    if splits.codec.is_none()
        && let Some(d) = crate::data_setup::doc_batcher(&config.data, split, batch, len)?
    {
        return Ok(Box::new(d));
    }
    Ok(Box::new(batcher(splits, split, batch, len)?))
}

fn latest_checkpoint(run_dir: &Path) -> Result<PathBuf, CliError> {
    checkpoint::latest(&run_dir.join("checkpoints"))?.ok_or_else(|| CliError::NoCheckpoint {
        dir: run_dir.to_path_buf(),
    })
}

/// A fresh run directory for a task run under the system's temp dir, removed on drop: the
/// trainer writes its metrics and final checkpoint there.
struct ScratchRun(PathBuf);

impl ScratchRun {
    fn new(task: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("memzoo-{task}-{}-{nanos}", std::process::id()));
        Self(dir)
    }

    fn options(&self) -> RunOptions {
        RunOptions {
            run_dir: self.0.clone(),
            resume: false,
            quiet: true,
        }
    }
}

impl Drop for ScratchRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `memzoo duplication`: the Reformer paper's duplication task (sequences `0 w 0 w`), trained
/// with `train_rounds` hash rounds and evaluated with 1, 2 and 4.
pub fn duplication(
    device_name: &str,
    train_rounds: usize,
    len: usize,
    steps: usize,
    seconds: f64,
    json_out: bool,
) -> Result<(), CliError> {
    use memzoo_stack::ReformerConfig;
    use memzoo_train::tasks::{DuplicationConfig, duplication as train_dup};
    // One LSH layer's attention over a batch (16 rows, 2 heads, buckets of 4, a window of 2):
    // its scores grow with the hash rounds.
    let bytes = [16.0, 2.0, train_rounds as f64, len as f64, 8.0, 4.0 * 4.0]
        .iter()
        .product::<f64>();
    if let Some(total) = machine_memory()
        && bytes > total as f64
    {
        return Err(CliError::TooLarge {
            what: format!("--train-rounds {train_rounds} with --len {len}: the LSH attention"),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: "; lower --train-rounds or --len".into(),
        });
    }
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(CliError::flag(
            "--seconds",
            seconds,
            "must be a finite number of seconds, >= 0 (0: no limit)",
        ));
    }
    let device = device(device_name)?.autodiff();
    let model = ReformerConfig::new()
        .with_n_layers(1)
        .with_d_model(64)
        .with_n_heads(2)
        .with_d_head(32)
        .with_d_ff(128)
        .with_vocab_size(16)
        .with_max_seq_len(len)
        .with_lsh(LshConfig::new().with_chunk_len(4))
        .with_dropout(0.0)
        // One layer finds the symbol len/2 back by its position: without a position
        // embedding it trains at chance (about 10% of the copy at 2,000 steps).
        .with_axial_positions(true);
    let cfg = DuplicationConfig::new(model)
        .with_len(len)
        .with_vocab(16)
        .with_steps(steps)
        .with_max_seconds(seconds)
        .with_train_rounds(train_rounds)
        .with_eval_rounds(vec![1, 2, 4])
        .with_log_every((steps / 10).max(1));
    let run = ScratchRun::new("duplication");
    let report = train_dup(&cfg, &device, &run.options())?;
    if json_out {
        println!(
            "{}",
            json!({"train_rounds": train_rounds, "len": len, "steps": report.steps,
                   "seconds": report.seconds, "accuracy": report.accuracy})
        );
    } else {
        println!(
            "duplication (len {len}), trained with {train_rounds} rounds for {} steps ({:.0}s):",
            report.steps, report.seconds
        );
        for (rounds, acc) in &report.accuracy {
            println!(
                "  evaluated with {rounds} rounds: {:.1}% of the copy correct",
                acc * 100.0
            );
        }
    }
    Ok(())
}

/// `memzoo recall`: trains the reference Memorizing Transformer and the same XL without
/// kNN memory on the long-range recall task and compares their validation losses.
pub fn recall(
    device_name: &str,
    which: &str,
    steps: usize,
    lr: f64,
    batch: usize,
    seed: u64,
    json_out: bool,
) -> Result<(), CliError> {
    use memzoo_data::RecallTask;
    use memzoo_stack::recall_reference;
    use memzoo_train::tasks::{RecallConfig, recall as train_recall};
    let models: &[(&str, bool)] = match which {
        "both" => &[("memorizing", true), ("xl", false)],
        "memorizing" => &[("memorizing", true)],
        "xl" => &[("xl", false)],
        other => {
            return Err(CliError::flag(
                "--model",
                other,
                "must be both, memorizing or xl",
            ));
        }
    };
    if steps == 0 {
        return Err(CliError::flag("--steps", steps, "must be positive"));
    }
    if batch == 0 {
        return Err(CliError::flag("--batch", batch, "must be positive"));
    }
    if !(lr.is_finite() && lr > 0.0) {
        return Err(CliError::flag("--lr", lr, "must be a positive number"));
    }
    let task = RecallTask::reference();
    // The larger of the two models (with its kNN memory) over --batch rows, estimated as
    // `train` estimates a Memorizing run, before anything is allocated.
    let mut estimate = RunConfig::default();
    estimate.model.stack = recall_reference(true, task.vocab()).stack();
    estimate.train.batch = batch;
    estimate.train.tgt_len = task.seg_len;
    check_model_memory(&estimate, true).map_err(|e| match e {
        CliError::TooLarge {
            what,
            need_gib,
            have_gib,
            ..
        } => CliError::TooLarge {
            what: format!("memzoo recall with --batch {batch}: {what}"),
            need_gib,
            have_gib,
            advice: "; lower --batch".into(),
        },
        e => e,
    })?;
    let device = device(device_name)?.autodiff();
    if !json_out {
        println!(
            "task: passages of {} of {} tokens, repeated {}x; {:.0}% of documents recall across {}-{} filler tokens (XL reach: mem_len 32 + segment 32)",
            task.passage,
            task.n_values,
            task.repeats,
            task.long_fraction * 100.0,
            task.long_gap.0,
            task.long_gap.1
        );
    }
    let cfg = RecallConfig::new()
        .with_steps(steps)
        .with_lr(lr)
        .with_batch(batch)
        .with_seed(seed);
    for &(name, knn) in models {
        // The weights are drawn from the device's generator: seeded, a run is repeatable.
        device.seed(seed);
        if !json_out {
            println!(
                "{name}: validation every {} steps on long gaps only (selected: the recall \
                 targets)",
                (steps / cfg.evaluations).max(1)
            );
        }
        let run = ScratchRun::new("recall");
        let r = train_recall(
            &recall_reference(knn, task.vocab()),
            &task,
            &cfg,
            &device,
            &run.options(),
        )?;
        if json_out {
            println!(
                "{}",
                json!({"model": name, "steps": steps, "lr": lr, "batch": batch, "result": r})
            );
        } else {
            println!(
                "{name}: {steps} steps in {:.0} s; validation (long gaps only): loss {:.3} nats, recall loss {:.3} nats, recall accuracy {:.1}% ({} targets; chance {:.1}%)",
                r.train_s,
                r.valid_loss,
                r.recall_loss,
                r.recall_accuracy * 100.0,
                r.recall_targets,
                100.0 / task.n_values as f64
            );
        }
    }
    Ok(())
}

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

/// The latest checkpoint of `run_dir` into `model`, which must be of the family it holds.
pub(crate) fn load_checkpoint<M: SegmentModel>(run_dir: &Path, model: M) -> Result<M, CliError> {
    load_checkpoint_dir(&latest_checkpoint(run_dir)?, model)
}

/// The checkpoint in `dir` into `model`, which must be of the family it holds.
pub(crate) fn load_checkpoint_dir<M: SegmentModel>(dir: &Path, model: M) -> Result<M, CliError> {
    let dir = dir.to_path_buf();
    let trainer = checkpoint::read_trainer_state(&dir)?;
    if !model.accepts_family(&trainer.family) {
        return Err(CliError::Family {
            dir,
            found: trainer.family,
            expected: format!("the run's config.toml a `{}` one", model.family()),
        });
    }
    Ok(checkpoint::load_model(&dir, model)?)
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

/// `memzoo data list`.
pub fn data_list() -> Result<(), CliError> {
    for m in Manifest::all()? {
        println!("{:16} {:>12} bytes  {}", m.name, m.size, m.description);
    }
    let code = RustCodeManifest::embedded()?;
    println!(
        "{:16} {:>12} bytes  {} ({} crates; `memzoo data prepare rust-code`, no download)",
        code.name, code.bytes, code.description, code.documents
    );
    Ok(())
}

/// `memzoo data fetch`.
pub fn data_fetch(name: &str, dir: &Path, url: Option<String>) -> Result<(), CliError> {
    if name == rust_code::NAME {
        return Err(CliError::Conflict(format!(
            "{name} is not downloaded: it is built from cargo's registry sources of the crates in \
             memzoo's Cargo.lock; run `memzoo data prepare {name} --dir {}`",
            dir.display()
        )));
    }
    let manifest = Manifest::load(name)?;
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let path: PathBuf = match url {
        Some(url) => memzoo_data::fetch_from(&url, &manifest, dir, progress),
        None => memzoo_data::fetch(&manifest, dir, progress),
    }?;
    println!("{}", path.display());
    Ok(())
}

fn source_config(source: &str, dir: &Path) -> crate::config::DataConfig {
    crate::config::DataConfig {
        source: Some(source.to_string()),
        data_dir: dir.display().to_string(),
        ..Default::default()
    }
}

/// `memzoo data prepare`: load, split and report sizes (checks the file end to end).
pub fn data_prepare(source: &str, dir: &Path, json_out: bool) -> Result<(), CliError> {
    if source == rust_code::NAME {
        return prepare_rust_code(dir, json_out);
    }
    let (name, corpus) = load_corpus(&source_config(source, dir))?;
    if json_out {
        println!(
            "{}",
            json!({"source": name, "train": corpus.train.len(), "valid": corpus.valid.len(), "test": corpus.test.len()})
        );
    } else {
        println!(
            "{name}: train {} bytes, valid {} bytes, test {} bytes",
            corpus.train.len(),
            corpus.valid.len(),
            corpus.test.len()
        );
    }
    Ok(())
}

/// `memzoo data prepare rust-code`: reads the pinned crates from cargo's registry sources,
/// verifies them and writes `dir/rust-code/`.
fn prepare_rust_code(dir: &Path, json_out: bool) -> Result<(), CliError> {
    let start = Instant::now();
    let manifest = RustCodeManifest::embedded()?;
    let out = crate::data_setup::rust_code_dir(&source_config(rust_code::NAME, dir));
    let s = rust_code::prepare(&manifest, &rust_code::registry_src_dirs(), &out)?;
    let secs = start.elapsed().as_secs_f64();
    if json_out {
        println!(
            "{}",
            json!({"source": rust_code::NAME, "summary": s, "seconds": secs})
        );
        return Ok(());
    }
    let splits: Vec<String> = s
        .splits
        .iter()
        .map(|p| format!("{} {} docs, {} bytes", p.split, p.docs, p.bytes))
        .collect();
    println!(
        "{}: {}; {} .rs files; sha256 {} {} ({secs:.1}s) in {}",
        rust_code::NAME,
        splits.join(", "),
        s.files,
        s.sha256,
        if s.verified {
            "verified"
        } else {
            "(a selection: not checked)"
        },
        s.dir.display()
    );
    Ok(())
}

/// `memzoo data stats`.
pub fn data_stats(source: &str, dir: &Path, json_out: bool) -> Result<(), CliError> {
    let (name, corpus) = load_corpus(&source_config(source, dir))?;
    for (split, bytes) in [
        ("train", &corpus.train),
        ("valid", &corpus.valid),
        ("test", &corpus.test),
    ] {
        let s = memzoo_data::byte_stats(bytes);
        if json_out {
            println!(
                "{}",
                json!({"source": name, "split": split, "tokens": s.tokens, "distinct": s.distinct,
                       "unigram_entropy_bits": s.unigram_entropy_bits})
            );
        } else {
            println!(
                "{name} {split}: {} tokens, {} distinct, unigram entropy {:.3} bits/char",
                s.tokens, s.distinct, s.unigram_entropy_bits
            );
        }
    }
    Ok(())
}

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
