//! Replacing a run (`memzoo train --overwrite`, `memzoo import --overwrite`): the old run is
//! set aside, not deleted, until the new one has a checkpoint.
//!
//! A run is the entries [`RUN_ENTRIES`] of its directory. Replacing it:
//!
//! 1. [`set_aside`]: the old run's entries are renamed, `checkpoints/` first, into
//!    `<run>/.replacing/`, which is then renamed to `<run>/.replaced/` (one atomic rename: the
//!    set-aside is complete or not there at all). Renames inside one directory never copy.
//! 2. The new run writes its entries in the run directory.
//! 3. Once the new run's first checkpoint is written (atomically, [`crate::checkpoint::save`]),
//!    [`drop_set_aside`] deletes `.replaced/`: the trainer calls it after every checkpoint it
//!    writes (nothing to do after the first), `import` after its one checkpoint.
//!
//! A new run that fails before its first checkpoint is undone by [`restore`] (its entries
//! removed, the old run's moved back). A process that dies in between (a crash, `kill -9`, a
//! power cut) leaves `.replacing/` or `.replaced/` behind; the next process that locks the run
//! directory calls [`recover`] first, which finishes the job: a new run with a checkpoint is
//! kept (and the set-aside run deleted), anything else is undone, the old run back in place as
//! it was, byte for byte. Callers hold the run directory's lock ([`crate::lock::RunLock`])
//! throughout.

use std::path::{Path, PathBuf};

use crate::error::TrainError;

/// What a run writes to its directory, the entries a replacement moves: `checkpoints/` first
/// (see [`set_aside`]).
pub const RUN_ENTRIES: [&str; 4] = [
    "checkpoints",
    "metrics.jsonl",
    "config.toml",
    memzoo_data::WORD_VOCAB_FILE,
];

/// The folder a completed set-aside lives in, inside the run directory.
pub const REPLACED: &str = ".replaced";
/// The folder of a set-aside in progress (a process that died here moved only part of the run).
const REPLACING: &str = ".replacing";

fn io(context: String) -> impl FnOnce(std::io::Error) -> TrainError {
    move |e| TrainError::io(context, e)
}

fn rename(from: &Path, to: &Path) -> Result<(), TrainError> {
    std::fs::rename(from, to).map_err(io(format!(
        "cannot move {} to {}",
        from.display(),
        to.display()
    )))
}

fn remove(path: &Path) -> Result<(), TrainError> {
    let result = match path.is_dir() {
        true => std::fs::remove_dir_all(path),
        false => std::fs::remove_file(path),
    };
    result.map_err(io(format!("cannot remove {}", path.display())))
}

/// Flushes a directory's entries (its renames) to disk; a no-op where directories cannot be
/// opened (Windows).
fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Whether `run_dir` holds a checkpoint (a `checkpoints/step-*` folder: written atomically,
/// so one that is there is complete).
fn has_checkpoint(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir.join("checkpoints")).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .any(|n| n.starts_with("step-"))
    })
}

/// Moves the run in `run_dir` (its [`RUN_ENTRIES`] that exist) into `<run_dir>/.replaced/`.
/// Returns whether there was anything to move. A set-aside left by an earlier process must be
/// [`recover`]ed first (it is an error here, naming it).
pub fn set_aside(run_dir: &Path) -> Result<bool, TrainError> {
    let (replacing, replaced) = (run_dir.join(REPLACING), run_dir.join(REPLACED));
    for left in [&replacing, &replaced] {
        if left.exists() {
            return Err(TrainError::Config(format!(
                "{} holds a run set aside by an earlier --overwrite; it must be recovered first",
                left.display()
            )));
        }
    }
    let present: Vec<&str> = RUN_ENTRIES
        .into_iter()
        .filter(|name| run_dir.join(name).symlink_metadata().is_ok())
        .collect();
    if present.is_empty() {
        return Ok(false);
    }
    std::fs::create_dir(&replacing)
        .map_err(io(format!("cannot create {}", replacing.display())))?;
    for name in present {
        rename(&run_dir.join(name), &replacing.join(name))?;
    }
    sync_dir(&replacing);
    rename(&replacing, &replaced)?;
    sync_dir(run_dir);
    Ok(true)
}

/// Deletes the run set aside in `run_dir` (if any): the new run has its first checkpoint.
pub fn drop_set_aside(run_dir: &Path) -> Result<(), TrainError> {
    let replaced = run_dir.join(REPLACED);
    if replaced.exists() {
        remove(&replaced)?;
        sync_dir(run_dir);
    }
    Ok(())
}

/// Undoes a replacement: removes what the new run wrote ([`RUN_ENTRIES`]) and moves the run set
/// aside in `run_dir` back, as it was. Nothing set aside: nothing to do.
pub fn restore(run_dir: &Path) -> Result<(), TrainError> {
    let replaced = run_dir.join(REPLACED);
    if !replaced.exists() {
        return Ok(());
    }
    for name in RUN_ENTRIES {
        let path = run_dir.join(name);
        if path.symlink_metadata().is_ok() {
            remove(&path)?;
        }
    }
    move_back(&replaced, run_dir)
}

/// Moves every entry of `from` back into `run_dir`, then removes `from`.
fn move_back(from: &Path, run_dir: &Path) -> Result<(), TrainError> {
    let entries: Vec<PathBuf> = std::fs::read_dir(from)
        .map_err(io(format!("cannot read {}", from.display())))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io(format!("cannot read {}", from.display())))?;
    for path in entries {
        let name = path.file_name().expect("an entry has a name");
        rename(&path, &run_dir.join(name))?;
    }
    std::fs::remove_dir(from).map_err(io(format!("cannot remove {}", from.display())))?;
    sync_dir(run_dir);
    Ok(())
}

/// Whether an earlier process left a replacement unfinished in `run_dir` (see [`recover`]).
pub fn pending(run_dir: &Path) -> bool {
    run_dir.join(REPLACING).exists() || run_dir.join(REPLACED).exists()
}

/// [`recover`] under the run directory's lock, taken for it and released (a process that is
/// about to decide whether `run_dir` holds a run; `what` names it to a process it finds there).
/// Nothing left unfinished: nothing to do, no lock taken.
pub fn recover_locked(run_dir: &Path, what: &str) -> Result<Option<String>, TrainError> {
    if !pending(run_dir) {
        return Ok(None);
    }
    let _lock = crate::lock::RunLock::acquire(run_dir, what)?;
    recover(run_dir)
}

/// Finishes a replacement that an earlier process left unfinished in `run_dir` (it died): a
/// set-aside in progress is moved back (the new run had not started); a complete one is
/// deleted if the new run wrote a checkpoint, else the new run is undone ([`restore`]).
/// Returns what it did, for a warning (`None`: nothing was left).
pub fn recover(run_dir: &Path) -> Result<Option<String>, TrainError> {
    let replacing = run_dir.join(REPLACING);
    if replacing.exists() {
        move_back(&replacing, run_dir)?;
        return Ok(Some(format!(
            "{}: an earlier --overwrite stopped while it set the old run aside; the old run is \
             back in place",
            run_dir.display()
        )));
    }
    let replaced = run_dir.join(REPLACED);
    if !replaced.exists() {
        return Ok(None);
    }
    if has_checkpoint(run_dir) {
        drop_set_aside(run_dir)?;
        return Ok(Some(format!(
            "{}: the run an earlier --overwrite replaced is deleted (the new run had written a \
             checkpoint)",
            run_dir.display()
        )));
    }
    restore(run_dir)?;
    Ok(Some(format!(
        "{}: an earlier --overwrite stopped before the new run wrote a checkpoint; the old run \
         is back in place",
        run_dir.display()
    )))
}
