//! SIGINT (Ctrl-C) and SIGTERM during training: the trainer finishes the current step, writes
//! a checkpoint and stops; the CLI then exits with `128 + signal` (130, 143). A second SIGINT
//! or SIGTERM while the checkpoint is being written ends the process at once, with that
//! status (the previous checkpoint is intact: checkpoints are published by rename).
//!
//! The handlers are installed once per process (signal-hook cannot give a signal back its
//! default action once it handled it) and act only while a [`StopSignals`] lives; at any other
//! time they run the default action, so the process ends on Ctrl-C as before.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::TrainError;

/// SIGINT's number.
pub const SIGINT: i32 = 2;
/// SIGTERM's number.
pub const SIGTERM: i32 = 15;

/// The process-wide state the handlers read and write.
struct Flags {
    /// No run is listening: the default action (terminate).
    idle: Arc<AtomicBool>,
    /// A signal arrived during this run: the next one exits at once.
    armed: Arc<AtomicBool>,
    /// The signal that arrived (0: none).
    caught: Arc<AtomicUsize>,
    /// Live [`StopSignals`].
    live: Mutex<usize>,
}

fn flags() -> Result<&'static Flags, TrainError> {
    static FLAGS: OnceLock<Result<Flags, String>> = OnceLock::new();
    let installed = FLAGS.get_or_init(|| {
        let flags = Flags {
            idle: Arc::new(AtomicBool::new(true)),
            armed: Arc::new(AtomicBool::new(false)),
            caught: Arc::new(AtomicUsize::new(0)),
            live: Mutex::new(0),
        };
        #[cfg(unix)]
        for sig in [SIGINT, SIGTERM] {
            use signal_hook::flag;
            // In this order: the default action when idle, the immediate exit when armed,
            // then record the signal and arm.
            let register = || -> std::io::Result<()> {
                flag::register_conditional_default(sig, flags.idle.clone())?;
                flag::register_conditional_shutdown(sig, 128 + sig, flags.armed.clone())?;
                flag::register_usize(sig, flags.caught.clone(), sig as usize)?;
                flag::register(sig, flags.armed.clone())?;
                Ok(())
            };
            register().map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
        }
        Ok(flags)
    });
    installed
        .as_ref()
        .map_err(|e| TrainError::Config(e.clone()))
}

/// While this lives, SIGINT and SIGTERM ask the training run to stop (see the module docs);
/// dropping the last one gives both their default action back.
pub struct StopSignals {
    flags: &'static Flags,
}

impl StopSignals {
    /// Starts listening (a fresh run: no signal caught yet).
    pub fn install() -> Result<Self, TrainError> {
        let flags = flags()?;
        let mut live = flags.live.lock().unwrap_or_else(|e| e.into_inner());
        if *live == 0 {
            flags.caught.store(0, Ordering::SeqCst);
            flags.armed.store(false, Ordering::SeqCst);
            flags.idle.store(false, Ordering::SeqCst);
        }
        *live += 1;
        Ok(Self { flags })
    }

    /// The signal that asked the run to stop, if one arrived.
    pub fn caught(&self) -> Option<i32> {
        match self.flags.caught.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        let mut live = self.flags.live.lock().unwrap_or_else(|e| e.into_inner());
        *live -= 1;
        if *live == 0 {
            self.flags.idle.store(true, Ordering::SeqCst);
            self.flags.armed.store(false, Ordering::SeqCst);
        }
    }
}
