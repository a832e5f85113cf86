//! The current device of each thread (`torch.cuda.current_device()`, `set_device`,
//! `with torch.cuda.device(i):`): an index that whatever takes "the current device"
//! reads, `select_device` given `cuda` or `sim` without an index, or no device at all,
//! and [`Device::current`]. It is an index, not a device, as in PyTorch: the same index
//! means `cuda:i` to GPU code and `sim:i` to simulator code. An index that does not
//! exist is refused when a device is opened from it, with the count of its kind.

use std::cell::Cell;

use super::{registry, Device};
use crate::device_id::{DeviceId, DeviceKind};
use crate::error::Result;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's current device index; 0 until set.
pub fn current_device() -> usize {
    CURRENT.with(Cell::get)
}

/// Makes `index` the calling thread's current device (`torch.cuda.set_device`). On a
/// GPU already opened in this process, its context becomes current on the thread too,
/// so driver calls made directly go to it.
pub fn set_device(index: usize) -> Result<()> {
    CURRENT.with(|c| c.set(index));
    bind_cuda_context(index)
}

/// Binds `cuda:index`'s context to the thread if that GPU has been opened; a GPU not
/// yet used keeps its context uncreated (it binds itself at its first use anyway).
fn bind_cuda_context(index: usize) -> Result<()> {
    let opened = registry()
        .lock()
        .unwrap()
        .get(&DeviceId::Cuda(index))
        .cloned();
    match opened {
        Some(device) => device.backend().make_current(),
        None => Ok(()),
    }
}

// ANCHOR: device_guard
/// Makes a device index current for a scope and restores the previous one when
/// dropped (`with torch.cuda.device(i):`), on every exit path, panics included.
#[must_use = "the previous device is restored when the guard is dropped"]
pub struct DeviceGuard {
    previous: usize,
    /// The current device is the thread's: the guard must be dropped on it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl DeviceGuard {
    pub fn new(index: usize) -> Result<DeviceGuard> {
        let previous = current_device();
        set_device(index)?;
        Ok(DeviceGuard {
            previous,
            _not_send: std::marker::PhantomData,
        })
    }

    /// The index that was current before the guard, and will be again after it.
    pub fn previous(&self) -> usize {
        self.previous
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
        // Drop cannot fail; a context that bound before binds again.
        let _ = bind_cuda_context(self.previous);
    }
}

/// Runs `f` with `index` as the current device, then restores the previous one.
pub fn with_device<R>(index: usize, f: impl FnOnce() -> R) -> Result<R> {
    let _guard = DeviceGuard::new(index)?;
    Ok(f())
}
// ANCHOR_END: device_guard

impl Device {
    /// The current device of `kind` (`torch.device("cuda")` at allocation time): index
    /// [`current_device`] of that kind; an error naming the count when it does not exist.
    pub fn current(kind: DeviceKind) -> Result<Device> {
        Device::get(kind.device(current_device()))
    }
}
