//! Capturing a stream's work as a graph and replaying it: CUDA graphs
//! (`cuStreamBeginCapture`, `cuStreamEndCapture`, `cuGraphInstantiate`, `cuGraphLaunch`),
//! which PyTorch's `torch.cuda.graph` and `torch.compile(mode="reduce-overhead")` use.
//!
//! While a stream captures, the kernels, copies and fills enqueued on it are recorded,
//! not run; the instantiated graph runs them again, in the same order and on the same
//! addresses, each time it is launched. A capture forbids what would make the recording
//! wrong or wait for it: synchronising the stream or the device, reading results on the
//! host, a copy through pageable memory, giving device memory back to the driver, and
//! waiting on work outside the capture. Each such call fails with
//! [`Error::Capture`](crate::error::Error::Capture) and invalidates the capture, whose
//! end then fails too.

use std::sync::Arc;

use super::{DeviceId, Stream};
use crate::error::Result;

pub trait Graphs {
    /// Starts recording `stream`'s work (CUDA's thread-local capture mode).
    fn begin_capture(&self, stream: &Stream) -> Result<()>;
    /// Ends the capture of `stream` and instantiates what it recorded; the first
    /// forbidden call's error when the capture was invalidated.
    fn end_capture(&self, stream: &Stream) -> Result<GraphExec>;
    /// Whether `stream` is capturing now.
    fn is_capturing(&self, stream: &Stream) -> Result<bool>;
}

/// One backend's instantiated graph.
pub trait GraphExecImpl: Send + Sync {
    /// Enqueues one run of the whole graph on `stream` (the device's, checked by
    /// [`GraphExec::launch`]).
    fn launch(&self, stream: &Stream) -> Result<()>;
    /// The work items recorded: kernels, copies, fills.
    fn nodes(&self) -> usize;
}

/// An instantiated graph of one device; cheap to clone.
#[derive(Clone)]
pub struct GraphExec {
    device: DeviceId,
    inner: Arc<dyn GraphExecImpl>,
}

impl GraphExec {
    /// For backends: wraps their graph, made on `device`.
    pub fn new(device: DeviceId, inner: Arc<dyn GraphExecImpl>) -> GraphExec {
        GraphExec { device, inner }
    }

    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Enqueues one replay on `stream`, which must be the graph's device's.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        stream.check_device(self.device)?;
        self.inner.launch(stream)
    }

    /// The work items recorded.
    pub fn nodes(&self) -> usize {
        self.inner.nodes()
    }
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphExec({}, {} nodes)", self.device, self.nodes())
    }
}
