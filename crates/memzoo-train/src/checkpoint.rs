//! Checkpoints: model, optimizer, carried state and trainer state, written atomically.
//!
//! Layout: `<run>/checkpoints/step-00000200/{model.bpk, optim.bpk, state/, trainer.json}` and
//! `<run>/checkpoints/latest` naming the newest complete one. `state/` holds the carried state;
//! a run with several data-parallel replicas keeps one per replica, `state/shard-<r>/`. A
//! checkpoint is assembled in a `.tmp-*` folder and renamed into place, so a crash mid-write
//! never leaves a half-written checkpoint under a final name; `latest` is replaced by rename too.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;

use crate::error::TrainError;
use crate::model::SegmentModel;
use crate::trainer::TrainerState;

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
    let json = serde_json::to_string_pretty(trainer).expect("serialisable trainer state");
    std::fs::write(tmp.join("trainer.json"), json)
        .map_err(io(format!("cannot write {}", tmp.display())))?;
    if fin.exists() {
        std::fs::remove_dir_all(&fin).map_err(io(format!("cannot replace {}", fin.display())))?;
    }
    std::fs::rename(&tmp, &fin).map_err(io(format!("cannot rename to {}", fin.display())))?;
    let latest_tmp = ckpt_dir.join(".latest.tmp");
    std::fs::write(&latest_tmp, &name).map_err(io("cannot write latest".into()))?;
    std::fs::rename(&latest_tmp, ckpt_dir.join("latest"))
        .map_err(io("cannot update latest".into()))?;
    prune(ckpt_dir, keep)?;
    Ok(fin)
}

fn prune(ckpt_dir: &Path, keep: usize) -> Result<(), TrainError> {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(ckpt_dir)
        .map_err(io(format!("cannot list {}", ckpt_dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
        })
        .collect();
    steps.sort();
    let n = steps.len();
    for old in steps.into_iter().take(n.saturating_sub(keep)) {
        std::fs::remove_dir_all(&old).map_err(io(format!("cannot remove {}", old.display())))?;
    }
    Ok(())
}

/// The newest complete checkpoint in `ckpt_dir`, if any.
pub fn latest(ckpt_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    let pointer = ckpt_dir.join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer)
        .map_err(io(format!("cannot read {}", pointer.display())))?;
    let dir = ckpt_dir.join(name.trim());
    if !dir.is_dir() {
        return Err(TrainError::Checkpoint(format!(
            "{} names {}, which does not exist",
            pointer.display(),
            dir.display()
        )));
    }
    Ok(Some(dir))
}

/// Reads the trainer state of a checkpoint folder.
pub fn read_trainer_state(dir: &Path) -> Result<TrainerState, TrainError> {
    let path = dir.join("trainer.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| TrainError::Checkpoint(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| TrainError::Checkpoint(format!("{} is damaged: {e}", path.display())))
}

/// Loads a checkpoint into `model` / `optim` (which fix the architecture and device).
///
/// A checkpoint of another architecture, or a truncated file, is an error naming the file.
pub fn load<M: SegmentModel>(
    dir: &Path,
    model: M,
    optim: ModuleOptimizer,
    device: &Device,
) -> Result<Restored<M>, TrainError> {
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
    let states = (0..trainer.replicas)
        .map(|r| model.load_state(&state_dir(dir, r, trainer.replicas), device))
        .collect::<Result<_, _>>()?;
    Ok(Restored {
        model,
        optim,
        states,
        trainer,
    })
}

/// Loads only the model parameters of a checkpoint folder.
pub fn load_model<M: Module>(dir: &Path, model: M) -> Result<M, TrainError> {
    let path = dir.join("model.bpk");
    if !path.exists() {
        return Err(TrainError::Checkpoint(format!(
            "{} is missing",
            path.display()
        )));
    }
    model.try_load_file(&path).map_err(|e| {
        TrainError::Checkpoint(format!(
            "{} does not fit this model (another architecture, or a damaged file): {e:?}",
            path.display()
        ))
    })
}
