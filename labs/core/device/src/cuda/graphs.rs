//! CUDA graphs: a stream's capture (`cuStreamBeginCapture` in the thread-local mode:
//! only the capturing thread's unsafe calls fail, so that other threads, such as a test
//! harness's, go on allocating; PyTorch's default is the global mode), instantiated once
//! (`cuGraphInstantiateWithFlags`) and launched as a whole (`cuGraphLaunch`). The
//! driver enforces the capture's rules: a forbidden call fails and invalidates the
//! capture, and `cuStreamEndCapture` then fails too.

use std::ptr::null_mut;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::stream::cuda_stream;
use super::CudaBackend;
use crate::backend::{DeviceId, GraphExec, GraphExecImpl, Graphs, Stream};
use crate::error::{Error, Result};

/// Runs `f` with the calling thread's capture mode relaxed, as PyTorch's allocator does
/// around `cudaMalloc` (`CUDAStreamCaptureModeGuard{cudaStreamCaptureModeRelaxed}`). A
/// capture forbids taking memory from the driver on its thread (`cuMemAlloc` fails with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) unless relaxed; the memory a capture takes
/// is its private pool's, not a node of the graph, so taking it there is safe.
pub(super) fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: swaps this thread's mode through a valid pointer; swapped back below.
    unsafe {
        let _ = sys::cuThreadExchangeStreamCaptureMode(&mut mode);
    }
    let out = f();
    // SAFETY: as above, restoring the mode the thread had.
    unsafe {
        let _ = sys::cuThreadExchangeStreamCaptureMode(&mut mode);
    }
    out
}

impl Graphs for CudaBackend {
    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        let s = cuda_stream(stream, self.id_())?;
        if s.raw().is_null() {
            return Err(Error::InvalidArgument(
                "the default stream cannot be captured (CUDA's legacy stream synchronises \
                 with every other): capture on a stream of your own"
                    .into(),
            ));
        }
        s.bind()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the stream is a live stream of this context, bound above.
        unsafe { sys::cuStreamBeginCapture_v2(s.raw(), mode) }
            .result()
            .map_err(|e| Error::driver("cuStreamBeginCapture", e))
    }

    fn end_capture(&self, stream: &Stream) -> Result<GraphExec> {
        let s = cuda_stream(stream, self.id_())?;
        s.bind()?;
        let mut graph: sys::CUgraph = null_mut();
        // SAFETY: `graph` is a valid out-pointer; the stream is this context's.
        unsafe { sys::cuStreamEndCapture(s.raw(), &mut graph) }
            .result()
            .map_err(|e| Error::driver("cuStreamEndCapture", e))?;
        let mut nodes = 0usize;
        let mut exec: sys::CUgraphExec = null_mut();
        // SAFETY: `graph` was just made by the capture and is destroyed once, below,
        // after its instantiation (which keeps what it needs).
        let instantiated = unsafe {
            let counted = sys::cuGraphGetNodes(graph, null_mut(), &mut nodes).result();
            let made = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result();
            let _ = sys::cuGraphDestroy(graph);
            counted.and(made)
        };
        instantiated.map_err(|e| Error::driver("cuGraphInstantiateWithFlags", e))?;
        Ok(GraphExec::new(
            self.id_(),
            Arc::new(CudaGraph {
                device: self.id_(),
                exec,
                nodes,
                ctx: s.context().clone(),
            }),
        ))
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        let s = cuda_stream(stream, self.id_())?;
        s.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `status` is a valid out-pointer; the stream is this context's.
        unsafe { sys::cuStreamIsCapturing(s.raw(), &mut status) }
            .result()
            .map_err(|e| Error::driver("cuStreamIsCapturing", e))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

/// An instantiated graph, destroyed with its last handle.
struct CudaGraph {
    device: DeviceId,
    exec: sys::CUgraphExec,
    nodes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: a graph exec may be launched from any thread once its context is bound, which
// every call below does; launches of one exec are serialised by the driver.
unsafe impl Send for CudaGraph {}
unsafe impl Sync for CudaGraph {}

impl GraphExecImpl for CudaGraph {
    fn launch(&self, stream: &Stream) -> Result<()> {
        let s = cuda_stream(stream, self.device)?;
        s.bind()?;
        // SAFETY: the exec is alive (owned here) and belongs to the stream's context.
        unsafe { sys::cuGraphLaunch(self.exec, s.raw()) }
            .result()
            .map_err(|e| Error::driver("cuGraphLaunch", e))
    }

    fn nodes(&self) -> usize {
        self.nodes
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the exec was made by `end_capture` and is destroyed once.
            let _ = unsafe { sys::cuGraphExecDestroy(self.exec) };
        }
    }
}
