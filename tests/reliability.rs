//! The reliability catalogue: bad inputs and faults, each a clear error that names the bad value
//! (never a panic), or an exact resume. Library entry points (the CLI's `memzoo::commands` and
//! the trainer) stand for the binary; the signal tests run a child process.
//!
//! Covered: run directories (a second run, `--overwrite`), damaged checkpoints (flipped, cut,
//! emptied, missing, foreign and edited files), `latest` missing / damaged / pointing at a
//! damaged checkpoint, a resume after a fallback (exact, metrics not repeated), a full disk
//! (`/dev/full` behind `metrics.jsonl` and the `latest` pointer), non-finite gradients, SIGTERM
//! and SIGINT, configs and overrides, data files, devices, sampling options, the duplication and
//! recall commands, and kNN memory headers. The second round: exact resume with dropout and
//! seeded randomness (in a child process: the backend's generator is one per process),
//! `--overwrite` with bad new inputs, two processes on one run directory, damaged
//! `metrics.jsonl` lines, checkpoints without checksums, TOML integer limits, non-finite
//! imported weights and losses, flags a command cannot honour, FIFOs, `/dev/zero` and a gzip
//! bomb, sizes beyond the machine, and a labml weight file of any name.

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use memzoo::commands;
use memzoo::config::RunConfig;
use memzoo::error::CliError;
use memzoo_data::OrderedBatcher;
use memzoo_stack::TransformerXl;
use memzoo_tests::*;
use memzoo_train::checkpoint;
use memzoo_train::grads::non_finite;
use memzoo_train::{RunOptions, ScheduleConfig, TrainConfig, TrainError, TrainOutcome, train};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memzoo-rel-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn tiny_train(steps: usize) -> TrainConfig {
    TrainConfig::sized(steps, 4, 16)
        .with_replicas(Some(1))
        .with_log_every(1)
        .with_eval_every(0)
        .with_checkpoint_every(2)
        .with_keep_checkpoints(3)
        .with_schedule(ScheduleConfig::new().with_lr(3e-3).with_warmup(2))
}

fn batcher() -> OrderedBatcher {
    OrderedBatcher::new(small_corpus(), 4, 16)
        .unwrap()
        .drop_last(true)
}

/// A tiny XL run of `steps` in `dir` (checkpoints every 2 steps, 3 kept).
fn run(dir: &Path, steps: usize, resume: bool) -> Result<TrainOutcome<TransformerXl>, TrainError> {
    run_from(initial_model(), dir, steps, resume)
}

/// The tiny model's initial weights, from a seeded host generator ([`seeded_weights`]; Burn's
/// device RNG is shared by the tests running at the same time).
fn initial_model() -> TransformerXl {
    let dev = flex().autodiff();
    seeded_weights(tiny_xl().init(&dev).unwrap(), 3, xl_init_std(&tiny_xl()))
}

/// [`run`] from the given initial model.
fn run_from(
    model: TransformerXl,
    dir: &Path,
    steps: usize,
    resume: bool,
) -> Result<TrainOutcome<TransformerXl>, TrainError> {
    let options = RunOptions {
        run_dir: dir.to_path_buf(),
        resume,
        quiet: true,
    };
    train(model, &tiny_train(steps), &mut batcher(), None, &options)
}

fn weights(model: &TransformerXl) -> Vec<f32> {
    param_vectors(model, None)
        .into_iter()
        .flatten()
        .flatten()
        .collect()
}

/// How many times each step's training loss is recorded in `metrics.jsonl`.
fn loss_records(dir: &Path) -> Vec<usize> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let mut counts = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["split"] == "train" && v["metric"] == "loss" {
            let s = v["step"].as_u64().unwrap() as usize;
            if counts.len() < s {
                counts.resize(s, 0);
            }
            counts[s - 1] += 1;
        }
    }
    counts
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn flip_byte(path: &Path, at: f64) {
    let mut b = std::fs::read(path).unwrap();
    let i = ((b.len() as f64 * at) as usize).min(b.len() - 1);
    b[i] ^= 0x04;
    std::fs::write(path, b).unwrap();
}

fn cut(path: &Path, keep: f64) {
    let b = std::fs::read(path).unwrap();
    std::fs::write(path, &b[..(b.len() as f64 * keep) as usize]).unwrap();
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn a_second_run_in_a_run_directory_is_refused() {
    let dir = scratch("second-run");
    run(&dir, 2, false).unwrap();
    let metrics = std::fs::read(dir.join("metrics.jsonl")).unwrap();
    let model = std::fs::read(dir.join("checkpoints/step-00000002/model.bpk")).unwrap();
    let err = run(&dir, 4, false)
        .err()
        .expect("a second run must fail")
        .to_string();
    assert_mentions(
        &err,
        &[
            "already holds a run",
            "checkpoints/step-00000002",
            "metrics.jsonl",
            "--resume",
            "--overwrite",
        ],
        "library",
    );
    // Nothing of the first run was touched.
    assert_eq!(std::fs::read(dir.join("metrics.jsonl")).unwrap(), metrics);
    assert_eq!(
        std::fs::read(dir.join("checkpoints/step-00000002/model.bpk")).unwrap(),
        model
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn cli_train(
    extra: &[&str],
    dir: &Path,
    resume: bool,
    overwrite: bool,
) -> Result<Option<i32>, CliError> {
    let config = RunConfig::resolve(None, &tiny_cli(extra))?;
    commands::train(&config, "flex", dir, resume, overwrite, true, true)
}

#[test]
fn overwrite_replaces_a_run_and_never_mixes_two() {
    let dir = scratch("overwrite");
    cli_train(&[], &dir, false, false).unwrap();
    let err = cli_train(&["train.steps=3"], &dir, false, false).unwrap_err();
    assert_mentions(
        &err,
        &["already holds a run", "--resume", "--overwrite"],
        "cli",
    );
    let err = cli_train(&[], &dir, true, true).unwrap_err();
    assert_mentions(&err, &["--resume", "--overwrite"], "both flags");
    assert_eq!(
        cli_train(&["train.steps=3"], &dir, false, true).unwrap(),
        None
    );
    // Only the new run: steps 1, 2, 3 once each, its config, its checkpoints.
    assert_eq!(loss_records(&dir), vec![1, 1, 1]);
    let config = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(config.contains("steps = 3"), "{config}");
    let latest = checkpoint::latest(&dir.join("checkpoints"))
        .unwrap()
        .unwrap();
    assert!(latest.ends_with("step-00000003"), "{}", latest.display());
    assert!(!dir.join("checkpoints/step-00000002").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// Every way a checkpoint folder can be damaged is an error naming the file (and no load).
#[test]
fn damaged_checkpoint_catalogue() {
    let dir = scratch("catalogue");
    run(&dir, 4, false).unwrap();
    let pristine = dir.join("checkpoints/step-00000004");
    let older = dir.join("checkpoints/step-00000002");
    checkpoint::verify(&pristine).unwrap();
    type Damage = Box<dyn Fn(&Path)>;
    let older_model = older.join("model.bpk");
    let cases: Vec<(&str, Damage, &[&str])> = vec![
        (
            "model.bpk: one bit flipped",
            Box::new(|d| flip_byte(&d.join("model.bpk"), 0.5)),
            &["model.bpk is damaged", "SHA-256"],
        ),
        (
            "model.bpk: last byte flipped",
            Box::new(|d| flip_byte(&d.join("model.bpk"), 1.0)),
            &["model.bpk is damaged", "SHA-256"],
        ),
        (
            "model.bpk: cut in half",
            Box::new(|d| cut(&d.join("model.bpk"), 0.5)),
            &["model.bpk is damaged", "bytes, trainer.json records"],
        ),
        (
            "model.bpk: emptied",
            Box::new(|d| cut(&d.join("model.bpk"), 0.0)),
            &["model.bpk is damaged", "0 bytes"],
        ),
        (
            "model.bpk: a byte appended",
            Box::new(|d| {
                let mut b = std::fs::read(d.join("model.bpk")).unwrap();
                b.push(0);
                std::fs::write(d.join("model.bpk"), b).unwrap();
            }),
            &["model.bpk is damaged", "bytes"],
        ),
        (
            "model.bpk: missing",
            Box::new(|d| std::fs::remove_file(d.join("model.bpk")).unwrap()),
            &["model.bpk is missing"],
        ),
        (
            "model.bpk: another checkpoint's",
            Box::new(move |d| {
                std::fs::copy(&older_model, d.join("model.bpk")).unwrap();
            }),
            &["model.bpk is damaged", "SHA-256"],
        ),
        (
            "optim.bpk: one bit flipped",
            Box::new(|d| flip_byte(&d.join("optim.bpk"), 0.3)),
            &["optim.bpk is damaged"],
        ),
        (
            "optim.bpk: cut",
            Box::new(|d| cut(&d.join("optim.bpk"), 0.9)),
            &["optim.bpk is damaged"],
        ),
        (
            "optim.bpk: missing",
            Box::new(|d| std::fs::remove_file(d.join("optim.bpk")).unwrap()),
            &["optim.bpk is missing"],
        ),
        (
            "memory: one bit flipped",
            Box::new(|d| flip_byte(&d.join("state/memory.safetensors"), 0.7)),
            &["memory.safetensors is damaged"],
        ),
        (
            "memory: missing",
            Box::new(|d| std::fs::remove_file(d.join("state/memory.safetensors")).unwrap()),
            &["memory.safetensors is missing"],
        ),
        (
            "trainer.json: cut",
            Box::new(|d| cut(&d.join("trainer.json"), 0.5)),
            &["trainer.json is damaged"],
        ),
        (
            "trainer.json: not JSON",
            Box::new(|d| std::fs::write(d.join("trainer.json"), "\u{0}garbage").unwrap()),
            &["trainer.json is damaged"],
        ),
        (
            "trainer.json: missing",
            Box::new(|d| std::fs::remove_file(d.join("trainer.json")).unwrap()),
            &["trainer.json"],
        ),
        (
            "trainer.json: its step edited",
            Box::new(|d| edit_json(&d.join("trainer.json"), |v| v["step"] = 5.into())),
            &["trainer.json is damaged", "a value was changed"],
        ),
        (
            "trainer.json: a file's checksum edited",
            Box::new(|d| {
                edit_json(&d.join("trainer.json"), |v| {
                    v["files"]["model.bpk"]["sha256"] = "00".repeat(32).into();
                })
            }),
            &["trainer.json is damaged", "a value was changed"],
        ),
        (
            "trainer.json: a checksum edited, its own sum removed (an older format)",
            Box::new(|d| {
                edit_json(&d.join("trainer.json"), |v| {
                    v["files"]["model.bpk"]["sha256"] = "00".repeat(32).into();
                    v.as_object_mut().unwrap().remove("sha256");
                })
            }),
            &["trainer.json has no `sha256` field", "cannot be verified"],
        ),
        (
            "trainer.json: a size edited, its own sum removed",
            Box::new(|d| {
                edit_json(&d.join("trainer.json"), |v| {
                    v["files"]["optim.bpk"]["bytes"] = 7.into();
                    v.as_object_mut().unwrap().remove("sha256");
                })
            }),
            &["trainer.json has no `sha256` field", "cannot be verified"],
        ),
        (
            "folder: missing",
            Box::new(|d| std::fs::remove_dir_all(d).unwrap()),
            &["does not exist"],
        ),
    ];
    let dev = flex();
    for (i, (what, damage, expect)) in cases.iter().enumerate() {
        let copy = dir.join(format!("case-{i}/step-00000004"));
        copy_dir(&pristine, &copy);
        damage(&copy);
        let err = checkpoint::verify(&copy).expect_err(what).to_string();
        assert_mentions(&err, expect, what);
        let err = checkpoint::load_model(&copy, tiny_xl().init(&dev).unwrap())
            .expect_err(what)
            .to_string();
        assert_mentions(&err, expect, what);
    }
    // Intact sums, but a trainer state no run can have.
    let copy = dir.join("case-replicas/step-00000004");
    copy_dir(&pristine, &copy);
    checkpoint::rewrite_trainer_state(&copy, |t| t.replicas = 0).unwrap();
    let dev = flex().autodiff();
    let optim = tiny_train(4).optimizer();
    let err = checkpoint::load(&copy, tiny_xl().init(&dev).unwrap(), optim, &dev)
        .err()
        .expect("0 replicas")
        .to_string();
    assert_mentions(&err, &["0 replicas"], "replicas");
    // Another architecture: intact files that do not fit.
    let err = checkpoint::load_model(&pristine, tiny_xl().with_d_model(48).init(&dev).unwrap())
        .expect_err("foreign")
        .to_string();
    assert_mentions(&err, &["model.bpk", "does not fit"], "foreign architecture");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn latest_falls_back_to_the_newest_intact_checkpoint_and_resumes_exactly() {
    let init = initial_model();
    let straight = scratch("straight");
    let want = weights(&run_from(init.clone(), &straight, 6, false).unwrap().model);
    let dir = scratch("fallback");
    run_from(init, &dir, 6, false).unwrap();
    let ckpt = dir.join("checkpoints");
    let (found, note) = checkpoint::latest_with_note(&ckpt).unwrap().unwrap();
    assert!(found.ends_with("step-00000006") && note.is_none());

    // The pointer missing, then garbage: the newest intact checkpoint, said so.
    std::fs::remove_file(ckpt.join("latest")).unwrap();
    let (found, note) = checkpoint::latest_with_note(&ckpt).unwrap().unwrap();
    assert!(found.ends_with("step-00000006"));
    assert_mentions(
        &note.unwrap(),
        &["latest is missing", "newest intact"],
        "no pointer",
    );
    std::fs::write(ckpt.join("latest"), "../../etc").unwrap();
    let (found, note) = checkpoint::latest_with_note(&ckpt).unwrap().unwrap();
    assert!(found.ends_with("step-00000006"));
    assert_mentions(
        &note.unwrap(),
        &["latest is damaged", "../../etc"],
        "garbage pointer",
    );
    std::fs::write(ckpt.join("latest"), "step-00000006").unwrap();

    // The newest checkpoint damaged: the one before it.
    flip_byte(&ckpt.join("step-00000006/model.bpk"), 0.5);
    let (found, note) = checkpoint::latest_with_note(&ckpt).unwrap().unwrap();
    assert!(found.ends_with("step-00000004"), "{}", found.display());
    assert_mentions(
        &note.unwrap(),
        &[
            "names step-00000006",
            "model.bpk is damaged",
            "step-00000004, the newest intact",
        ],
        "damaged latest",
    );

    // A crash tore the last metrics line; the resume continues from step 4, drops the records
    // of steps 5 and 6 and the torn line, and ends where the straight run ended.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("metrics.jsonl"))
        .unwrap();
    write!(f, "{{\"step\": 7, \"spl").unwrap();
    drop(f);
    let resumed = run(&dir, 6, true).unwrap();
    assert_eq!(resumed.steps, 6);
    assert_close(
        &weights(&resumed.model),
        &want,
        0.0,
        "resumed after a fallback",
    );
    assert_eq!(loss_records(&dir), vec![1; 6]);

    // Every checkpoint damaged: an error naming each, not a fresh start.
    for name in ["step-00000002", "step-00000004", "step-00000006"] {
        flip_byte(&ckpt.join(name).join("optim.bpk"), 0.5);
    }
    let err = checkpoint::latest(&ckpt).unwrap_err().to_string();
    assert_mentions(
        &err,
        &[
            "no intact checkpoint",
            "step-00000004: ",
            "optim.bpk is damaged",
        ],
        "all damaged",
    );
    let err = run(&dir, 8, true)
        .err()
        .expect("nothing to resume")
        .to_string();
    assert_mentions(&err, &["no intact checkpoint"], "resume, all damaged");
    // No checkpoint at all: nothing to fall back to, and --resume says where it looked.
    let empty = scratch("no-checkpoints");
    std::fs::create_dir_all(empty.join("checkpoints")).unwrap();
    assert!(
        checkpoint::latest(&empty.join("checkpoints"))
            .unwrap()
            .is_none()
    );
    let err = run(&empty, 2, true)
        .err()
        .expect("no checkpoint")
        .to_string();
    assert_mentions(&err, &["--resume: no checkpoint in"], "resume, none");
    for d in [straight, dir, empty] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A full disk: `/dev/full` behind the files the trainer writes.
#[test]
fn a_full_disk_is_an_error_naming_the_file() {
    #[cfg(unix)]
    {
        if !Path::new("/dev/full").exists() {
            eprintln!("no /dev/full here: skipped");
            return;
        }
        let dir = scratch("full-metrics");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/dev/full", dir.join("metrics.jsonl")).unwrap();
        let err = run(&dir, 2, false).err().expect("a full disk").to_string();
        assert_mentions(
            &err,
            &["metrics.jsonl", "No space left"],
            "metrics on a full disk",
        );
        let _ = std::fs::remove_dir_all(&dir);

        let dir = scratch("full-latest");
        std::fs::create_dir_all(dir.join("checkpoints")).unwrap();
        std::os::unix::fs::symlink("/dev/full", dir.join("checkpoints/.latest.tmp")).unwrap();
        let err = run(&dir, 2, false).err().expect("a full disk").to_string();
        assert_mentions(&err, &["latest", "No space left"], "latest on a full disk");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The trainer's check before every update names the parameters whose gradient is NaN or inf.
#[test]
fn non_finite_gradients_are_named() {
    let dev = flex();
    let model = tiny_xl().init(&dev).unwrap();
    let mut grads = GradientsParams::new();
    let bad = |p: &Param<Tensor<2>>, v: f32| {
        let [a, b] = p.val().dims();
        let mut data = vec![0.5f32; a * b];
        data[a * b / 2] = v;
        Tensor::<2>::from_data(TensorData::new(data, [a, b]), &dev)
    };
    grads.register(
        model.embedding.plain().unwrap().weight.id,
        bad(&model.embedding.plain().unwrap().weight, f32::NAN),
    );
    assert!(non_finite(&model, &grads).len() == 1);
    let query = &model.layers[1].attention.local().query.weight;
    grads.register(query.id, bad(query, f32::INFINITY));
    let found = non_finite(&model, &grads);
    let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names[0].contains("embedding") && names[0].ends_with("weight"),
        "{names:?}"
    );
    assert!(
        names[1].contains("layers.1.attention.Relative.query"),
        "{names:?}"
    );
    assert!(found[0].1.is_nan() && found[1].1.is_infinite());
    // Finite gradients: nothing named.
    let mut fine = GradientsParams::new();
    fine.register(query.id, bad(query, 1.0));
    assert!(non_finite(&model, &fine).is_empty());
}

/// The child side of the signal tests: trains "forever" in `MEMZOO_SIGNAL_RUN` until a signal
/// stops it, and writes what `train` returned. Does nothing when run on its own.
#[test]
#[ignore = "run by stop_signals_checkpoint_and_stop in a child process"]
fn signal_child() {
    let Ok(dir) = std::env::var("MEMZOO_SIGNAL_RUN") else {
        return;
    };
    let dir = PathBuf::from(dir);
    if std::env::var("MEMZOO_SIGNAL_AFTER").is_ok() {
        // Train to the end, then wait: a signal now must have its default action again.
        run(&dir, 2, false).unwrap();
        std::fs::write(dir.join("trained"), "").unwrap();
        std::thread::sleep(std::time::Duration::from_secs(60));
        return;
    }
    let every = std::env::var("MEMZOO_SIGNAL_CHECKPOINT_EVERY").map_or(2, |s| s.parse().unwrap());
    let dev = flex().autodiff();
    let options = RunOptions {
        run_dir: dir.clone(),
        resume: false,
        quiet: true,
    };
    let config = tiny_train(1_000_000).with_checkpoint_every(every);
    let model = tiny_xl().init(&dev).unwrap();
    let outcome = train(model, &config, &mut batcher(), None, &options).unwrap();
    let summary = serde_json::json!({"signal": outcome.signal, "steps": outcome.steps});
    std::fs::write(dir.join("outcome.json"), summary.to_string()).unwrap();
}

/// SIGTERM and SIGINT: the step in flight finishes, a checkpoint of it is written, `train`
/// returns normally with the signal (the CLI then exits 128 + signal).
#[test]
fn stop_signals_checkpoint_and_stop() {
    #[cfg(unix)]
    for (signal, number) in [("TERM", 15), ("INT", 2)] {
        let dir = scratch(&format!("signal-{signal}"));
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "reliability::signal_child",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env("MEMZOO_SIGNAL_RUN", &dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait until it trains (a few steps recorded).
        let start = std::time::Instant::now();
        while loss_records_or_empty(&dir).len() < 3 {
            assert!(start.elapsed().as_secs() < 120, "the child never trained");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let status = std::process::Command::new("kill")
            .args(["-s", signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let exit = child.wait().unwrap();
        assert!(exit.success(), "SIG{signal}: the child ended with {exit}");
        let outcome: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("outcome.json")).unwrap())
                .unwrap();
        assert_eq!(outcome["signal"], number, "SIG{signal}");
        let steps = outcome["steps"].as_u64().unwrap() as usize;
        let latest = checkpoint::latest(&dir.join("checkpoints"))
            .unwrap()
            .unwrap();
        let state = checkpoint::read_trainer_state(&latest).unwrap();
        assert_eq!(
            state.step, steps,
            "SIG{signal}: the checkpoint is the last step"
        );
        assert_eq!(loss_records(&dir).len(), steps);
        checkpoint::verify(&latest).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn loss_records_or_empty(dir: &Path) -> Vec<usize> {
    match std::fs::read_to_string(dir.join("metrics.jsonl")) {
        Ok(text) if text.ends_with('\n') => loss_records(dir),
        _ => Vec::new(),
    }
}

/// Bad configs, overrides, data, devices and options of every command: an error naming the
/// bad value, never a panic.
#[test]
fn bad_inputs_are_errors_naming_the_value() {
    let dir = scratch("bad-inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let run_dir = dir.join("run");
    let empty_file = dir.join("empty.txt");
    std::fs::write(&empty_file, "").unwrap();
    let bad_toml = dir.join("bad.toml");
    std::fs::write(&bad_toml, "[train\nsteps = ").unwrap();
    let unknown_toml = dir.join("unknown.toml");
    std::fs::write(&unknown_toml, "[train]\nstepz = 3\n").unwrap();
    let empty_source = format!("data.source={:?}", empty_file.display().to_string());
    let train_with = |extra: &[&str]| cli_train(extra, &run_dir, false, false).map(|_| ());
    let file_config = |path: &Path| RunConfig::resolve(Some(path), &[]).map(|_| ());
    let eval = |split: &str, tgt: Option<usize>, max: Option<usize>| {
        commands::eval(&run_dir, "flex", split, None, tgt, max, true)
    };
    let reformer = tiny_lsh_layer(&["train.tgt_len=10"]);
    let with = |base: &[&'static str], more: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(more).copied().collect()
    };
    // (case, --set overrides of a tiny run, what the error names)
    #[rustfmt::skip]
    let overrides: &[(&str, &[&str], &[&str])] = &[
        ("vocab below the data's ids", &["model.vocab_size=64"], &["model.vocab_size = 64", "token id"]),
        ("memorizing vocab", &["model.preset=memorizing-tiny", "model.n_layers=2",
            "model.layers=[\"t5\", \"knn\"]", "model.vocab_size=32"],
            &["vocab_size = 32", "token id"]),
        ("Memorizing same_length", &["model.preset=memorizing-tiny", "model.n_layers=2",
            "model.layers=[\"t5\", \"knn\"]", "model.same_length=true"],
            &["same_length"]),
        ("eval_segments 0", &["train.eval_segments=0"], &["train.eval_segments", "got 0"]),
        ("learning rate negative", &["train.schedule.lr=-1.0"], &["train.schedule.lr must be positive, got -1"]),
        ("steps 0", &["train.steps=0"], &["train.steps must be positive, got 0"]),
        ("batch 0", &["train.batch=0"], &["train.batch must be positive, got 0"]),
        ("clip_norm negative", &["train.clip_norm=-1.0"], &["train.clip_norm", "-1"]),
        ("weight decay NaN", &["train.weight_decay=nan"], &["nan", "f64"]),
        ("replicas > batch", &["train.replicas=5"], &["replicas", "5"]),
        ("unknown field", &["model.bogus_field=1"], &["bogus_field"]),
        ("unknown section", &["bogus.steps=1"], &["bogus"]),
        ("ill-typed value", &["train.steps=\"many\""], &["many"]),
        ("--set without =", &["train.steps"], &["train.steps", "section.field=value"]),
        ("data file missing", &["data.source=\"/nonexistent/memzoo.txt\""], &["/nonexistent/memzoo.txt", "does not exist"]),
        ("data file empty", &[empty_source.as_str()], &["empty.txt", "empty"]),
    ];
    for (what, sets, expect) in overrides {
        assert_mentions(&train_with(sets).expect_err(what), expect, what);
    }
    let cases: Vec<(&str, Result<(), CliError>, &[&str])> = vec![
        (
            "Reformer beyond memory",
            train_with(&with(&reformer, &["model.lsh.n_rounds=1000000000"])),
            &["model.lsh.n_rounds = 1000000000", "GiB"],
        ),
        (
            "Reformer 0 rounds",
            train_with(&with(&reformer, &["model.lsh.n_rounds=0"])),
            &["n_rounds must be positive, got 0"],
        ),
        (
            "Reformer odd buckets",
            train_with(&with(&reformer, &["model.lsh.n_buckets=3"])),
            &["n_buckets", "3"],
        ),
        (
            "Reformer tgt_len beyond its axial positions",
            train_with(&with(
                &reformer,
                &[r#"model.axial={"shape": [2, 4], "dims": [8, 8], "summed": false}"#],
            )),
            &["train.tgt_len (10)", "model.axial.shape 2 x 4 = 8"],
        ),
        (
            "config file missing",
            file_config(&dir.join("none.toml")),
            &["none.toml"],
        ),
        (
            "config not TOML",
            file_config(&bad_toml),
            &["bad.toml", "not valid TOML"],
        ),
        (
            "config unknown field",
            file_config(&unknown_toml),
            &["stepz"],
        ),
        (
            "device unknown",
            commands::train(
                &RunConfig::resolve(None, &tiny_cli(&[])).unwrap(),
                "tpu",
                &run_dir,
                false,
                false,
                true,
                true,
            )
            .map(|_| ()),
            &["tpu"],
        ),
        (
            "device not compiled",
            commands::train(
                &RunConfig::resolve(None, &tiny_cli(&[])).unwrap(),
                "cuda",
                &run_dir,
                false,
                false,
                true,
                true,
            )
            .map(|_| ()),
            &["cuda"],
        ),
        (
            "resume without a run",
            cli_train(&[], &dir.join("nothing"), true, false).map(|_| ()),
            &["nothing"],
        ),
        (
            "eval without a run",
            eval("test", None, None),
            &["config.toml"],
        ),
        (
            "duplication 0 rounds",
            commands::duplication("flex", 0, 16, 1, 0.0, true),
            &["train_rounds 0"],
        ),
        (
            "duplication odd length",
            commands::duplication("flex", 1, 15, 1, 0.0, true),
            &["len 15"],
        ),
        (
            "recall lr NaN",
            commands::recall("flex", "both", 1, f64::NAN, 2, 0, true),
            &["--lr", "NaN"],
        ),
        (
            "recall lr negative",
            commands::recall("flex", "both", 1, -1.0, 2, 0, true),
            &["--lr", "-1"],
        ),
        (
            "recall lr infinite",
            commands::recall("flex", "both", 1, f64::INFINITY, 2, 0, true),
            &["--lr", "inf"],
        ),
        (
            "recall unknown model",
            commands::recall("flex", "gpt", 1, 1e-3, 2, 0, true),
            &["gpt"],
        ),
        (
            "recall 0 steps",
            commands::recall("flex", "both", 0, 1e-3, 2, 0, true),
            &["--steps", "0"],
        ),
    ];
    let n = overrides.len() + cases.len();
    for (what, result, expect) in cases {
        let err = result.err().unwrap_or_else(|| panic!("{what}: accepted"));
        assert_mentions(&err, expect, what);
    }
    // Evaluation options against a real run.
    cli_train(&[], &run_dir, false, false).unwrap();
    for (what, result, expect) in [
        (
            "eval 0 segments",
            eval("test", None, Some(0)),
            &["--max-segments", "0"][..],
        ),
        (
            "eval tgt_len 0",
            eval("test", Some(0), None),
            &["--tgt-len", "0"],
        ),
        ("eval unknown split", eval("bogus", None, None), &["bogus"]),
    ] {
        assert_mentions(&result.expect_err(what), expect, what);
    }
    let generate = |tokens: usize| {
        let opts = generate_options("ab", tokens);
        commands::generate(&run_dir, "flex", &opts, true)
    };
    for tokens in [usize::MAX, 1 << 40] {
        let err = generate(tokens).expect_err("a context beyond memory");
        assert_mentions(
            &err,
            &[&format!("--tokens {tokens}"), "GiB"],
            "generate --tokens",
        );
    }
    generate(3).unwrap();
    eval("valid", None, Some(1)).unwrap();
    eprintln!("{} bad inputs refused with a clear error", n + 5);
    let _ = std::fs::remove_dir_all(dir);
}

/// The Reformer trains at a length that is not a multiple of its bucket size (it turned NaN).
#[test]
fn reformer_trains_at_a_padded_length() {
    let dir = scratch("reformer-padded");
    let sets = [
        &TINY_REFORMER[..],
        &["train.tgt_len=10", "train.steps=3", "train.log_every=1"],
    ]
    .concat();
    cli_train(&sets, &dir, false, false).unwrap();
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let norms: Vec<f64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["metric"] == "grad_norm")
        .map(|v| v["value"].as_f64().unwrap())
        .collect();
    assert_eq!(norms.len(), 3);
    assert!(norms.iter().all(|g| g.is_finite() && *g > 0.0), "{norms:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A kNN memory header whose sizes overflow, or that is not JSON, is an error naming it.
#[test]
fn damaged_knn_memory_headers_are_errors() {
    use memzoo_memory::{IndexKind, KnnMemoryConfig, open};
    let dev = flex();
    let config = KnnMemoryConfig::new(2, 4)
        .with_kind(IndexKind::Exact)
        .with_max_memories(8);
    let index = config.init(1, &dev).unwrap();
    let dir = scratch("knn-header");
    index.save(&dir).unwrap();
    open(&dir, &config, &dev).unwrap();
    let header = dir.join("header.json");
    let pristine = std::fs::read_to_string(&header).unwrap();
    // 1e18 slots: 8e18 floats, which fit in a usize but not in the file (the size check used
    // to overflow); 1e19: the float count itself overflows.
    edit_json(&header, |v| {
        v["slots"] = serde_json::json!(1_000_000_000_000_000_000u64)
    });
    let err = open(&dir, &config, &dev).expect_err("1e18").to_string();
    assert_mentions(
        &err,
        &["keys.f32 has 0 bytes", "8000000000000000000 floats"],
        "slots 1e18",
    );
    edit_json(&header, |v| {
        v["slots"] = serde_json::json!(10_000_000_000_000_000_000u64)
    });
    let err = open(&dir, &config, &dev).expect_err("1e19").to_string();
    assert_mentions(
        &err,
        &["slots 10000000000000000000", "overflow"],
        "slots 1e19",
    );
    edit_json(&header, |v| v["slots"] = serde_json::json!(1_000_000));
    let err = open(&dir, &config, &dev).expect_err("size").to_string();
    assert_mentions(&err, &["keys.f32", "bytes"], "slots 1e6");
    std::fs::write(&header, &pristine[..pristine.len() / 2]).unwrap();
    let err = open(&dir, &config, &dev).expect_err("cut").to_string();
    assert_mentions(&err, &["header.json"], "cut header");
    let _ = std::fs::remove_dir_all(dir);
}

/// A model whose loss is finite but whose gradient is not: `sqrt` of a zero parameter adds 0 to
/// the logits, and its derivative at 0 is infinite (the Reformer's padded LSH path had this).
#[derive(burn::module::Module, Debug)]
struct NanGradient {
    xl: TransformerXl,
    zero: Param<Tensor<1>>,
}

impl memzoo_train::RecurrentModel for NanGradient {
    type State = memzoo_stack::XlState;

    fn family(&self) -> &'static str {
        "xl"
    }

    fn vocab_size(&self) -> usize {
        self.xl.vocab_size
    }

    fn segment_logits(
        &self,
        inputs: burn::tensor::Tensor<2, burn::tensor::Int>,
        state: &mut Self::State,
        reset: &[bool],
    ) -> Result<Tensor<3>, memzoo_stack::XlError> {
        let logits = self.xl.segment_logits(inputs, state, reset)?;
        Ok(logits + self.zero.val().sqrt().reshape([1, 1, 1]))
    }
}

impl memzoo_train::SegmentModel for NanGradient {
    fn save_state(state: &Self::State, dir: &Path) -> Result<(), TrainError> {
        TransformerXl::save_state(state, dir)
    }

    fn load_state(
        &self,
        dir: &Path,
        device: &burn::tensor::Device,
    ) -> Result<Self::State, TrainError> {
        self.xl.load_state(dir, device)
    }
}

/// The check before every update: a non-finite gradient norm stops the run at step 1, names the
/// parameter, leaves no checkpoint behind; the loss was finite, so it does not blame the lr.
#[test]
fn a_non_finite_gradient_stops_the_run_naming_the_parameter() {
    use memzoo_train::RecurrentModel;
    let dev = flex().autodiff();
    let model = NanGradient {
        xl: tiny_xl().init(&dev).unwrap(),
        zero: Param::from_tensor(Tensor::zeros([1], &dev)),
    };
    let dir = scratch("nan-gradient");
    let options = RunOptions {
        run_dir: dir.clone(),
        resume: false,
        quiet: true,
    };
    let err = train(model, &tiny_train(4), &mut batcher(), None, &options)
        .err()
        .expect("a NaN gradient must stop the run")
        .to_string();
    assert_mentions(
        &err,
        &[
            "gradient norm is",
            "at step 1",
            "`zero`",
            "not finite",
            "parameters are unchanged",
        ],
        "NaN gradient",
    );
    assert!(!err.contains("lower train.schedule.lr"), "{err}");
    eprintln!("{err}");
    assert!(!dir.join("checkpoints/latest").exists());
    // The same model without the NaN path trains (the check does not fire on healthy runs).
    let healthy = tiny_xl().init(&dev).unwrap();
    assert_eq!(healthy.family(), "xl");
    let _ = std::fs::remove_dir_all(dir);
}

/// Token ids beyond the model's vocabulary, straight through the trainer: an error naming the id.
#[test]
fn token_ids_beyond_the_vocabulary_are_named_by_the_trainer() {
    let dev = flex().autodiff();
    let dir = scratch("vocab");
    let options = RunOptions {
        run_dir: dir.clone(),
        resume: false,
        quiet: true,
    };
    let model = tiny_xl().with_vocab_size(64).init(&dev).unwrap();
    let err = train(model, &tiny_train(2), &mut batcher(), None, &options)
        .err()
        .expect("ids >= 64")
        .to_string();
    assert_mentions(
        &err,
        &["training data holds token id", "vocabulary of 64"],
        "vocab 64",
    );
    let model = tiny_xl().with_vocab_size(64).init(&flex()).unwrap();
    let err = memzoo_train::evaluate(&model, &mut batcher(), 16, Some(2))
        .expect_err("ids >= 64")
        .to_string();
    assert_mentions(
        &err,
        &["evaluation data holds token id", "vocabulary of 64"],
        "eval vocab 64",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `kill -9` at any moment, a checkpoint being written at every step: what is on disk is
/// always a whole, verified checkpoint (or a stale `.tmp-*` folder the next save removes), and
/// a resume continues from it with every step's metrics recorded once.
#[test]
fn kill_9_while_checkpointing_leaves_an_intact_checkpoint() {
    #[cfg(unix)]
    for (i, delay_ms) in [0u64, 3, 11].into_iter().enumerate() {
        let dir = scratch(&format!("kill-9-{i}"));
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "reliability::signal_child",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env("MEMZOO_SIGNAL_RUN", &dir)
            .env("MEMZOO_SIGNAL_CHECKPOINT_EVERY", "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while loss_records_or_empty(&dir).len() < 4 {
            assert!(start.elapsed().as_secs() < 120, "the child never trained");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let latest = checkpoint::latest(&dir.join("checkpoints"))
            .unwrap()
            .expect("a checkpoint");
        checkpoint::verify(&latest).unwrap();
        let step = checkpoint::read_trainer_state(&latest).unwrap().step;
        assert!(step >= 3, "kill {i}: latest is step {step}");
        // Resume two steps further: it continues from `step`, and no step is recorded twice.
        let resumed = run(&dir, step + 2, true).unwrap();
        assert_eq!(resumed.steps, step + 2);
        assert_eq!(loss_records(&dir), vec![1; step + 2], "kill {i}");
        let leftovers: Vec<String> = std::fs::read_dir(dir.join("checkpoints"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "kill {i}: {leftovers:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Resuming from an older checkpoint because the newest is damaged, then checkpointing with
/// `keep_checkpoints = 1`: the damaged later checkpoint goes, the one just written stays (the
/// pruning kept the highest step numbers and deleted the new checkpoint instead).
#[test]
fn pruning_after_a_fallback_keeps_the_new_checkpoint() {
    let dev = flex().autodiff();
    let dir = scratch("prune-fallback");
    let options = |resume| RunOptions {
        run_dir: dir.clone(),
        resume,
        quiet: true,
    };
    let config = |steps, every, keep| {
        tiny_train(steps)
            .with_checkpoint_every(every)
            .with_keep_checkpoints(keep)
    };
    let model = tiny_xl().init(&dev).unwrap();
    train(
        model,
        &config(4, 2, 2),
        &mut batcher(),
        None,
        &options(false),
    )
    .unwrap();
    flip_byte(&dir.join("checkpoints/step-00000004/model.bpk"), 0.5);
    let model = tiny_xl().init(&dev).unwrap();
    let outcome = train(
        model,
        &config(3, 1, 1),
        &mut batcher(),
        None,
        &options(true),
    )
    .unwrap();
    assert_eq!(outcome.steps, 3);
    let latest = checkpoint::latest(&dir.join("checkpoints"))
        .unwrap()
        .unwrap();
    assert!(latest.ends_with("step-00000003"), "{}", latest.display());
    checkpoint::verify(&latest).unwrap();
    assert!(!dir.join("checkpoints/step-00000004").exists());
    assert!(!dir.join("checkpoints/step-00000002").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// Once training returns, SIGTERM and SIGINT have their default action again (the process
/// ends by the signal); they are not swallowed for the rest of the process.
#[test]
fn signals_act_as_before_once_training_returns() {
    #[cfg(unix)]
    for (signal, number) in [("TERM", 15), ("INT", 2)] {
        use std::os::unix::process::ExitStatusExt;
        let dir = scratch(&format!("signal-after-{signal}"));
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "reliability::signal_child",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env("MEMZOO_SIGNAL_RUN", &dir)
            .env("MEMZOO_SIGNAL_AFTER", "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while !dir.join("trained").exists() {
            assert!(
                start.elapsed().as_secs() < 120,
                "the child never finished training"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let sent = std::process::Command::new("kill")
            .args(["-s", signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let exit = child.wait().unwrap();
        assert_eq!(
            exit.signal(),
            Some(number),
            "SIG{signal} after training: {exit}"
        );
        assert!(start.elapsed().as_secs() < 50, "SIG{signal} was ignored");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Train records of `metrics.jsonl` (step, metric, value), without the timing.
fn train_records(dir: &Path) -> Vec<(u64, String, f64)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["metric"] != "tokens_per_s")
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                format!(
                    "{}/{}",
                    v["split"].as_str().unwrap(),
                    v["metric"].as_str().unwrap()
                ),
                v["value"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// 4 steps straight, and the same run resumed from its step-2 checkpoint to 4 (in the same
/// process, after the straight run drew from every generator): the records of steps 3 and 4
/// and the step-4 model must be the same, bit for bit.
fn straight_equals_resumed(name: &str, sets: &[&str]) {
    let a = scratch(&format!("exact-{name}"));
    let b = scratch(&format!("exact-{name}-resumed"));
    let mut sets = sets.to_vec();
    sets.extend([
        "train.steps=4",
        "train.checkpoint_every=2",
        "train.keep_checkpoints=3",
        "train.eval_every=0",
    ]);
    cli_train(&sets, &a, false, false).unwrap();
    copy_dir(&a, &b);
    std::fs::remove_dir_all(b.join("checkpoints/step-00000004")).unwrap();
    std::fs::write(b.join("checkpoints/latest"), "step-00000002").unwrap();
    cli_train(&sets, &b, true, false).unwrap();
    let (straight, resumed) = (train_records(&a), train_records(&b));
    assert!(
        straight
            .iter()
            .any(|(s, m, _)| *s == 4 && m == "train/loss"),
        "{name}: {straight:?}"
    );
    assert_eq!(straight, resumed, "{name}: straight vs resumed records");
    // (optim.bpk is not compared byte for byte: its moments are keyed by the parameters' ids,
    // which differ between two models built apart; those moments made steps 3 and 4 above.)
    let model = |d: &Path| std::fs::read(d.join("checkpoints/step-00000004/model.bpk")).unwrap();
    assert!(
        model(&a) == model(&b),
        "{name}: the step-4 model.bpk differs"
    );
    let _ = std::fs::remove_dir_all(a);
    let _ = std::fs::remove_dir_all(b);
}

/// The child side of `resume_with_randomness_is_exact`: alone in its process, as the backend's
/// generator is one per process (tests running beside it would draw from it). Does nothing
/// when run on its own.
#[test]
#[ignore = "run by resume_with_randomness_is_exact in a child process"]
fn exact_resume_child() {
    if std::env::var("MEMZOO_EXACT_RESUME_CHILD").is_err() {
        return;
    }
    // Transformer-XL with dropout on every site and on the attention probabilities, with one
    // replica and with two (their threads run in any order).
    straight_equals_resumed("xl-dropout", &["model.dropout=0.1", "model.dropatt=0.1"]);
    straight_equals_resumed(
        "xl-dropout-2-replicas",
        &["model.dropout=0.1", "model.dropatt=0.1", "train.replicas=2"],
    );
    // The Reformer: seeded, replayable dropout and fresh LSH rotations every step, with one
    // replica and with two (their threads draw in any order).
    let reformer = [&TINY_REFORMER[..], &["model.dropout=0.1"]].concat();
    straight_equals_resumed("reformer", &reformer);
    let mut two = reformer.to_vec();
    two.push("train.replicas=2");
    straight_equals_resumed("reformer-2-replicas", &two);
    // The Memorizing Transformer (kNN memories in the checkpoint), with one replica and two.
    let memorizing = [&TINY_MEMORIZING[..], &["model.dropout=0.1"]].concat();
    straight_equals_resumed("memorizing-dropout", &memorizing);
    let mut two = memorizing.to_vec();
    two.push("train.replicas=2");
    straight_equals_resumed("memorizing-dropout-2-replicas", &two);
}

/// The step-1 training loss of a 1-step run with `sets`.
fn first_loss(name: &str, sets: &[&str]) -> f64 {
    let dir = scratch(&format!("first-loss-{name}"));
    let mut sets = sets.to_vec();
    sets.extend(["train.steps=1", "train.eval_every=0"]);
    cli_train(&sets, &dir, false, false).unwrap();
    let loss = train_records(&dir)
        .into_iter()
        .find(|(s, m, _)| *s == 1 && m == "train/loss")
        .map(|(_, _, v)| v)
        .unwrap_or_else(|| panic!("{name}: no step-1 loss"));
    let _ = std::fs::remove_dir_all(dir);
    loss
}

/// The runs `resume_with_randomness_is_exact` replays draw dropout masks: with two replicas,
/// XL's and the Memorizing Transformer's step-1 losses with dropout 0.1 are not those with
/// dropout 0 (the same weights, data and seed).
#[test]
fn the_exact_resume_runs_use_dropout() {
    let xl = |p: &str| {
        [
            format!("model.dropout={p}"),
            format!("model.dropatt={p}"),
            "train.replicas=2".to_string(),
        ]
    };
    let loss = |name: &str, sets: [String; 3]| {
        first_loss(name, &sets.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (off, on) = (loss("xl-off", xl("0")), loss("xl-on", xl("0.1")));
    assert!(
        (on - off).abs() > 1e-4,
        "XL dropout changed nothing: {on} vs {off}"
    );
    let memorizing = |p: &str| {
        vec![
            "model.preset=memorizing-tiny".to_string(),
            "model.n_layers=2".into(),
            "model.d_model=16".into(),
            "model.n_heads=2".into(),
            "model.d_inner=32".into(),
            "model.mem_len=8".into(),
            format!("model.dropout={p}"),
            "model.layers=[\"t5\", \"knn\"]".into(),
            "model.knn.top_k=4".into(),
            "model.knn.max_memories=64".into(),
            "train.replicas=2".into(),
        ]
    };
    let m = |name: &str, p: &str| {
        let sets = memorizing(p);
        first_loss(name, &sets.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (off, on) = (m("mem-off", "0"), m("mem-on", "0.1"));
    assert!(
        (on - off).abs() > 1e-4,
        "Memorizing dropout changed nothing: {on} vs {off}"
    );
}

/// 4 steps straight == 2 steps + `--resume` to 4, bit for bit, with randomness: XL and the
/// Memorizing Transformer with dropout (the backend's generator, reseeded from `train.seed`
/// and the step before every step), the Reformer with seeded dropout and rotations (its step
/// counter set from the step), with one replica and (seeded) with two.
#[test]
fn resume_with_randomness_is_exact() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "reliability::exact_resume_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env("MEMZOO_EXACT_RESUME_CHILD", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file under `dir` (relative path, bytes), sorted.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path.strip_prefix(dir).unwrap().to_path_buf(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// `train --overwrite` and `import --overwrite` check every new input (data file, vocabulary,
/// device, import source) before they remove the old run: a bad one is an error naming it, and
/// the old run is left as it was, byte for byte.
#[test]
fn overwrite_checks_the_new_inputs_before_removing_the_old_run() {
    let dir = scratch("overwrite-inputs");
    cli_train(&[], &dir, false, false).unwrap();
    let before = snapshot(&dir);
    assert!(before.iter().any(|(p, _)| p.ends_with("model.bpk")));
    let missing = dir.with_extension("missing.txt");
    let data = format!("data.source={}", missing.display());
    let cuda_built = "cuda"
        .parse::<memzoo::backend::DeviceSpec>()
        .is_ok_and(|s| s.is_compiled());
    let mut cases = vec![
        (
            "a missing data file",
            vec![data.as_str()],
            "flex",
            "missing.txt",
        ),
        (
            "a vocabulary too small for the data",
            vec!["model.vocab_size=10"],
            "flex",
            "vocab_size",
        ),
    ];
    if !cuda_built {
        cases.push(("a device not built in", vec![], "cuda", "cuda"));
    }
    for (what, sets, device, named) in cases {
        let config = RunConfig::resolve(None, &tiny_cli(&sets)).unwrap();
        let err = commands::train(&config, device, &dir, false, true, true, true)
            .expect_err(what)
            .to_string();
        assert!(err.contains(named), "{what}: {err}");
        assert!(
            snapshot(&dir) == before,
            "{what}: the old run changed ({err})"
        );
    }
    let src = dir.join("no-such-checkpoint");
    let err = memzoo::import::import("hf-transfo-xl", &src, &dir, None, true, true)
        .expect_err("a missing import source")
        .to_string();
    assert!(err.contains("no-such-checkpoint"), "{err}");
    assert!(
        snapshot(&dir) == before,
        "import: the old run changed ({err})"
    );
    // Good inputs: the old run goes, an imported run's word vocabulary with it (a byte-level
    // run must not be read through it).
    std::fs::write(dir.join("vocab.json"), "[]").unwrap();
    cli_train(&[], &dir, false, true).unwrap();
    assert!(!dir.join("vocab.json").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// [`snapshot`] without the lock file (its holder's pid and command change with each process).
fn run_snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = snapshot(dir);
    files.retain(|(p, _)| p != Path::new(memzoo_train::lock::LOCK_FILE));
    files
}

/// `--overwrite` sets the old run aside (`<run>/.replaced`) until the new one has written its
/// first checkpoint: a new run that fails after its inputs were checked (a non-finite loss at
/// step 1, before any checkpoint) leaves the old run as it was, byte for byte; a process that
/// died in the middle of a replacement is undone (no new checkpoint) or finished (one) by the
/// next process that locks the run; a good replacement leaves nothing aside. `import
/// --overwrite` goes the same way.
#[test]
fn overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint() {
    use memzoo_train::replace;
    let dir = scratch("overwrite-aside");
    cli_train(&[], &dir, false, false).unwrap();
    let before = run_snapshot(&dir);
    assert!(before.iter().any(|(p, _)| p.ends_with("model.bpk")));
    let aside = dir.join(replace::REPLACED);

    // A new run that fails at step 1 (inputs good, weights that overflow).
    let err = cli_train(&["model.init_std=1e30"], &dir, false, true)
        .expect_err("init_std 1e30")
        .to_string();
    assert_mentions(&err, &["step 1", "init_std"], "failing new run");
    assert!(
        run_snapshot(&dir) == before,
        "a failed new run changed the old"
    );
    assert!(!aside.exists());

    // A process that died after setting the old run aside, before its first checkpoint (its
    // config and a metrics line written): the next train puts the old run back, then refuses
    // to mix (no --overwrite).
    assert!(replace::set_aside(&dir).unwrap());
    std::fs::write(dir.join("config.toml"), "the new run's").unwrap();
    std::fs::write(dir.join("metrics.jsonl"), "{\"step\":1}\n").unwrap();
    let err = cli_train(&[], &dir, false, false).unwrap_err();
    assert_mentions(&err, &["already holds a run"], "after a dead replacement");
    assert!(
        run_snapshot(&dir) == before,
        "a dead replacement was not undone"
    );

    // A process that died while setting the old run aside (its checkpoints moved, nothing
    // else): put back by `--resume`, which continues the old run.
    let replacing = dir.join(".replacing");
    std::fs::create_dir(&replacing).unwrap();
    std::fs::rename(dir.join("checkpoints"), replacing.join("checkpoints")).unwrap();
    assert_eq!(
        cli_train(&["train.steps=3"], &dir, true, false).unwrap(),
        None
    );
    assert!(!replacing.exists());
    assert_eq!(loss_records(&dir), vec![1, 1, 1]);

    // A process that died after the new run's first checkpoint: the new run is kept, the old
    // one deleted.
    assert!(replace::set_aside(&dir).unwrap());
    copy_dir(&aside.join("checkpoints"), &dir.join("checkpoints"));
    assert!(replace::recover(&dir).unwrap().is_some());
    assert!(!aside.exists());
    assert!(dir.join("checkpoints/step-00000003").is_dir());
    assert!(!dir.join("metrics.jsonl").exists());

    // A good replacement: the new run alone, nothing aside.
    cli_train(&["train.steps=3"], &dir, false, true).unwrap();
    assert_eq!(loss_records(&dir), vec![1, 1, 1]);
    assert!(!aside.exists());

    // import --overwrite onto a trained run: the imported run alone, nothing aside; and a
    // dead replacement is undone by the next import before it refuses.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl/wt103");
    let data = dir.with_extension("text.txt");
    std::fs::write(&data, "the cat sat on the mat. ".repeat(400)).unwrap();
    let data = Some(data.display().to_string());
    memzoo::import::import("hf-transfo-xl", &src, &dir, data.clone(), true, true).unwrap();
    assert!(!aside.exists());
    assert!(!dir.join("metrics.jsonl").exists());
    assert!(dir.join("checkpoints/step-00000000").is_dir());
    let imported = run_snapshot(&dir);
    assert!(replace::set_aside(&dir).unwrap());
    std::fs::write(dir.join("config.toml"), "half written").unwrap();
    let err = memzoo::import::import("hf-transfo-xl", &src, &dir, data, false, true)
        .expect_err("no --overwrite")
        .to_string();
    assert_mentions(
        &err,
        &["already holds a run"],
        "import after a dead replacement",
    );
    assert!(
        run_snapshot(&dir) == imported,
        "import: a dead replacement was not undone"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The child side of `one_process_per_run_directory`: holds the lock of `MEMZOO_LOCK_RUN`
/// until a `release` file appears there (or a minute passes). Does nothing when run on its own.
#[test]
#[ignore = "run by one_process_per_run_directory in a child process"]
fn lock_holder_child() {
    let Ok(dir) = std::env::var("MEMZOO_LOCK_RUN") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let _lock = memzoo_train::lock::RunLock::acquire(&dir, "lock_holder_child").unwrap();
    std::fs::write(dir.join("locked"), "").unwrap();
    let start = std::time::Instant::now();
    while !dir.join("release").exists() && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// One process per run directory: while another process holds a run's lock, `train`
/// (`--resume`, `--overwrite`), `import --overwrite` and `export` are refused with a message
/// naming the directory and the holder's pid, and the run is untouched; once the holder is
/// killed (`kill -9`: no clean-up), the next process takes the lock over.
#[test]
fn one_process_per_run_directory() {
    use memzoo_train::lock::{LOCK_FILE, RunLock};
    let dir = scratch("lock");
    cli_train(&[], &dir, false, false).unwrap();
    let metrics = std::fs::read(dir.join("metrics.jsonl")).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "reliability::lock_holder_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env("MEMZOO_LOCK_RUN", &dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !dir.join("locked").exists() {
        assert!(start.elapsed().as_secs() < 60, "the child never locked");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let holder = format!("pid {}", child.id());
    let shown = dir.display().to_string();
    let expect = [shown.as_str(), holder.as_str(), "in use by another process"];
    let err = cli_train(&["train.steps=3"], &dir, true, false).unwrap_err();
    assert_mentions(&err, &expect, "train --resume");
    let err = cli_train(&[], &dir, false, true).unwrap_err();
    assert_mentions(&err, &expect, "train --overwrite");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl/plain");
    let err = memzoo::import::import("hf-transfo-xl", &src, &dir, None, true, true).unwrap_err();
    assert_mentions(&err, &expect, "import --overwrite");
    let out = dir.with_extension("export");
    let err = memzoo::import::export("hf-transfo-xl", &dir, &out, &flex(), true).unwrap_err();
    assert_mentions(&err, &expect, "export");
    assert_eq!(std::fs::read(dir.join("metrics.jsonl")).unwrap(), metrics);
    assert!(dir.join("checkpoints/step-00000002").is_dir());
    // Killed while holding it: the lock is free again, the next process writes its own pid.
    child.kill().unwrap();
    child.wait().unwrap();
    let lock = RunLock::acquire(&dir, "the test").unwrap();
    let record = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
    assert_eq!(record, format!("pid {} (the test)\n", std::process::id()));
    drop(lock);
    cli_train(&["train.steps=3"], &dir, true, false).unwrap();
    assert_eq!(loss_records(&dir), vec![1, 1, 1]);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--resume` drops only the `metrics.jsonl` records past the checkpoint and a torn last line;
/// a line in the middle that is not a record is an error naming its number, and the file is
/// left as it was.
#[test]
fn resume_drops_only_later_records_and_a_torn_last_line() {
    use memzoo_train::metrics::drop_records_after;
    let dir = scratch("metrics-drop");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("metrics.jsonl");
    let rec = |s: usize| format!(r#"{{"step":{s},"split":"train","metric":"loss","value":1.0}}"#);
    // Records past step 2 and a torn last line go.
    let text = format!(
        "{}\n{}\n{}\n{}\n{{\"step\":5,\"spl",
        rec(1),
        rec(2),
        rec(3),
        rec(4)
    );
    std::fs::write(&path, &text).unwrap();
    assert_eq!(drop_records_after(&dir, 2).unwrap(), 3);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{}\n{}\n", rec(1), rec(2))
    );
    // A damaged line in the middle: an error naming line 2, nothing rewritten.
    let text = format!("{}\nnot a record\n{}\n{}\n", rec(1), rec(2), rec(3));
    std::fs::write(&path, &text).unwrap();
    let err = drop_records_after(&dir, 2)
        .expect_err("a damaged line in the middle")
        .to_string();
    assert_mentions(&err, &["metrics.jsonl", "line 2"], "damaged middle line");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    // Valid JSON without a step is not a record either.
    std::fs::write(&path, format!("{}\n{{\"value\":1}}\n{}\n", rec(1), rec(2))).unwrap();
    let err = drop_records_after(&dir, 2)
        .expect_err("no step")
        .to_string();
    assert_mentions(&err, &["metrics.jsonl", "line 2"], "a line without a step");
    let _ = std::fs::remove_dir_all(dir);
}

/// A `trainer.json` without its `files` or `sha256` field (a hand edit, an older layout) is an
/// error naming the file and the field, never a load without verification.
#[test]
fn trainer_json_without_its_checksums_is_refused() {
    let dir = scratch("no-checksums");
    run(&dir, 2, false).unwrap();
    let pristine = dir.join("checkpoints/step-00000002");
    let dev = flex();
    for field in ["files", "sha256"] {
        let copy = dir.join(format!("case-{field}/step-00000002"));
        copy_dir(&pristine, &copy);
        edit_json(&copy.join("trainer.json"), |v| {
            v.as_object_mut().unwrap().remove(field);
        });
        // A flipped byte that only the sums would catch.
        flip_byte(&copy.join("model.bpk"), 0.9);
        let err = checkpoint::verify(&copy).expect_err(field).to_string();
        assert_mentions(&err, &["trainer.json", &format!("`{field}`")], field);
        let err = checkpoint::load_model(&copy, tiny_xl().init(&dev).unwrap())
            .expect_err(field)
            .to_string();
        assert_mentions(&err, &["trainer.json", &format!("`{field}`")], field);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Integers a TOML config cannot hold (above i64::MAX) are refused when the config is
/// resolved, naming the field and the limit: memzoo never writes a config.toml it cannot read
/// back.
#[test]
fn config_integers_beyond_toml_are_refused() {
    for field in ["train.seed", "train.steps", "train.schedule.warmup"] {
        let set = format!("{field}=18446744073709551615");
        let err = RunConfig::resolve(None, &tiny_cli(&[set.as_str()]))
            .expect_err(field)
            .to_string();
        assert_mentions(&err, &[field, "9223372036854775807"], field);
    }
    // The largest one it holds round-trips.
    let config = RunConfig::resolve(None, &tiny_cli(&["train.seed=9223372036854775807"])).unwrap();
    let dir = scratch("toml-limit");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), config.to_toml()).unwrap();
    let back = RunConfig::from_run_dir(&dir, &[]).unwrap();
    assert_eq!(back.train.seed, i64::MAX as u64);
    let _ = std::fs::remove_dir_all(dir);
}

/// NaN or infinite weights in an imported checkpoint are an error naming the tensor.
#[test]
fn non_finite_imported_weights_are_named() {
    use memzoo_import::reader::{TensorMap, write_safetensors};
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl/plain");
    let name = "transformer.layers.0.dec_attn.o_net.weight";
    for bad in [f32::NAN, f32::INFINITY] {
        let src = scratch(&format!("non-finite-src-{bad}"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::copy(fixture.join("config.json"), src.join("config.json")).unwrap();
        let map = TensorMap::read(&fixture.join("model.safetensors")).unwrap();
        let mut tensors: std::collections::BTreeMap<String, burn::tensor::TensorData> = map
            .names()
            .map(|n| (n.to_string(), map.get(n).unwrap().clone()))
            .collect();
        let t = tensors[name].clone().convert::<f32>();
        let shape = t.shape().to_vec();
        let mut values = t.try_to_vec::<f32>().unwrap();
        values[3] = bad;
        tensors.insert(name.into(), burn::tensor::TensorData::new(values, shape));
        write_safetensors(&src.join("model.safetensors"), tensors).unwrap();
        let run_dir = scratch(&format!("non-finite-run-{bad}"));
        let err = memzoo::import::import("hf-transfo-xl", &src, &run_dir, None, false, true)
            .expect_err("non-finite weights")
            .to_string();
        assert_mentions(&err, &[name, &bad.to_string()], "non-finite weights");
        assert!(!run_dir.join("checkpoints").exists(), "{err}");
        let _ = std::fs::remove_dir_all(src);
        let _ = std::fs::remove_dir_all(run_dir);
    }
}

/// `eval --mem-len` on a family without an XL memory is refused as `generate` refuses it (a
/// usage error naming the family); `duplication --seconds` must be a finite number >= 0.
#[test]
fn flags_a_command_cannot_honour_are_refused() {
    let dir = scratch("eval-mem-len");
    let reformer = tiny_lsh_layer(&["train.steps=1"]);
    cli_train(&reformer, &dir, false, false).unwrap();
    let err = commands::eval(&dir, "flex", "valid", Some(0), None, Some(1), true)
        .expect_err("--mem-len on a Reformer");
    assert_eq!(err.exit_code(), 2, "{err}");
    assert_mentions(&err, &["--mem-len", "reformer"], "eval --mem-len");
    for seconds in [f64::NAN, -5.0, f64::INFINITY] {
        let err = commands::duplication("flex", 1, 8, 1, seconds, true).expect_err("bad --seconds");
        assert_eq!(err.exit_code(), 2, "{err}");
        assert_mentions(
            &err,
            &["--seconds", &seconds.to_string()],
            "duplication --seconds",
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `--resume` with no step left to train is refused naming the step and `--steps` (it used to
/// exit 0 having trained nothing); a bad `--device` is a usage error (exit 2, as the README
/// says), naming the device.
#[test]
fn nothing_to_resume_and_bad_devices_are_usage_errors() {
    let dir = scratch("nothing-left");
    cli_train(&[], &dir, false, false).unwrap();
    for steps in ["train.steps=2", "train.steps=1"] {
        let err = cli_train(&[steps], &dir, true, false).expect_err(steps);
        assert_eq!(err.exit_code(), 2, "{err}");
        assert_mentions(&err, &["--resume", "at step 2", "--steps above 2"], steps);
    }
    let config = RunConfig::resolve(None, &tiny_cli(&[])).unwrap();
    for device in ["tpu", "cuda:x", "flex,flex"] {
        let other = dir.with_extension(format!("device-{}", device.replace([':', ','], "-")));
        let err =
            commands::train(&config, device, &other, false, false, true, true).expect_err(device);
        assert_eq!(err.exit_code(), 2, "{device}: {err}");
        assert_mentions(&err, &[device], device);
        let err =
            commands::eval(&dir, device, "valid", None, None, Some(1), true).expect_err(device);
        assert_eq!(err.exit_code(), 2, "eval {device}: {err}");
    }
    cli_train(&["train.steps=3"], &dir, true, false).unwrap();
    assert_eq!(loss_records(&dir), vec![1, 1, 1]);
    let _ = std::fs::remove_dir_all(dir);
}

/// Inputs without an end are refused before they are read: a device (`/dev/zero`) or a FIFO
/// as `--data`, `--config` or an import's `config.json` (a FIFO used to block forever, /dev/zero
/// to fill the memory); a gzip file that decompresses past the limit stops there, an error
/// naming it.
#[cfg(unix)]
#[test]
fn unbounded_inputs_are_refused() {
    let dir = scratch("unbounded");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for (path, kind) in [
        (Path::new("/dev/zero"), "a character device"),
        (fifo.as_path(), "a FIFO"),
    ] {
        let shown = path.display().to_string();
        let data = format!("data.source={shown}");
        let err = cli_train(&[data.as_str()], &dir.join("run"), false, false)
            .expect_err(&shown)
            .to_string();
        assert_mentions(&err, &[shown.as_str(), kind], "--data");
        let err = RunConfig::resolve(Some(path), &[]).expect_err(&shown);
        assert_mentions(&err, &[shown.as_str(), kind], "--config");
        let src = dir.join(format!("src-{}", kind.replace(' ', "-")));
        std::fs::create_dir_all(&src).unwrap();
        std::os::unix::fs::symlink(path, src.join("config.json")).unwrap();
        let err = memzoo::import::import(
            "hf-transfo-xl",
            &src,
            &dir.join("imported"),
            None,
            false,
            true,
        )
        .expect_err("config.json")
        .to_string();
        assert_mentions(
            &err,
            &["config.json", "not a regular file"],
            "import config.json",
        );
    }
    // A gzip bomb, in small: 4 MiB of zeros read with a 1 MiB limit.
    let plain = dir.join("zeros");
    std::fs::write(&plain, vec![0u8; 4 << 20]).unwrap();
    assert!(
        std::process::Command::new("gzip")
            .arg("-k")
            .arg(&plain)
            .status()
            .unwrap()
            .success()
    );
    let gz = dir.join("zeros.gz");
    let err = memzoo_data::read_bytes_bounded(&gz, None, 1 << 20)
        .expect_err("a gzip bomb")
        .to_string();
    assert_mentions(
        &err,
        &["zeros.gz", "decompresses to more than 1048576 bytes"],
        "gzip",
    );
    let err = memzoo_data::read_bytes_bounded(&plain, None, 1 << 20)
        .expect_err("too large")
        .to_string();
    assert_mentions(&err, &["zeros", "holds more than 1048576 bytes"], "plain");
    assert_eq!(
        memzoo_data::read_bytes_bounded(&gz, None, 4 << 20)
            .unwrap()
            .len(),
        4 << 20
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Sizes a machine cannot hold are refused with the estimate before anything is allocated (they
/// aborted on the allocation, exit 134): a huge width or vocabulary in every command that builds
/// the model, and the duplication task's hash rounds.
#[test]
fn sizes_beyond_the_machine_are_refused_with_an_estimate() {
    let dir = scratch("too-large");
    for (set, named) in [
        ("model.d_model=1000000", "model.d_model 1000000"),
        ("model.vocab_size=4294967296", "model.vocab_size 4294967296"),
    ] {
        let err = cli_train(&[set], &dir, false, false)
            .expect_err(set)
            .to_string();
        assert_mentions(
            &err,
            &[named, "needs about", "GiB, more than this machine's"],
            set,
        );
        assert!(!dir.exists(), "{set}: nothing written");
    }
    // A run whose config.toml was edited afterwards: eval and generate estimate too.
    cli_train(&[], &dir, false, false).unwrap();
    let path = dir.join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("d_model = 16", "d_model = 1000000", 1)).unwrap();
    let err = commands::eval(&dir, "flex", "valid", None, None, Some(1), true)
        .expect_err("eval")
        .to_string();
    assert_mentions(&err, &["model.d_model 1000000", "needs about"], "eval");
    let err = commands::duplication("flex", 1_000_000_000, 32, 1, 0.0, true)
        .expect_err("rounds")
        .to_string();
    assert_mentions(
        &err,
        &["--train-rounds 1000000000", "needs about"],
        "duplication",
    );
    // memzoo recall: the Memorizing Transformer's kNN memories over --batch rows.
    let err = commands::recall("flex", "both", 1, 1e-3, 1_000_000_000, 0, true)
        .expect_err("recall batch")
        .to_string();
    assert_mentions(
        &err,
        &["--batch 1000000000", "needs about", "lower --batch"],
        "recall",
    );
    // memzoo import: a config.json of d_model 10^9 is refused from the config alone (its
    // weights file holds d_model 64), before the weights are read or the model built; nothing
    // written.
    let src = dir.with_extension("huge-src");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl/wt103"),
        &src,
    );
    edit_json(&src.join("config.json"), |c| {
        c["d_model"] = 1_000_000_000.into()
    });
    let run = dir.with_extension("huge-run");
    let err = memzoo::import::import("hf-transfo-xl", &src, &run, None, false, true)
        .expect_err("import d_model")
        .to_string();
    assert_mentions(&err, &["d_model 1000000000", "needs about"], "import");
    assert!(!run.exists(), "import: nothing written");
    let _ = std::fs::remove_dir_all(src);
    let _ = std::fs::remove_dir_all(dir);
}

/// A non-finite loss names its cause where it can be told, instead of blaming the learning
/// rate: weights that hold NaN (named), or initial weights too large (before any update).
#[test]
fn a_non_finite_loss_names_its_cause() {
    let dev = flex().autodiff();
    for (what, std, expect) in [
        (
            "NaN weights",
            f64::NAN,
            &["loss is NaN at step 1", "hold non-finite values", "NaN"][..],
        ),
        (
            "init_std 1e30",
            1e30,
            &["at step 1, before any update", "init_std"][..],
        ),
    ] {
        let dir = scratch(&format!("non-finite-loss-{}", what.replace(' ', "-")));
        let model = seeded_weights(tiny_xl().init(&dev).unwrap(), 3, |_| std);
        let err = run_from(model, &dir, 2, false)
            .err()
            .expect(what)
            .to_string();
        assert_mentions(&err, expect, what);
        assert!(!err.contains("train.schedule.lr"), "{what}: {err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A labml checkpoint directory holding its one weight file under another name (labml's
/// experiments save `state_dict.pt`; here a safetensors file of that name, read by its
/// content) imports; with several, the error names them.
#[test]
fn labml_directory_with_one_weight_file_of_any_name_imports() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/labml-xl");
    let src = scratch("labml-state-dict");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(fixture.join("config.json"), src.join("config.json")).unwrap();
    std::fs::copy(fixture.join("model.safetensors"), src.join("state_dict.pt")).unwrap();
    let run_dir = src.join("run");
    memzoo::import::import("labml-xl", &src, &run_dir, None, false, true).unwrap();
    assert!(
        run_dir
            .join("checkpoints/step-00000000/model.bpk")
            .is_file()
    );
    std::fs::copy(fixture.join("model.safetensors"), src.join("other.pth")).unwrap();
    let err = memzoo::import::import("labml-xl", &src, &src.join("run2"), None, false, true)
        .expect_err("two weight files")
        .to_string();
    assert_mentions(
        &err,
        &["several weight files", "other.pth", "state_dict.pt"],
        "two",
    );
    let _ = std::fs::remove_dir_all(src);
}

/// `grad_norm` is the mean over the logged window of steps (with its largest, and the share of
/// steps clipped), not the last step's norm, which periodic data turns into a constant of
/// whatever phase the logged step falls on (the default run's "grad_norm 0.002, then 2.0 from
/// step 3,200": the epoch boundary shifted the phase by one step).
#[test]
fn grad_norm_is_the_window_mean() {
    let norms = |dir: &Path, log_every: usize| -> Vec<(String, f64)> {
        let options = RunOptions {
            run_dir: dir.to_path_buf(),
            resume: false,
            quiet: true,
        };
        let config = tiny_train(4)
            .with_log_every(log_every)
            .with_clip_norm(Some(0.5));
        train(initial_model(), &config, &mut batcher(), None, &options).unwrap();
        train_records(dir)
            .into_iter()
            .filter(|(_, m, _)| m.starts_with("train/grad_norm") || m == "train/clipped")
            .map(|(s, m, v)| (format!("{s} {m}"), v))
            .collect()
    };
    let (a, b) = (scratch("norms-every-step"), scratch("norms-every-4"));
    let each = norms(&a, 1);
    let window = norms(&b, 4);
    let per_step: Vec<f64> = each
        .iter()
        .filter(|(m, _)| m.ends_with("train/grad_norm"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(per_step.len(), 4, "{each:?}");
    let mean = per_step.iter().sum::<f64>() / 4.0;
    let max = per_step.iter().cloned().fold(0.0, f64::max);
    let clipped = per_step.iter().filter(|&&n| n > 0.5).count() as f64 / 4.0;
    let got = |name: &str| window.iter().find(|(m, _)| m == name).unwrap().1;
    assert!(
        (got("4 train/grad_norm") - mean).abs() < 1e-9,
        "{window:?} vs {per_step:?}"
    );
    assert_eq!(got("4 train/grad_norm_max"), max);
    assert_eq!(got("4 train/clipped"), clipped);
    let _ = std::fs::remove_dir_all(a);
    let _ = std::fs::remove_dir_all(b);
}
