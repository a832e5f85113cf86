//! The allocator's public face: create one, allocate, free, mark cross-stream use,
//! empty the cache, cap its memory. The policy behind it is `caching.rs`; what it
//! reports (statistics, segments, snapshots) is `report.rs`.

use std::sync::Arc;

use super::caching::State;
use super::category::Category;
use super::config::{AllocBackend, Config};
use super::lock::{Guard, Lock};
use super::stream_ordered::StreamOrdered;
use crate::backend::{DeviceId, DevicePtr, MemoryBackend, Stream};
use crate::error::{Error, Result};

/// Memory handed out by the allocator. It is a plain handle: give it back with
/// [`Allocator::free`] (tensors do this when dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The block's slot in the pool, and which of the slot's blocks it is: a stale
    /// handle is caught rather than freeing someone else's memory.
    pub(super) id: u32,
    pub(super) generation: u32,
    pub(super) ptr: DevicePtr,
    pub(super) size: u64,
    pub(super) requested: u64,
    pub(super) stream: u64,
}

impl Allocation {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The block's size after rounding.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// The size the program asked for.
    pub fn requested(&self) -> u64 {
        self.requested
    }
    /// The stream the block was allocated on.
    pub fn stream(&self) -> u64 {
        self.stream
    }
}

/// A function run when an allocation fails for good, before the error returns (PyTorch's
/// `torch._C._cuda_attach_out_of_memory_observer`). It runs without the allocator's lock
/// held, so it may read statistics or dump a snapshot.
pub type OomObserver = Arc<dyn Fn(&Allocator, &Error) + Send + Sync>;

pub struct Allocator {
    pub(super) backend: Arc<dyn MemoryBackend>,
    pub(super) device: DeviceId,
    state: Lock<State>,
    observers: std::sync::Mutex<Vec<OomObserver>>,
}

impl Allocator {
    pub fn new(backend: Arc<dyn MemoryBackend>, conf: Config) -> Result<Allocator> {
        let total = backend.mem_info()?.total;
        let page = if conf.expandable_segments {
            backend.vm_granularity()? as u64
        } else {
            0
        };
        let stream_ordered = match conf.backend {
            AllocBackend::CudaMallocAsync => Some(Box::new(StreamOrdered::new(&*backend)?)),
            AllocBackend::Native => None,
        };
        let observers: Vec<OomObserver> = match &conf.oom_snapshot {
            Some(path) => vec![snapshot_observer(path.clone())],
            None => Vec::new(),
        };
        let mut state = State::new(conf, backend.id(), total, page);
        state.stream_ordered = stream_ordered;
        Ok(Allocator {
            device: backend.id(),
            state: Lock::new(state),
            backend,
            observers: std::sync::Mutex::new(observers),
        })
    }

    pub fn device(&self) -> DeviceId {
        self.device
    }

    pub fn config(&self) -> Config {
        self.lock().conf.clone()
    }

    #[inline]
    pub(super) fn lock(&self) -> Guard<'_, State> {
        self.state.lock()
    }

    /// A block of at least `size` bytes for work on `stream`, counted under the thread's
    /// [`Category`] scope (`Other` outside any).
    pub fn malloc(&self, size: usize, stream: &Stream) -> Result<Allocation> {
        let category = Category::current().unwrap_or(Category::Other);
        self.malloc_as(size, stream, category)
    }

    /// As [`malloc`](Self::malloc), counted under `category`.
    pub fn malloc_as(
        &self,
        size: usize,
        stream: &Stream,
        category: Category,
    ) -> Result<Allocation> {
        stream.check_device(self.device)?;
        let result = {
            let mut st = self.lock();
            st.malloc(
                &*self.backend,
                size as u64,
                stream.handle(),
                Some(stream),
                category,
            )
        };
        self.observe(result)
    }

    /// As [`malloc`](Self::malloc), naming the stream by its handle (trace replay uses
    /// the trace's stream ids).
    pub fn malloc_on(&self, size: u64, stream: u64) -> Result<Allocation> {
        let result = {
            let mut st = self.lock();
            st.malloc(&*self.backend, size, stream, None, Category::Other)
        };
        self.observe(result)
    }

    // ANCHOR: oom_observer
    /// Runs `observer` whenever an allocation fails for good, before the error
    /// returns.
    pub fn attach_out_of_memory_observer(
        &self,
        observer: impl Fn(&Allocator, &Error) + Send + Sync + 'static,
    ) {
        self.observers.lock().unwrap().push(Arc::new(observer));
    }

    /// Writes a memory snapshot to `path` whenever an allocation fails for good (as the
    /// `oom_snapshot:PATH` setting does).
    pub fn dump_snapshot_on_oom(&self, path: impl Into<String>) {
        self.observers
            .lock()
            .unwrap()
            .push(snapshot_observer(path.into()));
    }

    /// Hands an out-of-memory result to the observers, outside the allocator's lock.
    #[inline(always)]
    fn observe(&self, result: Result<Allocation>) -> Result<Allocation> {
        match result {
            Ok(a) => Ok(a),
            Err(e) => Err(self.notify(e)),
        }
    }

    /// The failure path of [`observe`](Self::observe), kept out of the hot path.
    #[cold]
    #[inline(never)]
    fn notify(&self, e: Error) -> Error {
        if e.is_out_of_memory() {
            let observers = self.observers.lock().unwrap().clone();
            for observer in observers {
                observer(self, &e);
            }
        }
        e
    }
    // ANCHOR_END: oom_observer

    /// Counts `block` under another category from now on (autograd marks what it
    /// saves as activations, and stored gradients as gradients).
    pub fn set_category(&self, block: &Allocation, category: Category) -> Result<()> {
        self.lock().recategorise(block, category)
    }

    /// Autograd saved `block` for backward: it becomes an activation unless it already
    /// holds something more specific (a parameter, an input), and, when the memory
    /// history is recorded, the history notes which op saved it (`op` is called only
    /// then). One lock for both.
    pub fn mark_saved(&self, block: &Allocation, op: impl FnOnce() -> String) -> Result<()> {
        let mut st = self.lock();
        if let Category::Temporary | Category::Other = st.category_of(block)? {
            st.recategorise(block, Category::Activation)?;
        }
        if let Some(h) = st.history.as_mut() {
            h.note_saved(block.ptr, op());
        }
        Ok(())
    }

    /// The category `block` is counted under.
    pub fn category(&self, block: &Allocation) -> Result<Category> {
        self.lock().category_of(block)
    }

    /// Gives a block back to the cache. When other streams used it
    /// ([`record_stream`](Self::record_stream)), it is reused only after their work so
    /// far has completed.
    pub fn free(&self, block: Allocation) -> Result<()> {
        let mut st = self.lock();
        st.free(&*self.backend, block)
    }

    // ANCHOR: record_stream
    /// Marks `block` as used by work on `stream`, so that freeing it waits for that work.
    pub fn record_stream(&self, block: &Allocation, stream: &Stream) -> Result<()> {
        stream.check_device(self.device)?;
        let mut st = self.lock();
        st.check_handle(block)?;
        if stream.handle() == block.stream {
            return Ok(());
        }
        let uses = &mut st.blocks[block.id].stream_uses;
        if !uses.iter().any(|s| s.handle() == stream.handle()) {
            uses.push(stream.clone());
        }
        Ok(())
    }
    // ANCHOR_END: record_stream

    /// Returns every byte of cached memory no block uses to the driver (after waiting
    /// for pending cross-stream frees); returns how many bytes that was. What follows
    /// reserves as on a new allocator: the high-water mark of expandable segments
    /// (`pages.rs`) comes down to what is still reserved.
    /// While a graph is being captured it gives nothing back and returns 0, as
    /// PyTorch's does: freeing device memory would synchronise, which ends the capture.
    pub fn empty_cache(&self) -> Result<u64> {
        let mut st = self.lock();
        if st.capture_underway() {
            return Ok(0);
        }
        st.process_events(true)?;
        let released = st.release_cached(&*self.backend)?;
        st.lower_high_water();
        Ok(released)
    }

    /// Caps this process's reservations at `fraction` of the device's memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {fraction} must be in (0, 1]"
            )));
        }
        let mut st = self.lock();
        st.conf.per_process_memory_fraction = fraction;
        st.limit = (st.total as f64 * fraction) as u64;
        Ok(())
    }

    /// Checks every structural invariant and that the statistics match a recount; a
    /// description of the first violation otherwise. For tests.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.lock().check_invariants()
    }

    /// Renumbers the segments' serials, their order kept, as happens when 2^25 segments
    /// have been made. For tests, which cannot make that many: no decision may change.
    pub fn renumber_segments(&self) {
        self.lock().renumber_segments()
    }
}

impl Drop for Allocator {
    /// Returns the cache to the driver. Blocks still allocated keep their memory: a
    /// tensor may outlive a private allocator only by a bug, and freeing memory under it
    /// would turn that bug into corruption.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        st.release_all_pools();
        let result = st
            .process_events(true)
            .and_then(|_| st.release_cached(&*self.backend).map(|_| ()));
        // The pool goes back to the driver once nothing allocated from it is live.
        let result = match st.stream_ordered.take() {
            Some(so) => result.and_then(|_| self.backend.pool_destroy(so.pool)),
            None => result,
        };
        if let Err(e) = result {
            eprintln!("warning: releasing the cache of {}: {e}", self.device);
        }
    }
}

/// The observer of `oom_snapshot:PATH`: the snapshot at the failure, for `lab-03`.
fn snapshot_observer(path: String) -> OomObserver {
    Arc::new(move |a: &Allocator, _: &Error| {
        if let Err(e) = a.dump_snapshot(&path) {
            eprintln!("warning: writing the out-of-memory snapshot to {path}: {e}");
        }
    })
}
