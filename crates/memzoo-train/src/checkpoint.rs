//! Checkpoints: model, optimizer, carried state and trainer state, written atomically.
//!
//! Layout: `<run>/checkpoints/step-00000200/{model.bpk, optim.bpk, state/, trainer.json}` and
//! `<run>/checkpoints/latest` naming the newest complete one. `state/` holds the carried state;
//! a run with several data-parallel replicas keeps one per replica, `state/shard-<r>/`. A
//! checkpoint is assembled in a `.tmp-*` folder and renamed into place, so a crash mid-write
//! never leaves a half-written checkpoint under a final name; `latest` is replaced by rename too.
//! Every file is flushed to disk (`fsync`), and so is each folder, before the rename that
//! publishes it.
//!
//! `trainer.json` records the size and SHA-256 of every other file of its checkpoint; loading
//! verifies them, so a damaged file is an error naming it rather than other weights. When
//! `latest` is missing or names a missing or damaged checkpoint, [`latest`] falls back to the
//! newest intact one and says so.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::tensor::Device;

use crate::error::TrainError;
use crate::model::SegmentModel;
use crate::schedule::ScheduleConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a checkpoint stores besides the model, optimizer and carried state.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TrainerState {
    /// Model family (`xl`, `reformer`, `memorizing`).
    pub family: String,
    /// Optimizer steps done.
    pub step: usize,
    /// Tokens trained on.
    pub tokens: u64,
    /// Position of the training data.
    pub data_position: serde_json::Value,
    /// The learning rate schedule (and so the scheduler's state: it is a function of `step`).
    pub schedule: ScheduleConfig,
    /// Total steps the schedule was planned for.
    pub total_steps: usize,
    /// Data-parallel replicas, each with the carried state of its rows (1 in checkpoints
    /// written before replicas existed).
    #[serde(default = "one")]
    pub replicas: usize,
}

fn one() -> usize {
    1
}

/// `trainer.json`: the trainer state and what every other file of the checkpoint holds.
#[derive(Serialize, Deserialize)]
struct TrainerFile {
    #[serde(flatten)]
    trainer: TrainerState,
    /// Path inside the checkpoint (`/`-separated) -> its size and SHA-256. Required: a
    /// `trainer.json` without it (an older layout, a hand edit) is refused, never loaded
    /// unverified.
    files: BTreeMap<String, FileSum>,
    /// SHA-256 of this record as compact JSON without this field: `trainer.json` checks itself
    /// (a flipped digit of `step` would resume at another step). Required, as `files`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

impl TrainerFile {
    /// The SHA-256 (hex) of the record without its own sum.
    fn own_sum(&self) -> String {
        let unsummed = TrainerFile {
            trainer: self.trainer.clone(),
            files: self.files.clone(),
            sha256: None,
        };
        let json = serde_json::to_string(&unsummed).expect("serialisable trainer state");
        hex(&Sha256::digest(json.as_bytes()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Size and SHA-256 (hex) of one checkpoint file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct FileSum {
    bytes: u64,
    sha256: String,
}

fn file_sum(path: &Path) -> Result<FileSum, TrainError> {
    let mut file =
        std::fs::File::open(path).map_err(io(format!("cannot read {}", path.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(io(format!("cannot read {}", path.display())))?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok(FileSum {
        bytes,
        sha256: hex(&hasher.finalize()),
    })
}

/// Every file under `dir` (relative, `/`-separated), sorted.
fn files_under(dir: &Path) -> Result<Vec<String>, TrainError> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, rel)) = stack.pop() {
        for entry in
            std::fs::read_dir(&path).map_err(io(format!("cannot list {}", path.display())))?
        {
            let entry = entry.map_err(io(format!("cannot list {}", path.display())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if entry.path().is_dir() {
                stack.push((entry.path(), rel));
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Flushes a file or a folder to disk.
fn sync(path: &Path) -> Result<(), TrainError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("cannot flush {} to disk", path.display())))
}

/// Flushes every file and folder under `dir`, then `dir` itself.
fn sync_tree(dir: &Path) -> Result<(), TrainError> {
    for entry in std::fs::read_dir(dir).map_err(io(format!("cannot list {}", dir.display())))? {
        let path = entry
            .map_err(io(format!("cannot list {}", dir.display())))?
            .path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            sync(&path)?;
        }
    }
    sync(dir)
}

/// What [`load`] restores.
pub struct Restored<M: SegmentModel> {
    /// The model with the checkpoint's parameters.
    pub model: M,
    /// The optimizer with its moments.
    pub optim: ModuleOptimizer,
    /// The carried state (memories), one per data-parallel replica.
    pub states: Vec<M::State>,
    /// Step, data position, schedule.
    pub trainer: TrainerState,
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> TrainError {
    move |e| TrainError::io(context, e)
}

/// Where replica `r` of `replicas` keeps its carried state inside a checkpoint folder.
fn state_dir(dir: &Path, r: usize, replicas: usize) -> PathBuf {
    match replicas {
        1 => dir.join("state"),
        _ => dir.join("state").join(format!("shard-{r}")),
    }
}

/// Writes a checkpoint for `trainer.step` and keeps the newest `keep`.
///
/// `states`: the carried state of each of the `trainer.replicas` replicas.
pub fn save<M: SegmentModel>(
    ckpt_dir: &Path,
    model: &M,
    optim: &ModuleOptimizer,
    states: &[M::State],
    trainer: &TrainerState,
    keep: usize,
) -> Result<PathBuf, TrainError> {
    std::fs::create_dir_all(ckpt_dir)
        .map_err(io(format!("cannot create {}", ckpt_dir.display())))?;
    let name = format!("step-{:08}", trainer.step);
    let tmp = ckpt_dir.join(format!(".tmp-{name}"));
    let fin = ckpt_dir.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(format!("cannot clear {}", tmp.display())))?;
    }
    for r in 0..states.len() {
        let dir = state_dir(&tmp, r, states.len());
        std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
    }
    model
        .clone()
        .save_file(tmp.join("model.bpk"))
        .map_err(|e| TrainError::Checkpoint(format!("writing model: {e:?}")))?;
    optim
        .save(tmp.join("optim.bpk"))
        .map_err(|e| TrainError::Checkpoint(format!("writing optimizer: {e:?}")))?;
    for (r, state) in states.iter().enumerate() {
        M::save_state(state, &state_dir(&tmp, r, states.len()))?;
    }
    let mut files = BTreeMap::new();
    for rel in files_under(&tmp)? {
        files.insert(rel.clone(), file_sum(&tmp.join(&rel))?);
    }
    let mut record = TrainerFile {
        trainer: trainer.clone(),
        files,
        sha256: None,
    };
    record.sha256 = Some(record.own_sum());
    let json = serde_json::to_string_pretty(&record).expect("serialisable trainer state");
    std::fs::write(tmp.join("trainer.json"), json)
        .map_err(io(format!("cannot write {}", tmp.display())))?;
    sync_tree(&tmp)?;
    if fin.exists() {
        std::fs::remove_dir_all(&fin).map_err(io(format!("cannot replace {}", fin.display())))?;
    }
    std::fs::rename(&tmp, &fin).map_err(io(format!("cannot rename to {}", fin.display())))?;
    sync(ckpt_dir)?;
    let latest_tmp = ckpt_dir.join(".latest.tmp");
    std::fs::write(&latest_tmp, &name).map_err(io("cannot write latest".into()))?;
    sync(&latest_tmp)?;
    std::fs::rename(&latest_tmp, ckpt_dir.join("latest"))
        .map_err(io("cannot update latest".into()))?;
    sync(ckpt_dir)?;
    prune(ckpt_dir, keep, &name)?;
    Ok(fin)
}

/// Keeps the newest `keep` checkpoints up to `current` (the one just written). Checkpoints of
/// later steps belong to a timeline this run abandoned (it resumed from an earlier checkpoint,
/// e.g. because they were damaged) and go, as do `.tmp-*` folders a crash left behind: a
/// damaged later checkpoint must never outlive the one just written.
fn prune(ckpt_dir: &Path, keep: usize, current: &str) -> Result<(), TrainError> {
    let mut steps = Vec::new();
    let mut stale = Vec::new();
    for entry in
        std::fs::read_dir(ckpt_dir).map_err(io(format!("cannot list {}", ckpt_dir.display())))?
    {
        let Ok(entry) = entry else { continue };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with(".tmp-") || (name.starts_with("step-") && name.as_str() > current) {
            stale.push(entry.path());
        } else if name.starts_with("step-") {
            steps.push(entry.path());
        }
    }
    steps.sort();
    let n = steps.len();
    stale.extend(steps.into_iter().take(n.saturating_sub(keep)));
    for old in stale {
        let removed = if old.is_dir() {
            std::fs::remove_dir_all(&old)
        } else {
            std::fs::remove_file(&old)
        };
        removed.map_err(io(format!("cannot remove {}", old.display())))?;
    }
    Ok(())
}

/// The checkpoint `latest` names if it is intact, else the newest intact one (a warning on
/// stderr says which and why); `None` when `ckpt_dir` holds no checkpoint. An error when it
/// holds checkpoints but none is intact, naming what is wrong with each.
pub fn latest(ckpt_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    let found = latest_with_note(ckpt_dir)?;
    if let Some((_, Some(note))) = &found {
        eprintln!("warning: {note}");
    }
    Ok(found.map(|(dir, _)| dir))
}

/// [`latest`] with the warning returned instead of printed: the folder, and why it is not the
/// one `latest` names (`None`: it is).
pub fn latest_with_note(ckpt_dir: &Path) -> Result<Option<(PathBuf, Option<String>)>, TrainError> {
    let pointer = ckpt_dir.join("latest");
    let named = std::fs::read_to_string(&pointer)
        .ok()
        .map(|n| n.trim().to_string());
    let problem = match &named {
        Some(name) if name.starts_with("step-") && !name.contains(['/', '\\']) => {
            let dir = ckpt_dir.join(name);
            match verify(&dir) {
                Ok(()) => return Ok(Some((dir, None))),
                Err(e) => format!(
                    "{} names {name}, which is damaged ({})",
                    pointer.display(),
                    reason(e)
                ),
            }
        }
        Some(name) => format!("{} is damaged (it reads {name:?})", pointer.display()),
        None => format!("{} is missing", pointer.display()),
    };
    let mut steps: Vec<String> = match std::fs::read_dir(ckpt_dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("step-"))
            .collect(),
        Err(_) => Vec::new(),
    };
    if steps.is_empty() && named.is_none() {
        return Ok(None);
    }
    steps.sort();
    let mut rejected = Vec::new();
    for name in steps.iter().rev() {
        if named.as_deref() == Some(name.as_str()) {
            continue;
        }
        let dir = ckpt_dir.join(name);
        match verify(&dir) {
            Ok(()) => {
                let note = format!(
                    "{problem}; using {}, the newest intact checkpoint",
                    dir.display()
                );
                return Ok(Some((dir, Some(note))));
            }
            Err(e) => rejected.push(format!("{name}: {}", reason(e))),
        }
    }
    let rest = if rejected.is_empty() {
        String::new()
    } else {
        format!("; {}", rejected.join("; "))
    };
    Err(TrainError::Checkpoint(format!(
        "no intact checkpoint in {}: {problem}{rest}",
        ckpt_dir.display()
    )))
}

/// Checks a checkpoint folder against the sizes and SHA-256 sums its `trainer.json` records
/// (a `trainer.json` without them is refused). The error names the first file that is missing
/// or differs.
pub fn verify(dir: &Path) -> Result<(), TrainError> {
    if !dir.is_dir() {
        return Err(TrainError::Checkpoint(format!(
            "{} does not exist",
            dir.display()
        )));
    }
    let record = read_trainer_file(dir)?;
    if !record.files.contains_key("model.bpk") {
        return Err(TrainError::Checkpoint(format!(
            "{} records no sum for model.bpk: the model cannot be verified",
            dir.join("trainer.json").display()
        )));
    }
    for (rel, want) in &record.files {
        let path = dir.join(rel);
        if !path.is_file() {
            return Err(TrainError::Checkpoint(format!(
                "{} is missing",
                path.display()
            )));
        }
        let got = file_sum(&path)?;
        if got.bytes != want.bytes {
            return Err(TrainError::Checkpoint(format!(
                "{} is damaged: {} bytes, trainer.json records {}",
                path.display(),
                got.bytes,
                want.bytes
            )));
        }
        if got.sha256 != want.sha256 {
            return Err(TrainError::Checkpoint(format!(
                "{} is damaged: its SHA-256 is {}, trainer.json records {}",
                path.display(),
                got.sha256,
                want.sha256
            )));
        }
    }
    Ok(())
}

/// The message of a checkpoint error without its `checkpoint: ` prefix.
fn reason(e: TrainError) -> String {
    match e {
        TrainError::Checkpoint(m) => m,
        e => e.to_string(),
    }
}

fn read_trainer_file(dir: &Path) -> Result<TrainerFile, TrainError> {
    let path = dir.join("trainer.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| TrainError::Checkpoint(format!("cannot read {}: {e}", path.display())))?;
    let damaged = |e: serde_json::Error| {
        TrainError::Checkpoint(format!("{} is damaged: {e}", path.display()))
    };
    let value: serde_json::Value = serde_json::from_str(&text).map_err(damaged)?;
    // Without its checksums nothing of the checkpoint could be verified: refused, naming what
    // is missing.
    for (field, holds) in [
        (
            "files",
            "the size and SHA-256 of every file of the checkpoint",
        ),
        ("sha256", "the SHA-256 of trainer.json itself"),
    ] {
        if value.get(field).is_none() {
            return Err(TrainError::Checkpoint(format!(
                "{} has no `{field}` field ({holds}): the checkpoint cannot be verified, so it \
                 is not loaded (an older layout or a hand edit; a checkpoint memzoo writes has it)",
                path.display()
            )));
        }
    }
    let record: TrainerFile = serde_json::from_value(value).map_err(damaged)?;
    let got = record.own_sum();
    if record.sha256.as_deref() != Some(got.as_str()) {
        return Err(TrainError::Checkpoint(format!(
            "{} is damaged: its content hashes to SHA-256 {got}, it records {} (a value was \
             changed after it was written)",
            path.display(),
            record.sha256.as_deref().unwrap_or("none")
        )));
    }
    Ok(record)
}

/// Edits the trainer state of the checkpoint folder `dir` (verified first) and records the
/// checksum of the new `trainer.json` (the other files' sums are kept, and still verified on
/// load): e.g. a checkpoint relabelled for another family name. Written atomically.
pub fn rewrite_trainer_state(
    dir: &Path,
    edit: impl FnOnce(&mut TrainerState),
) -> Result<(), TrainError> {
    verify(dir)?;
    let mut record = read_trainer_file(dir)?;
    edit(&mut record.trainer);
    record.sha256 = None;
    record.sha256 = Some(record.own_sum());
    let json = serde_json::to_string_pretty(&record).expect("serialisable trainer state");
    let tmp = dir.join(".trainer.json.tmp");
    std::fs::write(&tmp, json).map_err(io(format!("cannot write {}", tmp.display())))?;
    sync(&tmp)?;
    let path = dir.join("trainer.json");
    std::fs::rename(&tmp, &path).map_err(io(format!("cannot replace {}", path.display())))?;
    sync(dir)
}

/// What of a previous run `run_dir` holds (`checkpoints/step-00000200, metrics.jsonl`), or
/// `None` when there is nothing a new run would mix with or delete.
pub fn existing_run(run_dir: &Path) -> Option<String> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(run_dir.join("checkpoints")) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("step-") || n == "latest")
            .collect();
        names.sort();
        found.extend(names.into_iter().map(|n| format!("checkpoints/{n}")));
    }
    if std::fs::metadata(run_dir.join("metrics.jsonl")).is_ok_and(|m| m.len() > 0) {
        found.push("metrics.jsonl".into());
    }
    (!found.is_empty()).then(|| found.join(", "))
}

/// Reads the trainer state of a checkpoint folder.
pub fn read_trainer_state(dir: &Path) -> Result<TrainerState, TrainError> {
    Ok(read_trainer_file(dir)?.trainer)
}

/// Loads a checkpoint into `model` / `optim` (which fix the architecture and device).
///
/// A checkpoint of another architecture, or a damaged file, is an error naming the file.
pub fn load<M: SegmentModel>(
    dir: &Path,
    model: M,
    optim: ModuleOptimizer,
    device: &Device,
) -> Result<Restored<M>, TrainError> {
    load_on(dir, model, optim, std::slice::from_ref(device))
}

/// [`load`] with the carried states on `state_devices`: one device for every replica's state,
/// or one per replica (training on several devices: replica `r`'s state on device `r`).
pub fn load_on<M: SegmentModel>(
    dir: &Path,
    model: M,
    optim: ModuleOptimizer,
    state_devices: &[Device],
) -> Result<Restored<M>, TrainError> {
    verify(dir)?;
    let trainer = read_trainer_state(dir)?;
    let model = load_model(dir, model)?;
    let optim_path = dir.join("optim.bpk");
    let optim = optim.load(&optim_path).map_err(|e| {
        TrainError::Checkpoint(format!("{} cannot be loaded: {e:?}", optim_path.display()))
    })?;
    if trainer.replicas == 0 {
        return Err(TrainError::Checkpoint(format!(
            "{}: trainer.json names 0 replicas",
            dir.display()
        )));
    }
    let device_of = |r: usize| match state_devices.len() {
        1 => state_devices.first(),
        _ => state_devices.get(r),
    };
    let states = (0..trainer.replicas)
        .map(|r| {
            let device = device_of(r).ok_or_else(|| {
                TrainError::Checkpoint(format!(
                    "{}: {} replicas' states, {} devices to load them on",
                    dir.display(),
                    trainer.replicas,
                    state_devices.len()
                ))
            })?;
            model.load_state(&state_dir(dir, r, trainer.replicas), device)
        })
        .collect::<Result<_, _>>()?;
    Ok(Restored {
        model,
        optim,
        states,
        trainer,
    })
}

/// Loads only the model parameters of a checkpoint folder (verified against its checksums).
pub fn load_model<M: SegmentModel>(dir: &Path, model: M) -> Result<M, TrainError> {
    verify(dir)?;
    let path = dir.join("model.bpk");
    if !path.exists() {
        return Err(TrainError::Checkpoint(format!(
            "{} is missing",
            path.display()
        )));
    }
    model.load_params(&path)
}
