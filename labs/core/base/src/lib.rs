//! The bottom of the labs' runtime, which every other crate of it imports:
//!
//! - `dtype`, `device_id`: element types, device names and addresses;
//! - `error`, `oom_report`: the one error type, and the out-of-memory report it carries;
//! - `format`: byte counts and durations as people read them, and back;
//! - `input`: the opening of the files users give the readers (regular files only,
//!   within a size limit per kind);
//! - `threads`: threads that fail with an error, not a panic, when none can be started.

pub mod clock;
pub mod device_id;
pub mod dtype;
pub mod error;
pub mod format;
pub mod input;
pub mod oom_report;
pub mod runtime;
pub mod testing;
pub mod threads;

pub use error::{Error, Result};
