//! SIGINT (Ctrl-C) and SIGTERM during training: the trainer finishes the current step, writes
//! a checkpoint and stops; the CLI then exits with `128 + signal` (130, 143). A second SIGINT
//! or SIGTERM while the checkpoint is being written ends the process at once, with that
//! status (the previous checkpoint is intact: checkpoints are published by rename).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::error::TrainError;

/// SIGINT's number.
pub const SIGINT: i32 = 2;
/// SIGTERM's number.
pub const SIGTERM: i32 = 15;

/// Handlers of SIGINT and SIGTERM for as long as this lives (dropping it restores the
/// previous behaviour).
pub struct StopSignals {
    caught: Arc<AtomicUsize>,
    #[cfg(unix)]
    ids: Vec<signal_hook::SigId>,
}

impl StopSignals {
    /// Installs the handlers.
    pub fn install() -> Result<Self, TrainError> {
        let caught = Arc::new(AtomicUsize::new(0));
        #[cfg(unix)]
        {
            use signal_hook::flag;
            let armed = Arc::new(AtomicBool::new(false));
            let mut ids = Vec::new();
            for sig in [SIGINT, SIGTERM] {
                let mut register = || -> std::io::Result<()> {
                    // The shutdown goes first: it only fires once the flag is armed.
                    ids.push(flag::register_conditional_shutdown(
                        sig,
                        128 + sig,
                        armed.clone(),
                    )?);
                    ids.push(flag::register_usize(sig, caught.clone(), sig as usize)?);
                    ids.push(flag::register(sig, armed.clone())?);
                    Ok(())
                };
                register().map_err(|e| TrainError::io(format!("cannot handle signal {sig}"), e))?;
            }
            Ok(Self { caught, ids })
        }
        #[cfg(not(unix))]
        {
            let _ = AtomicBool::new(false);
            Ok(Self { caught })
        }
    }

    /// The signal that asked the run to stop, if one arrived.
    pub fn caught(&self) -> Option<i32> {
        match self.caught.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        #[cfg(unix)]
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
