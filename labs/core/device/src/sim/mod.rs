//! The simulated GPU: the same device API as `cuda`, in host memory. It has a fixed
//! capacity and refuses allocations beyond it with the GPU's error, runs each stream on
//! its own thread, has events, and runs the CPU twin of every kernel. The host device
//! (`cpu`) is the same machinery with the capacity of the machine and inline execution.
//!
//! Its stream-ordered allocations (`cuMemAllocAsync`) come from pools that model the
//! driver's (`async_pool.rs`): reuse in stream order, memory kept up to a release
//! threshold and given back at synchronisations or when trimmed.
//!
//! Its collectives move data through an exchange where the ranks' inputs meet on the
//! host (`collectives.rs`), computing on the host what NCCL computes on the GPUs.
//!
//! A dry run (`dry`) is the simulated GPU with its work taken out: memory is reserved
//! and freed exactly as on `sim` (and, backed only when touched, costs no host memory),
//! but kernels, fills and copies are skipped and reading values back is an error. The
//! allocator above it sees the same requests in the same order, so a training step's
//! peak memory on any capacity is known in the time its allocations take.

mod async_pool;
mod backing;
mod collectives;
mod graphs;
mod memory;
mod peer;
mod pinned;
mod reduce;
mod stream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::backend::prelude::*;
use crate::backend::{
    AsyncPool, DeviceId, DeviceProperties, DevicePtr, Event, FillPattern, HostPtr, ManagedAdvice,
    MemInfo, MemLocation, MemoryBackend, PhysicalMemory, PoolAttribute, Stream,
};
use crate::error::Result;
use crate::kernels::{cpu, Kernel};

use async_pool::SimPools;
use memory::SimMemory;
use pinned::{staged_copy, PinnedHost};
use stream::{sim_stream, SimEvent, SimStream, SyncHook};

pub use peer::ENV_SIM_PEER;

pub struct SimBackend {
    id: DeviceId,
    memory: Arc<SimMemory>,
    /// The stream-ordered pools, over the same memory.
    pools: Arc<SimPools>,
    inline: bool,
    /// A dry run: no kernels, no copies, no values.
    dry: bool,
    default_stream: Arc<SimStream>,
    streams: Mutex<Vec<Weak<SimStream>>>,
    next_handle: AtomicU64,
    pinned: PinnedHost,
    /// The other simulated GPUs granted access to this one's mapped memory, in order
    /// (`peer.rs`); held while access is set, as the GPU's list is.
    granted: Mutex<Vec<DeviceId>>,
}

impl SimBackend {
    /// A simulated GPU with `capacity` bytes of memory.
    pub fn new(id: DeviceId, capacity: u64) -> Self {
        let memory = Arc::new(SimMemory::new(id, capacity));
        let pools = Arc::new(SimPools::new(id, memory.clone()));
        let default_stream = SimStream::threaded(0, format!("{id}-stream-0"));
        default_stream.on_synchronize(sync_hook(&pools));
        SimBackend {
            id,
            memory,
            pools,
            inline: false,
            dry: false,
            streams: Mutex::new(vec![Arc::downgrade(&default_stream)]),
            default_stream,
            next_handle: AtomicU64::new(1),
            pinned: PinnedHost::default(),
            granted: Mutex::new(Vec::new()),
        }
    }

    /// Host memory as a device: work runs inline on the calling thread.
    pub fn host() -> Self {
        let capacity = host_memory_bytes();
        let memory = Arc::new(SimMemory::new(DeviceId::Cpu, capacity));
        let pools = Arc::new(SimPools::new(DeviceId::Cpu, memory.clone()));
        let default_stream = SimStream::inline(0);
        default_stream.on_synchronize(sync_hook(&pools));
        SimBackend {
            id: DeviceId::Cpu,
            memory,
            pools,
            inline: true,
            dry: false,
            streams: Mutex::new(vec![Arc::downgrade(&default_stream)]),
            default_stream,
            next_handle: AtomicU64::new(1),
            pinned: PinnedHost::default(),
            granted: Mutex::new(Vec::new()),
        }
    }

    // ANCHOR: dry_backend
    /// A dry run of a simulated GPU with `capacity` bytes: the same memory and streams,
    /// no work and no values.
    pub fn dry(id: DeviceId, capacity: u64) -> Self {
        SimBackend {
            dry: true,
            ..SimBackend::new(id, capacity)
        }
    }

    /// The same simulated GPU handing out addresses from `base` on, rather than from
    /// the usual place: a device whose addresses need all 64 bits.
    pub fn with_addresses_from(self, base: u64) -> Self {
        self.memory.start_addresses_at(base);
        self
    }

    /// Whether this is a dry run.
    pub fn is_dry(&self) -> bool {
        self.dry
    }

    /// The error of reading values back from a dry run.
    fn no_values(&self, what: &str) -> crate::error::Error {
        crate::error::Error::InvalidArgument(format!(
            "{what} on {}: a dry run has no values (it runs allocations only; use sim or \
             cuda to compute)",
            self.id
        ))
    }
    // ANCHOR_END: dry_backend

    /// Bytes of host memory actually materialised behind device allocations.
    pub fn backed_bytes(&self) -> u64 {
        self.memory.backed_bytes()
    }

    /// Enqueues work on `stream`, or records it there while the stream captures (a
    /// graph runs it again at each replay, hence `Fn`).
    fn enqueue(
        &self,
        stream: &Stream,
        job: impl Fn(&SimMemory) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let memory = self.memory.clone();
        sim_stream(stream, self.id)?.submit(Arc::new(move || job(&memory)))
    }
}

/// A stream's synchronisation is a synchronisation point of the pools.
fn sync_hook(pools: &Arc<SimPools>) -> SyncHook {
    let pools = Arc::downgrade(pools);
    Arc::new(move || match pools.upgrade() {
        Some(p) => p.synchronized(),
        None => Ok(()),
    })
}

/// Total RAM from /proc/meminfo; a generous constant where that is unavailable.
fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(64 << 30)
}

impl MemoryBackend for SimBackend {
    fn id(&self) -> DeviceId {
        self.id
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let total = self.memory.capacity();
        Ok(MemInfo {
            free: total - self.memory.used(),
            total,
        })
    }
}

impl Backend for SimBackend {
    fn properties(&self) -> Result<DeviceProperties> {
        let name = if self.inline {
            "host memory".to_string()
        } else if self.dry {
            "Dry run of the simulated GPU (allocations only)".to_string()
        } else {
            "Simulated GPU (host memory)".to_string()
        };
        Ok(DeviceProperties {
            name,
            total_memory: self.memory.capacity(),
            multiprocessors: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            compute_capability: (0, 0),
        })
    }
}

impl Memory for SimBackend {
    fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.memory.alloc(bytes)
    }

    // ANCHOR: sim_raw_free
    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        if self.pinned.is_mapped_device_ptr(ptr) {
            return Err(crate::error::Error::InvalidArgument(format!(
                "cuMemFree of {ptr:#x}: mapped host memory is freed with host_free"
            )));
        }
        // cuMemFree waits for the device to go idle; so does the simulator, so that no
        // queued kernel can touch memory after it is gone.
        self.synchronize()?;
        self.memory.free(ptr)
    }

    // ANCHOR_END: sim_raw_free

    fn raw_alloc_async(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        stream.check_device(self.id)?;
        self.pools.alloc(self.pools.default_pool(), bytes, stream)
    }

    fn raw_free_async(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        stream.check_device(self.id)?;
        self.pools.free(ptr, stream)
    }
}

impl AsyncPools for SimBackend {
    fn pool_default(&self) -> Result<AsyncPool> {
        Ok(self.pools.default_pool())
    }

    fn pool_create(&self) -> Result<AsyncPool> {
        Ok(self.pools.create())
    }

    fn pool_destroy(&self, pool: AsyncPool) -> Result<()> {
        self.pools.destroy(pool)
    }

    fn pool_alloc_async(
        &self,
        pool: AsyncPool,
        bytes: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        stream.check_device(self.id)?;
        self.pools.alloc(pool, bytes, stream)
    }

    fn pool_attribute(&self, pool: AsyncPool, attribute: PoolAttribute) -> Result<u64> {
        self.pools.attribute(pool, attribute)
    }

    fn pool_set_attribute(
        &self,
        pool: AsyncPool,
        attribute: PoolAttribute,
        value: u64,
    ) -> Result<()> {
        self.pools.set_attribute(pool, attribute, value)
    }

    fn pool_trim_to(&self, pool: AsyncPool, keep: u64) -> Result<()> {
        self.pools.trim_to(pool, keep)
    }
}

impl VirtualMemory for SimBackend {
    fn vm_granularity(&self) -> Result<usize> {
        Ok(memory::PAGE as usize)
    }

    fn vm_reserve(&self, bytes: usize) -> Result<DevicePtr> {
        self.memory.reserve(bytes)
    }

    fn vm_release(&self, base: DevicePtr, _bytes: usize) -> Result<()> {
        self.memory.release(base)
    }

    fn vm_create(&self, bytes: usize) -> Result<PhysicalMemory> {
        let handle = self.memory.create(bytes)?;
        Ok(PhysicalMemory::new(handle, bytes))
    }

    fn vm_map_memory(&self, ptr: DevicePtr, memory: PhysicalMemory) -> Result<()> {
        let handle = memory.handle();
        if let Err(e) = self.memory.map_physical(ptr, handle) {
            // As documented: memory that could not be mapped is released.
            let _ = self.memory.free_physical(handle);
            return Err(e);
        }
        Ok(())
    }

    fn vm_set_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let granted = self.granted.lock().unwrap();
        let devices: Vec<DeviceId> = std::iter::once(self.id)
            .chain(granted.iter().copied())
            .collect();
        self.memory.set_access(ptr, bytes, &devices)
    }

    fn vm_access(&self, ptr: DevicePtr, device: DeviceId) -> Result<bool> {
        self.memory.has_access(ptr, device)
    }

    fn vm_unmap_memory(&self, ptr: DevicePtr, bytes: usize) -> Result<PhysicalMemory> {
        let handle = self.memory.unmap_physical(ptr, bytes)?;
        Ok(PhysicalMemory::new(handle, bytes))
    }

    fn vm_free_memory(&self, memory: PhysicalMemory) -> Result<()> {
        self.memory.free_physical(memory.handle())
    }
}

impl Streams for SimBackend {
    fn default_stream(&self) -> Result<Stream> {
        Ok(Stream::new(self.id, self.default_stream.clone()))
    }

    fn new_stream(&self, _priority: i32) -> Result<Stream> {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let s = if self.inline {
            SimStream::inline(handle)
        } else {
            SimStream::threaded(handle, format!("{}-stream-{handle}", self.id))
        };
        s.on_synchronize(sync_hook(&self.pools));
        let mut streams = self.streams.lock().unwrap();
        streams.retain(|w| w.strong_count() > 0);
        streams.push(Arc::downgrade(&s));
        Ok(Stream::new(self.id, s))
    }

    fn new_event(&self) -> Result<Event> {
        Ok(SimEvent::new_event(self.id))
    }

    fn synchronize(&self) -> Result<()> {
        let streams: Vec<Arc<SimStream>> = self
            .streams
            .lock()
            .unwrap()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for s in streams {
            crate::backend::StreamImpl::synchronize(&*s)?;
        }
        Ok(())
    }
}

impl Copies for SimBackend {
    // ANCHOR: sim_copies
    fn copy_htod(&self, dst: DevicePtr, src: &[u8], stream: &Stream) -> Result<()> {
        stream.check_device(self.id)?;
        if self.dry {
            return self.memory.check_range(dst, src.len());
        }
        stream.synchronize()?;
        if self.inline || self.pinned.contains(src.as_ptr() as usize, src.len()) {
            return self.memory.write(dst, src);
        }
        // Pageable memory goes through a staging buffer, as with the driver.
        self.memory.access(&[(dst, src.len())], |p| unsafe {
            staged_copy(src.as_ptr(), p[0], src.len())
        })
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: &Stream) -> Result<()> {
        stream.check_device(self.id)?;
        // ANCHOR: dry_read_back
        if self.dry {
            let _ = (dst, src);
            return Err(self.no_values("reading device memory back"));
        }
        // ANCHOR_END: dry_read_back
        stream.synchronize()?;
        if self.inline || self.pinned.contains(dst.as_ptr() as usize, dst.len()) {
            return self.memory.read(dst, src);
        }
        let len = dst.len();
        self.memory.access(&[(src, len)], |p| unsafe {
            staged_copy(p[0], dst.as_mut_ptr(), len)
        })
    }

    fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        stream.check_device(self.id)?;
        if self.dry {
            self.memory.check_range(src, bytes)?;
            return self.memory.check_range(dst, bytes);
        }
        self.enqueue(stream, move |m| {
            m.access(&[(src, bytes), (dst, bytes)], |p| unsafe {
                std::ptr::copy(p[0], p[1], bytes)
            })
        })
    }

    // ANCHOR_END: sim_copies

    fn fill(
        &self,
        dst: DevicePtr,
        pattern: FillPattern,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        stream.check_device(self.id)?;
        if self.dry {
            return self.memory.check_range(dst, count * pattern.width());
        }
        self.enqueue(stream, move |m| m.fill(dst, pattern, count))
    }

    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        stream.check_device(self.id)?;
        if self.dry {
            return self.memory.check_range(dst, bytes);
        }
        let src = src as usize;
        if self.pinned.contains(src, bytes) {
            return self.enqueue(stream, move |m| {
                m.access(&[(dst, bytes)], |p| unsafe {
                    std::ptr::copy_nonoverlapping(src as *const u8, p[0], bytes)
                })
            });
        }
        // Pageable: what the driver does, it waits for the stream and copies through a
        // staging buffer before returning, so "async" costs the host the whole copy.
        stream.synchronize()?;
        self.memory.access(&[(dst, bytes)], |p| unsafe {
            staged_copy(src as *const u8, p[0], bytes)
        })
    }

    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        stream.check_device(self.id)?;
        let dst = dst as usize;
        if self.dry {
            // A copy into pinned memory is the first half of a round trip (an offload,
            // whose bytes come back to the device): a dry run skips it, as it skips
            // kernels. A copy the host waits on to read values is an error.
            if self.pinned.contains(dst, bytes) {
                return self.memory.check_range(src, bytes);
            }
            return Err(self.no_values("reading device memory back"));
        }
        if self.pinned.contains(dst, bytes) {
            return self.enqueue(stream, move |m| {
                m.access(&[(src, bytes)], |p| unsafe {
                    std::ptr::copy_nonoverlapping(p[0], dst as *mut u8, bytes)
                })
            });
        }
        stream.synchronize()?;
        self.memory.access(&[(src, bytes)], |p| unsafe {
            staged_copy(p[0], dst as *mut u8, bytes)
        })
    }
}

impl Kernels for SimBackend {
    // ANCHOR: sim_launch
    fn launch(&self, kernel: &Kernel, stream: &Stream) -> Result<()> {
        stream.check_device(self.id)?;
        if let Kernel::Gemm(g) = kernel {
            // cuBLAS checks its arguments when called, not when the work runs: so here.
            g.validate()?;
        }
        if self.dry {
            // Allocations only: the kernel's memory was allocated by the op; its work
            // and its values are what a dry run leaves out.
            return Ok(());
        }
        let kernel = kernel.clone();
        self.enqueue(stream, move |m| cpu::run(&kernel, m))
    }
    // ANCHOR_END: sim_launch
}

impl HostMemory for SimBackend {
    fn host_alloc(&self, bytes: usize, mapped: bool) -> Result<HostPtr> {
        self.pinned.alloc(&self.memory, bytes, mapped, self.dry)
    }

    fn host_free(&self, ptr: HostPtr) -> Result<()> {
        self.pinned.free(&self.memory, ptr)
    }

    fn host_device_ptr(&self, ptr: HostPtr) -> Result<DevicePtr> {
        self.pinned.device_ptr(self.id, ptr)
    }
}

impl ManagedMemory for SimBackend {
    fn managed_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        // The same rule as on the GPU: never more managed memory than is free.
        let info = self.mem_info()?;
        if bytes as u64 > info.free {
            return Err(crate::error::Error::OutOfMemory {
                device: self.id,
                requested: bytes as u64,
                free: info.free,
                total: info.total,
                report: None,
            });
        }
        self.memory.alloc(bytes)
    }

    fn managed_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _to: MemLocation,
        stream: &Stream,
    ) -> Result<()> {
        stream.check_device(self.id)?;
        if self.dry {
            return self.memory.check_range(ptr, bytes);
        }
        // One memory for host and device: a prefetch only has to be ordered and valid.
        self.enqueue(stream, move |m| m.access(&[(ptr, bytes)], |_| ()))
    }

    fn managed_advise(&self, ptr: DevicePtr, bytes: usize, _advice: ManagedAdvice) -> Result<()> {
        self.memory.check_range(ptr, bytes)
    }
}

/// How the kernels' CPU twins reach simulated device memory.
impl cpu::HostAccess for SimMemory {
    fn with_host_ptrs(
        &self,
        ranges: &[(DevicePtr, usize)],
        f: &mut dyn FnMut(&[*mut u8]),
    ) -> Result<()> {
        self.access(ranges, f)
    }
}
