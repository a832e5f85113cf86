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
