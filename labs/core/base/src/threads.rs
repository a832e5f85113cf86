//! Starting threads: a thread the system cannot start (its limit on threads or on
//! memory reached) is an error naming what it was for, never a panic.

use std::cell::Cell;
use std::thread::JoinHandle;

use crate::error::{Error, Result};

thread_local! {
    /// How many of the next threads started from this thread fail, as the system's
    /// refusal would (set by the testing module's `fail_thread_spawns`).
    static FAIL_NEXT: Cell<usize> = const { Cell::new(0) };
}

/// Starts `f` on a new thread named `name`; `what` says what the thread is for, in the
/// error when it cannot start.
pub fn spawn<T: Send + 'static>(
    name: String,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>> {
    let injected = FAIL_NEXT.with(|n| {
        let left = n.get();
        n.set(left.saturating_sub(1));
        left > 0
    });
    let started = if injected {
        Err(std::io::Error::from(std::io::ErrorKind::WouldBlock))
    } else {
        std::thread::Builder::new().name(name).spawn(f)
    };
    started.map_err(|e| Error::Driver {
        call: "starting a thread",
        message: format!(
            "cannot start {what}: {e} (the system's limit on threads or on memory is reached)"
        ),
    })
}

/// Makes the next `count` threads this thread starts through [`spawn`] fail.
#[doc(hidden)]
pub fn fail_next_spawns(count: usize) {
    FAIL_NEXT.with(|n| n.set(count));
}
