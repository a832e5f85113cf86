//! The real GPU, through the CUDA driver API (cudarc, loaded dynamically). Nothing here
//! runs at build time and nothing touches the GPU until a device is first used: the
//! context is created lazily, as PyTorch does, so that merely naming `cuda:0` is free.

mod async_pool;
mod blas;
mod collectives;
mod graphs;
mod kernels;
pub mod nccl;
mod peer;
mod stream;

use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext};

use crate::backend::prelude::*;
use crate::backend::{
    check_size, DeviceId, DeviceProperties, DevicePtr, Event, FillPattern, HostPtr, ManagedAdvice,
    MemInfo, MemLocation, MemoryBackend, PhysicalMemory, Stream,
};
use crate::error::{Error, Result};
use crate::kernels::Kernel;

use blas::Blas;
use kernels::ModuleCache;
use peer::{access_desc, Mappings};
use stream::{cuda_stream, CudaEvent, CudaStream};

// ANCHOR: driver_probe
/// Loads the driver library once. cudarc panics when it cannot load `libcuda`, so the
/// presence check comes first and turns absence into an error.
fn driver() -> Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: only probes for the library; loading has no other side effects.
            if !unsafe { sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda.so) was not found".into());
            }
            result::init().map_err(|e| format!("cuInit failed: {e}"))
        })
        .clone()
        .map_err(Error::NoDriver)
}
// ANCHOR_END: driver_probe

/// How many matrix products with a bias this process has run on the GPU as a cuBLAS
/// product and a separate broadcast add, because cuBLASLt did not take them (a
/// dimension of 1, an unaligned bias, no algorithm): the rest added their bias in the
/// product. Both launch as one [`Kernel::Gemm`], so this is how a test tells them apart.
pub fn separate_bias_adds() -> u64 {
    blas::SEPARATE_BIAS_ADDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Number of CUDA devices; an error when there is no usable driver.
pub fn device_count() -> Result<usize> {
    driver()?;
    result::device::get_count()
        .map(|n| n as usize)
        .map_err(|e| Error::NoDriver(format!("cuDeviceGetCount failed: {e}")))
}

/// Device `ordinal`'s backend, for the registry (its context is made at first use).
pub fn open_backend(ordinal: usize) -> Result<Arc<dyn crate::backend::Backend>> {
    Ok(Arc::new(CudaBackend::open(ordinal)?))
}

pub struct CudaBackend {
    ordinal: usize,
    state: OnceLock<Arc<State>>,
}

/// Everything that exists only once the context does.
struct State {
    ctx: Arc<CudaContext>,
    default_stream: Stream,
    modules: ModuleCache,
    /// cuBLAS, for [`Kernel::Gemm`]: its handle is made on the first product.
    blas: Blas,
    multiprocessors: u32,
    /// The GPUs whose memory this context may read (`cuCtxEnablePeerAccess` done).
    peers: std::sync::Mutex<std::collections::HashSet<usize>>,
    /// What `vm_map_memory` mapped, and the peers granted access to it (`peer.rs`).
    mappings: std::sync::Mutex<Mappings>,
}

impl CudaBackend {
    /// Checks that the device exists; creates no context.
    pub fn open(ordinal: usize) -> Result<Self> {
        let available = device_count()?;
        if ordinal >= available {
            return Err(Error::NoSuchDevice {
                requested: DeviceId::Cuda(ordinal),
                available,
            });
        }
        Ok(CudaBackend {
            ordinal,
            state: OnceLock::new(),
        })
    }

    // ANCHOR: lazy_context
    /// The context, created on first use and bound to the calling thread.
    fn state(&self) -> Result<&State> {
        let state = match self.state.get() {
            Some(s) => s,
            None => {
                let ctx = CudaContext::new(self.ordinal)
                    .map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?;
                let multiprocessors = ctx
                    .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                    .map_err(|e| Error::driver("cuDeviceGetAttribute", e))?
                    as u32;
                let default_stream = Stream::new(
                    DeviceId::Cuda(self.ordinal),
                    Arc::new(CudaStream::legacy_default(ctx.clone())),
                );
                let _ = self.state.set(Arc::new(State {
                    modules: ModuleCache::new(ctx.clone()),
                    blas: Blas::new(ctx.clone()),
                    ctx,
                    default_stream,
                    multiprocessors,
                    peers: Default::default(),
                    mappings: Default::default(),
                }));
                self.state.get().expect("just set")
            }
        };
        state
            .ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        Ok(state)
    }
    // ANCHOR_END: lazy_context

    fn id_(&self) -> DeviceId {
        DeviceId::Cuda(self.ordinal)
    }

    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is a valid value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal as i32;
        prop
    }

    fn oom_or(&self, call: &'static str, bytes: usize, e: sys::CUresult) -> Error {
        if e == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            match self.mem_info() {
                Ok(info) => Error::OutOfMemory {
                    device: self.id_(),
                    requested: bytes as u64,
                    free: info.free,
                    total: info.total,
                    report: None,
                },
                Err(e) => e,
            }
        } else {
            Error::driver(call, format!("{e:?}"))
        }
    }
}

impl MemoryBackend for CudaBackend {
    fn id(&self) -> DeviceId {
        self.id_()
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.state()?;
        let (free, total) = result::mem_get_info().map_err(|e| Error::driver("cuMemGetInfo", e))?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }
}

impl Backend for CudaBackend {
    fn properties(&self) -> Result<DeviceProperties> {
        let s = self.state()?;
        let (major, minor) = s
            .ctx
            .compute_capability()
            .map_err(|e| Error::driver("cuDeviceGetAttribute", e))?;
        Ok(DeviceProperties {
            name: s
                .ctx
                .name()
                .map_err(|e| Error::driver("cuDeviceGetName", e))?,
            total_memory: s
                .ctx
                .total_mem()
                .map_err(|e| Error::driver("cuDeviceTotalMem", e))?
                as u64,
            multiprocessors: s.multiprocessors,
            compute_capability: (major as u32, minor as u32),
        })
    }

    fn make_current(&self) -> Result<()> {
        self.state().map(|_| ())
    }
}

impl Memory for CudaBackend {
    // ANCHOR: cuda_raw_alloc
    fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.state()?;
        // SAFETY: a plain allocation; the pointer is owned by the caller. Relaxed, so
        // that a capture's private pool can grow (`graphs::relaxed`).
        match graphs::relaxed(|| unsafe { result::malloc_sync(bytes.max(1)) }) {
            Ok(p) => Ok(p),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let info = self.mem_info()?;
                check_size(self.id_(), bytes, info.total)?;
                Err(Error::OutOfMemory {
                    device: self.id_(),
                    requested: bytes as u64,
                    free: info.free,
                    total: info.total,
                    report: None,
                })
            }
            Err(e) => Err(Error::driver("cuMemAlloc", e)),
        }
    }

    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        self.state()?;
        // SAFETY: the caller owns `ptr`, obtained from `raw_alloc` and not yet freed.
        unsafe { result::free_sync(ptr) }.map_err(|e| Error::driver("cuMemFree", e))
    }

    // ANCHOR_END: cuda_raw_alloc

    fn raw_alloc_async(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the stream belongs to this context.
        let r = unsafe { sys::cuMemAllocAsync(&mut ptr, bytes.max(1), raw) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(self.oom_or("cuMemAllocAsync", bytes, r));
        }
        Ok(ptr)
    }

    fn raw_free_async(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        // SAFETY: `ptr` came from `raw_alloc_async` and is freed once.
        unsafe { sys::cuMemFreeAsync(ptr, raw) }
            .result()
            .map_err(|e| Error::driver("cuMemFreeAsync", e))
    }
}

impl VirtualMemory for CudaBackend {
    fn vm_granularity(&self) -> Result<usize> {
        self.state()?;
        let prop = self.allocation_prop();
        let mut granularity = 0usize;
        // SAFETY: valid pointers to a granularity and a filled-in property struct.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(|e| Error::driver("cuMemGetAllocationGranularity", e))?;
        Ok(granularity)
    }

    // ANCHOR: vm_reserve
    fn vm_reserve(&self, bytes: usize) -> Result<DevicePtr> {
        // Page-aligned, so that every page of the range can be mapped on its own.
        let alignment = self.vm_granularity()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: reserves address space only; `ptr` is a valid out-pointer.
        graphs::relaxed(|| unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, alignment, 0, 0) })
            .result()
            .map_err(|e| Error::driver("cuMemAddressReserve", e))?;
        Ok(ptr)
    }

    // ANCHOR_END: vm_reserve

    fn vm_release(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        self.state()?;
        // SAFETY: the range was reserved by `vm_reserve` and nothing in it is mapped.
        unsafe { sys::cuMemAddressFree(base, bytes) }
            .result()
            .map_err(|e| Error::driver("cuMemAddressFree", e))
    }

    // ANCHOR: vm_map
    fn vm_create(&self, bytes: usize) -> Result<PhysicalMemory> {
        self.state()?;
        let prop = self.allocation_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct.
        let r = graphs::relaxed(|| unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) });
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(self.oom_or("cuMemCreate", bytes, r));
        }
        Ok(PhysicalMemory::new(handle, bytes))
    }

    fn vm_map_memory(&self, ptr: DevicePtr, memory: PhysicalMemory) -> Result<()> {
        let s = self.state()?;
        let (handle, bytes) = (memory.handle(), memory.bytes());
        // SAFETY: `ptr..ptr+bytes` lies in a range this backend reserved and is unmapped.
        let mapped = graphs::relaxed(|| unsafe { sys::cuMemMap(ptr, bytes, 0, handle, 0) });
        if let Err(e) = mapped.result() {
            // SAFETY: the memory was handed to us and, as the contract says, is released
            // when it cannot be mapped.
            unsafe {
                let _ = sys::cuMemRelease(handle);
            }
            return Err(Error::driver("cuMemMap", e));
        }
        s.mappings.lock().unwrap().insert(ptr, handle, bytes);
        Ok(())
    }

    fn vm_set_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let s = self.state()?;
        // Held through the call, so that a peer granted access meanwhile (which walks
        // the mappings under this lock) cannot miss the range.
        let mappings = s.mappings.lock().unwrap();
        let descs: Vec<sys::CUmemAccessDesc> = std::iter::once(self.ordinal)
            .chain(mappings.peers().iter().copied())
            .map(access_desc)
            .collect();
        // SAFETY: the caller maps the whole range first; `descs` are valid descriptors.
        graphs::relaxed(|| unsafe { sys::cuMemSetAccess(ptr, bytes, descs.as_ptr(), descs.len()) })
            .result()
            .map_err(|e| Error::driver("cuMemSetAccess", e))
    }
    // ANCHOR_END: vm_map

    fn vm_access(&self, ptr: DevicePtr, device: DeviceId) -> Result<bool> {
        self.state()?;
        let DeviceId::Cuda(ordinal) = device else {
            return Ok(false);
        };
        let location = access_desc(ordinal).location;
        let mut flags: std::ffi::c_ulonglong = 0;
        // SAFETY: a valid out-pointer and location; the driver checks the address.
        unsafe { sys::cuMemGetAccess(&mut flags, &location, ptr) }
            .result()
            .map_err(|e| Error::driver("cuMemGetAccess", e))?;
        Ok(flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u64)
    }

    fn vm_unmap_memory(&self, ptr: DevicePtr, bytes: usize) -> Result<PhysicalMemory> {
        let s = self.state()?;
        let handle = s.mappings.lock().unwrap().remove(ptr).ok_or_else(|| {
            Error::InvalidArgument(format!("vm_unmap of {ptr:#x}: nothing mapped there"))
        })?;
        // SAFETY: the mapping was made by `vm_map_memory`; the caller guarantees no
        // queued work uses it any more.
        if let Err(e) = unsafe { sys::cuMemUnmap(ptr, bytes) }.result() {
            s.mappings.lock().unwrap().insert(ptr, handle, bytes);
            return Err(Error::driver("cuMemUnmap", e));
        }
        Ok(PhysicalMemory::new(handle, bytes))
    }

    fn vm_free_memory(&self, memory: PhysicalMemory) -> Result<()> {
        self.state()?;
        // SAFETY: the handle is mapped nowhere (the type says so) and released once.
        unsafe { sys::cuMemRelease(memory.handle()) }
            .result()
            .map_err(|e| Error::driver("cuMemRelease", e))
    }
}

impl Streams for CudaBackend {
    fn default_stream(&self) -> Result<Stream> {
        Ok(self.state()?.default_stream.clone())
    }

    fn new_stream(&self, priority: i32) -> Result<Stream> {
        let s = self.state()?;
        Ok(Stream::new(
            self.id_(),
            Arc::new(CudaStream::create(s.ctx.clone(), priority)?),
        ))
    }

    fn new_event(&self) -> Result<Event> {
        let s = self.state()?;
        Ok(Event::new(
            self.id_(),
            Arc::new(CudaEvent::create(s.ctx.clone())?),
        ))
    }

    fn synchronize(&self) -> Result<()> {
        self.state()?
            .ctx
            .synchronize()
            .map_err(|e| Error::driver("cuCtxSynchronize", e))
    }
}

impl Copies for CudaBackend {
    fn copy_htod(&self, dst: DevicePtr, src: &[u8], stream: &Stream) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        // SAFETY: `src` outlives the call, which waits for the copy to finish.
        unsafe { result::memcpy_htod_async(dst, src, raw) }
            .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))?;
        stream.synchronize()
    }

    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: &Stream) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        // SAFETY: `dst` outlives the call, which waits for the copy to finish.
        unsafe { result::memcpy_dtoh_async(dst, src, raw) }
            .map_err(|e| Error::driver("cuMemcpyDtoHAsync", e))?;
        stream.synchronize()
    }

    fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        // SAFETY: both ranges are device memory the caller keeps alive until the copy is done.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, raw) }
            .map_err(|e| Error::driver("cuMemcpyDtoDAsync", e))
    }

    fn fill(
        &self,
        dst: DevicePtr,
        pattern: FillPattern,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        // SAFETY: `dst` is device memory of at least `count * width` bytes.
        let r = unsafe {
            match pattern {
                FillPattern::U8(v) => sys::cuMemsetD8Async(dst, v, count, raw),
                FillPattern::U16(v) => sys::cuMemsetD16Async(dst, v, count, raw),
                FillPattern::U32(v) => sys::cuMemsetD32Async(dst, v, count, raw),
                // No 64-bit memset: the low and high words are two strided 32-bit
                // fills, one "row" of one word per element, 8 bytes apart.
                FillPattern::U64(v) => {
                    let low = sys::cuMemsetD2D32Async(dst, 8, v as u32, 1, count, raw);
                    if low != sys::CUresult::CUDA_SUCCESS {
                        low
                    } else {
                        sys::cuMemsetD2D32Async(dst + 4, 8, (v >> 32) as u32, 1, count, raw)
                    }
                }
            }
        };
        r.result().map_err(|e| Error::driver("cuMemsetAsync", e))
    }

    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        sys::cuMemcpyHtoDAsync_v2(dst, src as *const std::ffi::c_void, bytes, raw)
            .result()
            .map_err(|e| Error::driver("cuMemcpyHtoDAsync", e))
    }

    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        sys::cuMemcpyDtoHAsync_v2(dst as *mut std::ffi::c_void, src, bytes, raw)
            .result()
            .map_err(|e| Error::driver("cuMemcpyDtoHAsync", e))
    }
}

impl Kernels for CudaBackend {
    fn launch(&self, kernel: &Kernel, stream: &Stream) -> Result<()> {
        let s = self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        match kernel {
            Kernel::Gemm(g) => {
                if s.blas.gemm(g, raw, stream.handle())? {
                    return Ok(());
                }
                // cuBLASLt did not take the bias: cuBLAS ran the product, and the bias
                // is added to its dense rows after it, on the same stream.
                let add = g.bias_add().expect("gemm() checked the rows are dense");
                s.modules.launch(&add, raw, s.multiprocessors)
            }
            _ => s.modules.launch(kernel, raw, s.multiprocessors),
        }
    }

    fn lend_gemm_workspace(&self, stream: &Stream, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let s = self.state()?;
        cuda_stream(stream, self.id_())?;
        s.blas
            .lend_workspace(stream.handle(), ptr as sys::CUdeviceptr, bytes)
    }
}

impl HostMemory for CudaBackend {
    fn host_alloc(&self, bytes: usize, mapped: bool) -> Result<HostPtr> {
        self.state()?;
        let mut flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        if mapped {
            flags |= sys::CU_MEMHOSTALLOC_DEVICEMAP;
        }
        // SAFETY: a plain allocation; the caller owns the memory.
        unsafe { result::malloc_host(bytes.max(1), flags) }
            .map(|p| p as HostPtr)
            .map_err(|e| Error::driver("cuMemHostAlloc", e))
    }

    fn host_free(&self, ptr: HostPtr) -> Result<()> {
        self.state()?;
        // SAFETY: the caller passes memory from `host_alloc`, once.
        unsafe { result::free_host(ptr as *mut std::ffi::c_void) }
            .map_err(|e| Error::driver("cuMemFreeHost", e))
    }

    fn host_device_ptr(&self, ptr: HostPtr) -> Result<DevicePtr> {
        self.state()?;
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer; fails cleanly for memory that is not mapped.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, ptr as *mut std::ffi::c_void, 0) }
            .result()
            .map_err(|e| Error::driver("cuMemHostGetDevicePointer", e))?;
        Ok(d)
    }
}

impl ManagedMemory for CudaBackend {
    // ANCHOR: managed_alloc
    fn managed_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.state()?;
        // Oversubscribed managed memory makes the driver evict and fault pages back
        // for as long as the work runs, which can stall the GPU for minutes: refuse.
        let info = self.mem_info()?;
        if bytes as u64 > info.free {
            return Err(Error::OutOfMemory {
                device: self.id_(),
                requested: bytes as u64,
                free: info.free,
                total: info.total,
                report: None,
            });
        }
        // SAFETY: a plain allocation; the caller owns the pointer.
        unsafe {
            result::malloc_managed(bytes.max(1), sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
        }
        .map_err(|e| Error::driver("cuMemAllocManaged", e))
    }

    // ANCHOR_END: managed_alloc

    fn managed_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        to: MemLocation,
        stream: &Stream,
    ) -> Result<()> {
        self.state()?;
        let raw = cuda_stream(stream, self.id_())?.raw();
        // SAFETY: the caller passes a range of managed memory.
        unsafe { result::mem_prefetch_async(ptr, bytes, self.location(to), raw) }
            .map_err(|e| Error::driver("cuMemPrefetchAsync", e))
    }

    fn managed_advise(&self, ptr: DevicePtr, bytes: usize, advice: ManagedAdvice) -> Result<()> {
        self.state()?;
        let (advice, location) = match advice {
            ManagedAdvice::ReadMostly => (
                sys::CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY,
                self.location(MemLocation::Device),
            ),
            ManagedAdvice::PreferredLocation(to) => (
                sys::CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                self.location(to),
            ),
        };
        // SAFETY: the caller passes a range of managed memory.
        unsafe { result::mem_advise(ptr, bytes, advice, location) }
            .map_err(|e| Error::driver("cuMemAdvise", e))
    }
}

impl CudaBackend {
    fn location(&self, to: MemLocation) -> sys::CUmemLocation {
        match to {
            MemLocation::Device => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal as i32,
            },
            MemLocation::Host => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
        }
    }
}
