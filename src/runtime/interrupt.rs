//! SIGINT / SIGTERM: stop cleanly at the next batch boundary.
//!
//! The first signal only raises a flag. Long loops (reading rows, encoding,
//! training batches, scoring, writing) poll it through [`check`] and return
//! [`Error::Interrupted`]; the stack unwinds, every temporary is removed by
//! its owner's `Drop`, earlier outputs are left as they were, and the binary
//! exits 130. A second signal ends the process at once (exit 130), for a
//! user who does not want to wait for the batch in flight.
//!
//! The flag is process-wide, so it is tested end to end (tests/signals.rs)
//! rather than in the unit tests, where it would stop unrelated tests.

use std::sync::atomic::{AtomicI32, Ordering};

use crate::error::{Error, Result};

/// The first signal received, 0 while none was.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Route SIGINT and SIGTERM to the flag. Called once by `main`; library
/// users who handle signals themselves do not call it and can use
/// [`request`] instead.
pub fn install() {
    #[cfg(unix)]
    {
        extern "C" fn on_signal(sig: libc::c_int) {
            if SIGNAL.swap(sig, Ordering::SeqCst) != 0 {
                // SAFETY: _exit is async-signal-safe.
                unsafe { libc::_exit(130) };
            }
        }
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only touches an atomic and calls _exit.
            unsafe { libc::signal(sig, handler) };
        }
    }
}

/// Ask the running command to stop at the next batch boundary, as a signal
/// would.
pub fn request() {
    let _ = SIGNAL.compare_exchange(0, 2, Ordering::SeqCst, Ordering::SeqCst);
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    SIGNAL.load(Ordering::Relaxed) != 0
}

/// The error of a stop, where no more specific message applies.
pub fn error() -> Error {
    Error::Interrupted(
        "interrupted: stopped at a batch boundary; earlier outputs were left as they were".into(),
    )
}

/// `Err(`[`error()`]`)` once a stop was requested.
pub fn check() -> Result<()> {
    if requested() {
        Err(error())
    } else {
        Ok(())
    }
}
