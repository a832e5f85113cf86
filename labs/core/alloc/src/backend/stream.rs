//! Streams and events. Each carries the device it belongs to, and every operation that
//! takes one checks it: a stream of `cuda:1` handed to `cuda:0` is an error on every
//! backend, never work silently ordered on the wrong device.

use std::any::Any;
use std::sync::Arc;

use crate::device_id::DeviceId;
use crate::error::{Error, Result};

pub trait Streams {
    /// The stream work goes to when none is named.
    fn default_stream(&self) -> Result<Stream>;
    /// A new stream; lower `priority` numbers run first, as in CUDA.
    fn new_stream(&self, priority: i32) -> Result<Stream>;
    fn new_event(&self) -> Result<Event>;
    /// Waits for all work on all streams (`cudaDeviceSynchronize`).
    fn synchronize(&self) -> Result<()>;
}

/// One backend's stream. Work on one stream runs in order; work on two may overlap.
pub trait StreamImpl: Send + Sync + Any {
    /// A number unique among the device's live streams (0 for the default stream).
    fn handle(&self) -> u64;
    fn synchronize(&self) -> Result<()>;
    /// True when all work enqueued so far has finished.
    fn query(&self) -> Result<bool>;
    /// Records `event` here; both belong to the same device (checked by [`Stream`]).
    fn record(&self, event: &Event) -> Result<()>;
    /// Later work on this stream waits until the event's recorded work has finished.
    fn wait(&self, event: &Event) -> Result<()>;
    fn as_any(&self) -> &dyn Any;
}

/// One backend's event: a marker in a stream that the host or other streams can wait on.
pub trait EventImpl: Send + Sync + Any {
    fn synchronize(&self) -> Result<()>;
    fn query(&self) -> Result<bool>;
    /// Milliseconds between this event and a later one, both completed.
    fn elapsed_ms(&self, end: &Event) -> Result<f32>;
    fn as_any(&self) -> &dyn Any;
}

/// An error unless a `what` of device `of` is used on that device.
fn same_device(what: &'static str, of: DeviceId, used_on: DeviceId) -> Result<()> {
    if of == used_on {
        Ok(())
    } else {
        Err(Error::WrongDevice { what, of, used_on })
    }
}

/// A stream handle of one device; cheap to clone.
#[derive(Clone)]
pub struct Stream {
    device: DeviceId,
    inner: Arc<dyn StreamImpl>,
}

impl Stream {
    /// For backends: wraps their stream, made on `device`.
    pub fn new(device: DeviceId, inner: Arc<dyn StreamImpl>) -> Stream {
        Stream { device, inner }
    }
    pub fn device(&self) -> DeviceId {
        self.device
    }
    pub fn handle(&self) -> u64 {
        self.inner.handle()
    }
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    pub fn query(&self) -> Result<bool> {
        self.inner.query()
    }
    /// Records `event` on this stream. Both must belong to one device, as in CUDA.
    pub fn record(&self, event: &Event) -> Result<()> {
        event.check_device(self.device)?;
        self.inner.record(event)
    }
    /// Later work on this stream waits for `event`. The event may be another device's
    /// of the same kind (CUDA allows waits across devices); the backend checks that it
    /// can see it.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.inner.wait(event)
    }
    /// An error unless this stream belongs to `device`.
    pub fn check_device(&self, device: DeviceId) -> Result<()> {
        same_device("stream", self.device, device)
    }
    /// The backend's own stream type, once the stream is known to be `device`'s.
    pub fn downcast_on<T: 'static>(&self, device: DeviceId) -> Result<&T> {
        self.check_device(device)?;
        self.inner.as_any().downcast_ref().ok_or_else(|| {
            Error::InvalidArgument(format!("a stream of {device} has another backend's type"))
        })
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({}, {:#x})", self.device, self.handle())
    }
}

/// An event handle of one device; cheap to clone.
#[derive(Clone)]
pub struct Event {
    device: DeviceId,
    inner: Arc<dyn EventImpl>,
}

impl Event {
    /// For backends: wraps their event, made on `device`.
    pub fn new(device: DeviceId, inner: Arc<dyn EventImpl>) -> Event {
        Event { device, inner }
    }
    pub fn device(&self) -> DeviceId {
        self.device
    }
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    pub fn query(&self) -> Result<bool> {
        self.inner.query()
    }
    /// Milliseconds from this event to `end`; both must be one device's.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        end.check_device(self.device)?;
        self.inner.elapsed_ms(end)
    }
    /// An error unless this event belongs to `device`.
    pub fn check_device(&self, device: DeviceId) -> Result<()> {
        same_device("event", self.device, device)
    }
    /// The backend's own event type, whichever device of that backend made it.
    pub fn downcast<T: 'static>(&self) -> Option<&T> {
        self.inner.as_any().downcast_ref()
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({})", self.device)
    }
}
