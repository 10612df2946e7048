//! `memzoo import` and `memzoo export`: checkpoints from and to the PyTorch world.
//!
//! An import writes a run directory like `memzoo train` does — `config.toml` (the whole
//! `[model]` stack, from no preset) and a step-0 checkpoint with a fresh optimizer — so
//! that `memzoo eval`, `memzoo generate` and `memzoo train --resume` read it as any run. Its
//! family is the stack's ([`RunConfig::family`]: an imported Reformer is a `reformer`, checked
//! as one, e.g. for the memory its LSH attention needs), and its checkpoint carries it. An
//! export builds the stack the run trained ([`RunConfig::stack`]), whichever its family.

use std::path::Path;

use burn::tensor::Device;
use memzoo_data::Split;
use memzoo_stack::XlState;
use memzoo_train::{RecurrentModel, SegmentSource, TrainerState, checkpoint, replace};
use serde_json::json;

use crate::config::{ModelSection, RunConfig};
use crate::data_setup::batcher;
use crate::error::CliError;

/// The format `--from` / `--to` names, from the registry ([`memzoo_import::FORMATS`]); an
/// unknown name is refused (exit status 2), listing the known ones.
fn format(name: &str) -> Result<&'static dyn memzoo_import::Format, CliError> {
    memzoo_import::format(name).map_err(|_| CliError::UnknownFormat {
        name: name.to_string(),
        planned: "",
        supported: memzoo_import::format::names().join(", "),
    })
}

/// The checkpoint directory `memzoo import` reads for its `SRC`: `src` itself when it exists
/// on disk; else, when it reads as a Hugging Face Hub model id (`owner/name`), its snapshot in
/// the Hugging Face cache at `revision`, downloaded unless `offline` (or `HF_HUB_OFFLINE`), with
/// the endpoint, cache and token of Python's environment variables
/// ([`memzoo_import::hub::HubOptions::from_env`]). Anything else is returned as it is, for the
/// importer's own error.
#[cfg(feature = "hub")]
pub fn source_dir(
    src: &Path,
    revision: &str,
    offline: bool,
) -> Result<std::path::PathBuf, CliError> {
    let mut options = memzoo_import::hub::HubOptions::from_env();
    options.revision = revision.to_string();
    options.offline |= offline;
    match memzoo_import::hub::resolve(src, &options) {
        Some(dir) => Ok(dir.map_err(memzoo_import::ImportError::from)?),
        None => Ok(src.to_path_buf()),
    }
}

/// Without the `hub` feature: `src` as it is; a Hub model id is refused, naming the feature.
#[cfg(not(feature = "hub"))]
pub fn source_dir(
    src: &Path,
    _revision: &str,
    _offline: bool,
) -> Result<std::path::PathBuf, CliError> {
    if !src.exists() && src.to_str().is_some_and(|s| s.split('/').count() == 2) {
        return Err(CliError::Config(format!(
            "{} is no directory here, and this memzoo was built without the `hub` feature that \
             reads Hugging Face Hub ids",
            src.display()
        )));
    }
    Ok(src.to_path_buf())
}

/// `memzoo import --from SOURCE SRC --run-dir DIR`: reads the checkpoint directory `src`
/// (`config.json` + `model.safetensors` or `pytorch_model.bin`; pickle is parsed, never run)
/// and writes the run directory `run_dir`. `data`: the run's data (`[data] source`; default:
/// the generated corpus). A directory that holds a run is refused unless `overwrite`, which
/// replaces that run only once the source, its config and the data have been read: the old
/// run is set aside while the new one is written and put back if that fails
/// ([`memzoo_train::replace`]).
pub fn import(
    from: &str,
    src: &Path,
    run_dir: &Path,
    data: Option<String>,
    overwrite: bool,
    json_out: bool,
) -> Result<(), CliError> {
    let format = format(from)?;
    let refuse = |found: String| CliError::RunExists {
        dir: run_dir.to_path_buf(),
        found,
        advice: "import into a new --run-dir, or pass --overwrite to replace it",
    };
    // A replacement that a process which died left unfinished, finished or undone before
    // anything looks at the run (again under the lock below).
    if let Some(note) = replace::recover_locked(run_dir, "memzoo import")? {
        eprintln!("warning: {note}");
    }
    if let Some(found) = checkpoint::existing_run(run_dir)
        && !overwrite
    {
        return Err(refuse(found));
    }
    let device = memzoo_backend::parse_device("flex")?;
    // A model too large for this machine is refused from its config, before it is built.
    if let Some(xl) = format.stack_from_config(src)? {
        crate::commands::check_import_memory(from, &xl)?;
    }
    let (model, xl) = format.import(src, &device)?;
    // The imported peer's stack, from no preset; the default run's schedule.
    let mut config = RunConfig {
        model: ModelSection {
            preset: None,
            stack: xl,
        },
        ..RunConfig::default()
    };
    config.data.source = data;
    // Bytes at the ids the model was trained on (2 for google/reformer-enwik8).
    config.data.byte_offset = format.byte_offset(&config.model);
    // Learned absolute positions number the segments the peer read: no longer ones.
    if let Some(len) = config.model.learned_positions {
        config.train.tgt_len = config.train.tgt_len.min(len);
    }
    config.validate()?;
    // A tokenizer beside the checkpoint goes with the run, where `memzoo generate` reads it
    // (memzoo_data::TextCodec::for_dir): a word vocabulary (vocab.json, or HF's vocab.pkl read
    // without running it and written as vocab.json), or a SentencePiece model (spiece.model).
    let vocab = crate::tokenizer_import::checkpoint_tokenizer(src, config.model.vocab_size)?;

    // The training data's starting position, so that `train --resume` continues from step 0:
    // the data tokenised as train will read it, with the run's tokenizer where memzoo's data
    // pipeline can hold its ids (transfo-xl-wt103's 267,735 words it cannot: bytes then).
    let codec = match &vocab {
        Some(v) => Some(v.codec()?).filter(|c| crate::data_setup::check_codec_fits(c).is_ok()),
        None => None,
    };
    let splits = crate::data_setup::load_splits_with(&config.data, codec)?;
    let t = &config.train;
    let train_data = batcher(&splits, Split::Train, t.batch, t.tgt_len)?;
    let largest = splits
        .train
        .iter()
        .chain(&splits.valid)
        .chain(&splits.test)
        .copied()
        .max()
        .unwrap_or(0) as usize;
    let fits = largest < config.model.vocab_size;
    let trainer = TrainerState {
        // "xl"; "memorizing" for a stack with kNN layers, "reformer" for a seeded stack (an
        // imported Reformer): what `train --resume` checks.
        family: model.family().into(),
        step: 0,
        tokens: 0,
        data_position: train_data.position(),
        schedule: t.schedule.clone(),
        total_steps: t.steps,
        replicas: 1,
    };
    // One process per run directory, until the import is written.
    let _lock = memzoo_train::lock::RunLock::acquire(run_dir, "memzoo import")?;
    // A replacement that a process which died left unfinished: finished or undone first.
    if let Some(note) = replace::recover(run_dir)? {
        eprintln!("warning: {note}");
    }
    // The source, its config, vocabulary and the data are good: only now does the old run go
    // aside (`--overwrite`), to be deleted once the new run's checkpoint is written and put
    // back if writing the new run fails. Looked at again under the lock: another process may
    // have written a run there since.
    let mut set_aside = false;
    if let Some(found) = checkpoint::existing_run(run_dir) {
        if !overwrite {
            return Err(refuse(found));
        }
        set_aside = replace::set_aside(run_dir)?;
    }
    let written = write_run(run_dir, &config, vocab.as_ref(), &model, &trainer);
    let saved = match written {
        Ok(saved) => {
            replace::drop_set_aside(run_dir)?;
            saved
        }
        Err(e) => {
            if set_aside {
                replace::restore(run_dir)?;
            }
            return Err(e);
        }
    };
    let params = burn::module::Module::num_params(&model);
    if json_out {
        println!(
            "{}",
            json!({"run_dir": run_dir, "checkpoint": saved, "parameters": params,
                   "vocab_size": config.model.vocab_size, "adaptive": config.model.is_adaptive(),
                   "data": splits.name, "data_fits_vocab": fits, "family": config.family(),
                   "byte_offset": config.data.byte_offset,
                   "tokenizer": vocab.as_ref().map(|v| v.describe())})
        );
    } else {
        println!(
            "imported {} ({params} parameters, vocabulary {}{}) into {}",
            src.display(),
            config.model.vocab_size,
            if config.model.is_adaptive() {
                format!(", adaptive cutoffs {:?}", config.model.cutoffs)
            } else {
                String::new()
            },
            saved.display()
        );
        if let Some(v) = &vocab {
            println!("text is read and written as {}", v.describe());
        }
        if !fits {
            println!(
                "note: the run's data ({}) has token id {largest}, beyond the model's vocabulary \
                 of {}: memzoo tokenizes bytes (byte b is id {} + b); give eval and training \
                 data whose bytes fit ([data] source in {})",
                splits.name,
                config.model.vocab_size,
                config.data.byte_offset,
                run_dir.join("config.toml").display()
            );
        }
    }
    Ok(())
}

/// Writes an imported run into `run_dir`: its config, the tokenizer `vocab`, and its one
/// checkpoint (step 0, written atomically), whose folder it returns.
fn write_run(
    run_dir: &Path,
    config: &RunConfig,
    vocab: Option<&crate::tokenizer_import::CheckpointTokenizer>,
    model: &memzoo_stack::TransformerXl,
    trainer: &TrainerState,
) -> Result<std::path::PathBuf, CliError> {
    let t = &config.train;
    std::fs::write(run_dir.join("config.toml"), config.to_toml()).map_err(|e| {
        CliError::io(
            format!("cannot write to run directory {}", run_dir.display()),
            e,
        )
    })?;
    if let Some(vocab) = vocab {
        vocab.write(run_dir)?;
    }
    Ok(checkpoint::save(
        &run_dir.join("checkpoints"),
        model,
        &t.optimizer(),
        &[XlState::default()],
        trainer,
        t.keep_checkpoints.max(1),
    )?)
}

/// `memzoo export --to TARGET --run-dir DIR OUT`: the run's latest checkpoint as a checkpoint
/// directory of `target` (`config.json` + `model.safetensors` with its names). `out` must not
/// hold a `config.json` or `model.safetensors` already.
pub fn export(
    to: &str,
    run_dir: &Path,
    out: &Path,
    device: &Device,
    json_out: bool,
) -> Result<(), CliError> {
    let format = format(to)?;
    for f in ["config.json", "model.safetensors"] {
        if out.join(f).exists() {
            return Err(CliError::Exists {
                path: out.join(f),
                advice: "export into a new directory",
            });
        }
    }
    // No training may prune the checkpoint while it is read (a missing run directory is left
    // to load_xl's error).
    let _lock = match run_dir.is_dir() {
        true => Some(memzoo_train::lock::RunLock::acquire(
            run_dir,
            "memzoo export",
        )?),
        false => None,
    };
    // The stack the run trained, of any family (`RunConfig::stack`): the format says which it
    // can express, naming the field it cannot.
    let (config, model) = crate::commands::load_xl(run_dir, device)?;
    format.export(&model, &config.stack(), out)?;
    if json_out {
        println!("{}", json!({"out": out, "to": to}));
    } else {
        println!(
            "exported {} to {} (config.json, model.safetensors)",
            run_dir.display(),
            out.display()
        );
    }
    Ok(())
}
