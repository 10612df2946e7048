//! One process per run directory: `<run>/.lock`, an exclusive OS file lock (`flock` on Unix,
//! `LockFileEx` on Windows: std's `File::try_lock`) held by the process that trains in, imports
//! into or exports from the run, for as long as it does. A second process is refused with the
//! holder's pid, which the holder writes into the file.
//!
//! The lock belongs to the open file, not to the file's existence: it goes when the holder
//! ends, however it ends (a crash, `kill -9`), and the next process takes it over and writes
//! its own pid. The file itself stays (deleting it would let two processes lock two different
//! files of one name).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::TrainError;

/// The lock file's name inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// The exclusive lock of a run directory, held until dropped.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    path: PathBuf,
}

impl RunLock {
    /// Locks `run_dir` (created if missing) for this process, which does `what` there (e.g.
    /// `memzoo train`); an error naming the directory and the holder's pid when another process
    /// holds it.
    pub fn acquire(run_dir: &Path, what: &str) -> Result<Self, TrainError> {
        std::fs::create_dir_all(run_dir).map_err(|e| {
            TrainError::io(
                format!("cannot create run directory {}", run_dir.display()),
                e,
            )
        })?;
        let path = run_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| TrainError::io(format!("cannot open {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "a process that has not written its pid yet".to_string(),
                    h => h.to_string(),
                };
                return Err(TrainError::Busy {
                    dir: run_dir.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => {
                return Err(TrainError::io(
                    format!(
                        "cannot lock {} (one process per run directory)",
                        path.display()
                    ),
                    e,
                ));
            }
        }
        let record = format!("pid {} ({what})\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(record.as_bytes()))
            .and_then(|()| file.flush())
            .map_err(|e| TrainError::io(format!("cannot write {}", path.display()), e))?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
