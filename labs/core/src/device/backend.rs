//! The contract every backend fulfils. The GPU (`cuda`), the simulated GPU (`sim`) and
//! host memory (`cpu`) implement it, so everything above it (allocator, tensors, labs)
//! is written once.

use std::any::Any;
use std::sync::Arc;

use super::DeviceId;
use crate::error::Result;
use crate::kernels::Kernel;

/// A device address. On `cuda` it is a real `CUdeviceptr`; on `sim` and `cpu` it is an
/// address in the backend's own simulated address space.
pub type DevicePtr = u64;

// ANCHOR: device_properties
/// What a device says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProperties {
    pub name: String,
    pub total_memory: u64,
    pub multiprocessors: u32,
    /// (major, minor); the simulator reports (0, 0).
    pub compute_capability: (u32, u32),
}
// ANCHOR_END: device_properties

// ANCHOR: mem_info
/// Free and total memory, as `cudaMemGetInfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}
// ANCHOR_END: mem_info

/// A bit pattern to fill memory with (`cuMemsetD8/D16/D32`): fills work for every dtype
/// by writing the element's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillPattern {
    U8(u8),
    U16(u16),
    U32(u32),
}

impl FillPattern {
    pub fn width(self) -> usize {
        match self {
            FillPattern::U8(_) => 1,
            FillPattern::U16(_) => 2,
            FillPattern::U32(_) => 4,
        }
    }
}

// ANCHOR: backend_trait
pub trait Backend: Send + Sync + 'static {
    fn id(&self) -> DeviceId;
    /// Name, memory, multiprocessors, compute capability. On `cuda` this is the first
    /// call that initialises the context.
    fn properties(&self) -> Result<DeviceProperties>;
    fn mem_info(&self) -> Result<MemInfo>;

    /// A raw device allocation (`cuMemAlloc`): slow, synchronising, and exactly what a
    /// caching allocator exists to avoid.
    fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Releases a raw allocation (`cuMemFree`); it synchronises the device first.
    fn raw_free(&self, ptr: DevicePtr) -> Result<()>;

    /// The driver's stream-ordered pool (`cuMemAllocAsync`): the allocation is usable by
    /// work on `stream` after the call.
    fn raw_alloc_async(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr>;
    /// Returns memory to the stream-ordered pool once `stream`'s earlier work is done.
    fn raw_free_async(&self, ptr: DevicePtr, stream: &Stream) -> Result<()>;

    /// The page size of virtual memory mappings (`cuMemGetAllocationGranularity`).
    fn vm_granularity(&self) -> Result<usize>;
    /// Reserves a range of device addresses with no memory behind it
    /// (`cuMemAddressReserve`); `bytes` is a multiple of the granularity.
    fn vm_reserve(&self, bytes: usize) -> Result<DevicePtr>;
    /// Gives a reserved range back (`cuMemAddressFree`); none of it may be mapped.
    fn vm_release(&self, base: DevicePtr, bytes: usize) -> Result<()>;
    /// Creates physical memory and maps it at `ptr..ptr+bytes` inside a reserved range,
    /// readable and writable by the device (`cuMemCreate` + `cuMemMap` +
    /// `cuMemSetAccess`). The unit of `vm_unmap` is the unit mapped here.
    fn vm_map(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Unmaps what one `vm_map` mapped and releases its memory (`cuMemUnmap` +
    /// `cuMemRelease`). The caller makes sure no queued work still uses it.
    fn vm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;

    /// The stream work goes to when none is named.
    fn default_stream(&self) -> Result<Stream>;
    /// A new stream; lower `priority` numbers run first, as in CUDA.
    fn new_stream(&self, priority: i32) -> Result<Stream>;
    fn new_event(&self) -> Result<Event>;

    /// Copies host memory to the device, ordered after the stream's earlier work; returns
    /// when the copy is done (pageable memory: the host buffer may be reused at once).
    fn copy_htod(&self, dst: DevicePtr, src: &[u8], stream: &Stream) -> Result<()>;
    /// Copies device memory to the host after the stream's earlier work; returns when done.
    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: &Stream) -> Result<()>;
    /// Enqueues a device-to-device copy; asynchronous.
    fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Enqueues a fill of `count` elements of the pattern's width; asynchronous.
    fn fill(
        &self,
        dst: DevicePtr,
        pattern: FillPattern,
        count: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Enqueues a kernel; asynchronous.
    fn launch(&self, kernel: &Kernel, stream: &Stream) -> Result<()>;
    /// Waits for all work on all streams (`cudaDeviceSynchronize`).
    fn synchronize(&self) -> Result<()>;

    // Host memory the device can reach, and memory that migrates (chapters 6 and 8).

    /// Page-locked host memory (`cuMemHostAlloc`, portable to every context): the DMA
    /// engines read it directly, so copies from it can run asynchronously. `mapped` also
    /// maps it into the device's address space (`CU_MEMHOSTALLOC_DEVICEMAP`).
    fn host_alloc(&self, bytes: usize, mapped: bool) -> Result<HostPtr>;
    /// Releases memory from `host_alloc` (`cuMemFreeHost`); no queued copy may still use it.
    fn host_free(&self, ptr: HostPtr) -> Result<()>;
    /// The device address of mapped host memory (`cuMemHostGetDevicePointer`): kernels
    /// given it read and write host memory over the bus.
    fn host_device_ptr(&self, ptr: HostPtr) -> Result<DevicePtr>;
    /// Enqueues a copy of `bytes` from host memory at `src` (`cuMemcpyHtoDAsync`). From
    /// page-locked memory it returns at once; from pageable memory the driver stages it
    /// and the call returns only once the source has been read.
    ///
    /// # Safety
    /// `src..src+bytes` must stay valid and unmodified until the stream has passed the
    /// copy (record an event after it and wait for that).
    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Enqueues a copy to host memory at `dst` (`cuMemcpyDtoHAsync`); see `copy_htod_async`.
    ///
    /// # Safety
    /// `dst..dst+bytes` must stay valid, and unread, until the stream has passed the copy.
    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Managed (unified) memory (`cuMemAllocManaged`), refused with an out-of-memory
    /// error when larger than the device's free memory: oversubscribing managed memory
    /// can stall the GPU for minutes.
    fn managed_alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees managed memory: `cuMemFree`, as for any device allocation.
    fn managed_free(&self, ptr: DevicePtr) -> Result<()> {
        self.raw_free(ptr)
    }
    /// Enqueues a migration of managed memory (`cuMemPrefetchAsync`).
    fn managed_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        to: MemLocation,
        stream: &Stream,
    ) -> Result<()>;
    /// A hint about how managed memory will be used (`cuMemAdvise`).
    fn managed_advise(&self, ptr: DevicePtr, bytes: usize, advice: ManagedAdvice) -> Result<()>;
}

/// A host address of page-locked memory from `Backend::host_alloc`.
pub type HostPtr = *mut u8;

/// Where managed memory should live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemLocation {
    Device,
    Host,
}

/// The `cuMemAdvise` hints the labs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedAdvice {
    /// Read-only copies may live on every processor that reads.
    ReadMostly,
    /// Pages stay at this location and others map them rather than migrating them.
    PreferredLocation(MemLocation),
}
// ANCHOR_END: backend_trait

/// One backend's stream. Work on one stream runs in order; work on two may overlap.
pub trait StreamImpl: Send + Sync + Any {
    /// A number unique among the device's live streams (0 for the default stream).
    fn handle(&self) -> u64;
    fn synchronize(&self) -> Result<()>;
    /// True when all work enqueued so far has finished.
    fn query(&self) -> Result<bool>;
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

/// A stream handle; cheap to clone.
#[derive(Clone)]
pub struct Stream(pub(crate) Arc<dyn StreamImpl>);

impl Stream {
    pub fn handle(&self) -> u64 {
        self.0.handle()
    }
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
    pub fn query(&self) -> Result<bool> {
        self.0.query()
    }
    pub fn record(&self, event: &Event) -> Result<()> {
        self.0.record(event)
    }
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.0.wait(event)
    }
    pub(crate) fn downcast<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:#x})", self.handle())
    }
}

/// An event handle; cheap to clone.
#[derive(Clone)]
pub struct Event(pub(crate) Arc<dyn EventImpl>);

impl Event {
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
    pub fn query(&self) -> Result<bool> {
        self.0.query()
    }
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.0.elapsed_ms(end)
    }
    pub(crate) fn downcast<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }
}
