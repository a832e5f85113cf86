//! The `cuda` module where no CUDA driver can exist (WebAssembly, for the book's
//! calculator): the same entry points, each answering that there is no driver, so a
//! build for the browser keeps the simulated and dry-run devices and nothing else.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};

fn absent() -> Error {
    Error::NoDriver("this build has no CUDA backend (WebAssembly)".into())
}

/// No GPU: the error every caller of a driver function sees.
pub fn device_count() -> Result<usize> {
    Err(absent())
}

/// No device to open.
pub fn open_backend(_ordinal: usize) -> Result<Arc<dyn Backend>> {
    Err(absent())
}
