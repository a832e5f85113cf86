//! What every lab binary shares on its command line.

use std::fmt::Display;
use std::process::ExitCode;

/// Ends a lab's `main`: prints an error as one readable message (with its causes, for
/// error types that chain them under `{:#}`) instead of a debug dump, and sets the exit
/// status.
pub fn exit<E: Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Lets a lab end quietly when the reader of its output goes away (`lab-02 | head -1`):
/// the conventional death by SIGPIPE (status 141 in a shell), as every Unix tool does,
/// instead of Rust's default of ignoring the signal and panicking in `println!`. Call
/// it first in `main`.
pub fn quiet_broken_pipe() {
    #[cfg(unix)]
    {
        extern "C" {
            fn signal(signum: i32, handler: usize) -> usize;
        }
        // The same numbers on Linux and macOS.
        const SIGPIPE: i32 = 13;
        const SIG_DFL: usize = 0;
        // SAFETY: restores the default disposition of one signal before any thread is
        // started; no handler code is installed.
        unsafe {
            signal(SIGPIPE, SIG_DFL);
        }
    }
}

/// The device a lab runs on: its `--device` flag, else `LABS_DEVICE`, else the first GPU,
/// else the simulated GPU. A fallback is announced on stderr, so that a reader without a
/// GPU knows which device the figures come from.
// ANCHOR: open_device
pub fn open_device(flag: Option<&str>) -> crate::Result<crate::Device> {
    let selection = crate::select_device(flag)?;
    if let Some(notice) = &selection.notice {
        eprintln!("{notice}");
    }
    Ok(selection.device)
}
// ANCHOR_END: open_device

/// The `--device` flag every lab takes: `#[command(flatten)]` it into a lab's arguments.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceFlag {
    /// Device to run on: cuda, cuda:N, sim, dry (the simulated GPU's allocations without
    /// kernels or values) or cpu (default: LABS_DEVICE, else the first GPU, else the
    /// simulated GPU).
    #[arg(long = "device", value_name = "DEVICE", global = true)]
    pub name: Option<String>,
}

impl DeviceFlag {
    /// The device the flag chooses, through [`open_device`].
    pub fn open(&self) -> crate::Result<crate::Device> {
        open_device(self.name.as_deref())
    }
}
