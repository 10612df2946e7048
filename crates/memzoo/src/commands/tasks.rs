//! The papers' generated tasks as commands: `memzoo duplication` (the Reformer's) and
//! `memzoo recall` (the Memorizing Transformer's), each trained in a scratch run directory.

use std::path::PathBuf;

use memzoo_data::machine_memory;
use memzoo_stack::LshConfig;
use memzoo_train::RunOptions;
use serde_json::json;

use super::checks::check_model_memory;
use super::{device, gib};
use crate::config::RunConfig;
use crate::error::CliError;

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
