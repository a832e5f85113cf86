//! The current stream of each thread, per device (`torch.cuda.current_stream()`,
//! `with torch.cuda.stream(s):`). Work a thread gives a device without naming a stream
//! (kernels, copies, fills, the allocator's requests made for it) goes to that device's
//! current stream: its default stream, unless a [`StreamGuard`] made another current on
//! this thread. Capturing a CUDA graph needs it: the legacy default stream cannot be
//! captured, so a capture runs the region on a stream of its own made current.

use std::cell::RefCell;

use super::Device;
use crate::backend::Stream;
use crate::device_id::DeviceId;
use crate::error::{Error, Result};

thread_local! {
    /// The streams guards made current on this thread, innermost last.
    static CURRENT: RefCell<Vec<(DeviceId, Stream)>> = const { RefCell::new(Vec::new()) };
}

/// The stream a guard made current for `device` on this thread, if any.
pub(super) fn current_override(device: DeviceId) -> Option<Stream> {
    CURRENT.with(|c| {
        c.borrow()
            .iter()
            .rev()
            .find(|(d, _)| *d == device)
            .map(|(_, s)| s.clone())
    })
}

/// Makes a stream current for its device on this thread until dropped (`with
/// torch.cuda.stream(s):`); guards nest, and each restores what was current before it.
#[must_use = "the previous stream is current again when the guard is dropped"]
pub struct StreamGuard {
    device: DeviceId,
    depth: usize,
    /// The current stream is the thread's: the guard must be dropped on it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl StreamGuard {
    /// Makes `stream` current for `device` (the stream's own device) on this thread.
    pub fn new(device: &Device, stream: &Stream) -> Result<StreamGuard> {
        if stream.device() != device.id() {
            return Err(Error::WrongDevice {
                what: "a stream",
                of: stream.device(),
                used_on: device.id(),
            });
        }
        let depth = CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            c.push((device.id(), stream.clone()));
            c.len()
        });
        Ok(StreamGuard {
            device: device.id(),
            depth,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            // Guards end in the reverse order of their making, unless one was leaked
            // with `mem::forget`: then everything above this one ends with it.
            if c.len() >= self.depth && c[self.depth - 1].0 == self.device {
                c.truncate(self.depth - 1);
            }
        });
    }
}

impl Device {
    /// The stream this thread's work on the device goes to when it names none: the
    /// default stream, or the one a [`StreamGuard`] made current.
    pub fn current_stream(&self) -> Result<Stream> {
        match current_override(self.id()) {
            Some(stream) => Ok(stream),
            None => self.backend().default_stream(),
        }
    }

    /// Whether this thread's current stream on the device is being captured (work a
    /// graph records rather than runs: nothing may wait for it on the host).
    pub fn is_capturing(&self) -> Result<bool> {
        let stream = self.current_stream()?;
        self.backend().is_capturing(&stream)
    }

    /// Runs `f` with `stream` current on this thread (a [`StreamGuard`] for the call).
    pub fn with_stream<R>(&self, stream: &Stream, f: impl FnOnce() -> R) -> Result<R> {
        let _guard = StreamGuard::new(self, stream)?;
        Ok(f())
    }
}
