//! CUDA streams and events as owned handles.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use crate::backend::{DeviceId, Event, EventImpl, Stream, StreamImpl};
use crate::error::{Error, Result};

pub(crate) struct CudaStream {
    raw: sys::CUstream,
    owned: bool,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUDA stream handles may be used from any thread once the context is bound,
// which every call below does.
unsafe impl Send for CudaStream {}
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// The legacy default stream (handle 0), which PyTorch also uses by default.
    pub fn legacy_default(ctx: Arc<CudaContext>) -> Self {
        CudaStream {
            raw: std::ptr::null_mut(),
            owned: false,
            ctx,
        }
    }

    pub fn create(ctx: Arc<CudaContext>, priority: i32) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let raw =
            result::stream::create_with_priority(result::stream::StreamKind::NonBlocking, priority)
                .map_err(|e| Error::driver("cuStreamCreateWithPriority", e))?;
        Ok(CudaStream {
            raw,
            owned: true,
            ctx,
        })
    }

    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes the stream's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.owned && self.bind().is_ok() {
            // SAFETY: the stream was created by us and is destroyed once.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// The CUDA stream behind `stream`, which must be `device`'s.
pub(crate) fn cuda_stream(stream: &Stream, device: DeviceId) -> Result<&CudaStream> {
    stream.downcast_on::<CudaStream>(device)
}

fn cuda_event(event: &Event) -> Result<&CudaEvent> {
    event
        .downcast::<CudaEvent>()
        .ok_or_else(|| Error::InvalidArgument("an event of another backend was used".into()))
}

impl StreamImpl for CudaStream {
    fn handle(&self) -> u64 {
        self.raw as u64
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream handle.
        unsafe { result::stream::synchronize(self.raw) }
            .map_err(|e| Error::driver("cuStreamSynchronize", e))
    }

    fn query(&self) -> Result<bool> {
        self.bind()?;
        // SAFETY: a live stream handle.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::driver("cuStreamQuery", result::DriverError(e))),
        }
    }

    fn record(&self, event: &Event) -> Result<()> {
        self.bind()?;
        let ev = cuda_event(event)?;
        // SAFETY: live handles of the same context.
        unsafe { result::event::record(ev.raw, self.raw) }
            .map_err(|e| Error::driver("cuEventRecord", e))
    }

    fn wait(&self, event: &Event) -> Result<()> {
        self.bind()?;
        let ev = cuda_event(event)?;
        // SAFETY: live handles of the same context.
        unsafe {
            result::stream::wait_event(
                self.raw,
                ev.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| Error::driver("cuStreamWaitEvent", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub(crate) struct CudaEvent {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: as for streams.
unsafe impl Send for CudaEvent {}
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    pub fn create(ctx: Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| Error::driver("cuEventCreate", e))?;
        Ok(CudaEvent { raw, ctx })
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by us, destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

impl CudaEvent {
    /// Events are queried from threads that may never have used the device (the
    /// host allocator's callers, loader workers): bind the context first.
    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))
    }
}

impl EventImpl for CudaEvent {
    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: a live event.
        unsafe { result::event::synchronize(self.raw) }
            .map_err(|e| Error::driver("cuEventSynchronize", e))
    }

    fn query(&self) -> Result<bool> {
        self.bind()?;
        // SAFETY: a live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::driver("cuEventQuery", result::DriverError(e))),
        }
    }

    fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let end = cuda_event(end)?;
        // SAFETY: live events.
        unsafe { result::event::elapsed(self.raw, end.raw) }
            .map_err(|e| Error::driver("cuEventElapsedTime", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
