//! `torch.cuda.CUDAGraph` and `with torch.cuda.graph(g, pool=...):`: a region of work
//! captured once on a stream of its own and replayed as a whole, with the memory the
//! region allocates taken from a private pool of the caching allocator.
//!
//! [`Graph::capture`] synchronises the device, empties the cache, makes the capture
//! stream current on the calling thread, sends every allocation on that stream to the
//! graph's pool (its own, or one shared with other graphs through [`Graph::pool`]), and
//! records the region's work. The tensors the region allocates keep their addresses: each
//! [`replay`](Graph::replay) recomputes them in place from whatever the inputs it read
//! hold then, so a captured step takes new data by copying it into the same input
//! tensors. The pool's blocks serve no allocation outside the graphs that share it, so
//! eager work cannot take memory a replay writes; it goes back to the driver once every
//! graph sharing it is dropped and its blocks are freed.

use std::sync::Arc;

use super::{Device, StreamGuard};
use crate::alloc::MemPoolId;
use crate::backend::{GraphExec, Stream};
use crate::error::{Error, Result};

/// A private pool graphs share (`graph.pool()`, `torch.cuda.graph_pool_handle()`):
/// released when the last graph holding it is dropped.
#[derive(Clone)]
pub struct GraphPool(Arc<PoolOwner>);

struct PoolOwner {
    device: Device,
    id: MemPoolId,
}

impl GraphPool {
    /// A new private pool on `device`'s allocator.
    pub fn new(device: &Device) -> Result<GraphPool> {
        let id = device.allocator()?.create_pool();
        Ok(GraphPool(Arc::new(PoolOwner {
            device: device.clone(),
            id,
        })))
    }

    pub fn id(&self) -> MemPoolId {
        self.0.id
    }
}

impl Drop for PoolOwner {
    fn drop(&mut self) {
        if let Ok(a) = self.device.allocator() {
            // Blocks still alive keep their segments until freed (`release_pool`).
            let _ = a.release_pool(self.id);
        }
    }
}

/// A captured region of work and the pool its memory came from.
pub struct Graph {
    device: Device,
    stream: Stream,
    pool: Option<GraphPool>,
    exec: Option<GraphExec>,
}

/// The stream graphs capture on unless given one, one per device (PyTorch's
/// `CUDAGraph.default_capture_stream`). One stream for all matters to sharing: a
/// pool's free blocks serve requests on the stream they were made for, so graphs that
/// share a pool reuse each other's memory only when they capture on the same stream.
fn default_capture_stream(device: &Device) -> Result<Stream> {
    if let Some(s) = device.inner.capture_stream.get() {
        return Ok(s.clone());
    }
    let made = device.new_stream()?;
    Ok(device.inner.capture_stream.get_or_init(|| made).clone())
}

impl Graph {
    /// An empty graph of `device`, capturing on the device's default capture stream.
    pub fn new(device: &Device) -> Result<Graph> {
        Graph::on_stream(device, &default_capture_stream(device)?)
    }

    /// An empty graph that captures on `stream` (`torch.cuda.graph(g, stream=s)`).
    pub fn on_stream(device: &Device, stream: &Stream) -> Result<Graph> {
        stream.check_device(device.id())?;
        Ok(Graph {
            device: device.clone(),
            stream: stream.clone(),
            pool: None,
            exec: None,
        })
    }

    /// Captures `region`: every kernel, copy and fill it enqueues on the device is
    /// recorded instead of run, and every allocation it makes there comes from `pool`
    /// (a new pool of the graph's own when `None`). Returns what `region` returned. An
    /// error of `region`, or a call the capture forbids (synchronising, reading values
    /// on the host), ends the capture and is returned; the graph then has nothing to
    /// replay and may capture again. Once a capture has succeeded, the graph captures no
    /// more.
    pub fn capture<R, E: From<Error>>(
        &mut self,
        pool: Option<&GraphPool>,
        region: impl FnOnce() -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        if self.exec.is_some() {
            return Err(Error::InvalidArgument(
                "this graph has already been captured; make a new one".into(),
            )
            .into());
        }
        if let Some(p) = pool {
            if p.0.device.id() != self.device.id() {
                return Err(Error::WrongDevice {
                    what: "a graph pool",
                    of: p.0.device.id(),
                    used_on: self.device.id(),
                }
                .into());
            }
        }
        let pool = match pool {
            Some(p) => p.clone(),
            None => GraphPool::new(&self.device)?,
        };
        // The capture stream's matrix-product workspace, from the cache now rather than
        // from the graph's pool during the capture, where products have run before (the
        // warm-up of a captured step); a region that never multiplies takes none, as in
        // PyTorch, whose workspaces come with a stream's first product.
        if self.device.has_gemm_workspace() {
            self.device.ensure_stream_gemm_workspace(&self.stream)?;
        }
        // Whatever ran before is done: the capture records only the region. Then, as
        // `torch.cuda.graph` does, the cache goes back to the driver, so that the
        // graph's pool can take what the region needs.
        self.device.synchronize()?;
        let allocator = self.device.allocator()?;
        allocator.empty_cache()?;
        let backend = self.device.backend();
        allocator.begin_allocate_stream_to_pool(pool.id(), &self.stream)?;
        let outcome = (|| -> std::result::Result<(R, GraphExec), E> {
            let _current = StreamGuard::new(&self.device, &self.stream)?;
            backend.begin_capture(&self.stream)?;
            let value = region();
            // The capture ends whatever happened, so that the stream is usable again.
            let ended = backend.end_capture(&self.stream);
            let value = value?;
            Ok((value, ended?))
        })();
        let stopped = allocator.end_allocate_stream_to_pool(pool.id(), &self.stream);
        let (value, exec) = outcome?;
        stopped?;
        self.pool = Some(pool);
        self.exec = Some(exec);
        Ok(value)
    }

    /// Enqueues one run of the captured work on the calling thread's current stream.
    pub fn replay(&self) -> Result<()> {
        let exec = self.exec.as_ref().ok_or_else(|| {
            Error::InvalidArgument("replay of a graph that has not been captured".into())
        })?;
        exec.launch(&self.device.current_stream()?)
    }

    /// The pool the graph's memory came from, to share with a graph captured later
    /// (`pool=g.pool()`); `None` before the capture.
    pub fn pool(&self) -> Option<GraphPool> {
        self.pool.clone()
    }

    /// The work items the capture recorded (none on a dry run, which enqueues none).
    pub fn nodes(&self) -> usize {
        self.exec.as_ref().map_or(0, GraphExec::nodes)
    }
}
