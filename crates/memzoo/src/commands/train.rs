//! `memzoo train`: a new run, a resumed one, or one that replaces the run in its directory;
//! and the plain-words summary of what the memory bought on text with recallable positions.

use std::path::Path;
use std::time::Instant;

use burn::tensor::Device;
use memzoo_data::Split;
use memzoo_train::{
    RecurrentModel, RunOptions, checkpoint, evaluate_sharded, replace, train_on_devices,
};
use serde_json::json;

use super::checks::{check_machine_memory, check_vocab};
use super::loading::source;
use crate::config::RunConfig;
use crate::error::CliError;

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
