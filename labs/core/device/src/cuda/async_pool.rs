//! The GPU's stream-ordered pools, through the driver's `cuMemPool*` calls: what the
//! allocator's `backend:cudaMallocAsync` allocates from, reads its statistics from and
//! trims. A pool's handle travels as the address of the driver's `CUmemoryPool`.

use cudarc::driver::sys;

use super::stream::cuda_stream;
use super::CudaBackend;
use crate::backend::{AsyncPool, AsyncPools, DevicePtr, PoolAttribute, Stream};
use crate::error::{Error, Result};

fn raw(pool: AsyncPool) -> sys::CUmemoryPool {
    pool.0 as usize as sys::CUmemoryPool
}

fn attribute_of(attribute: PoolAttribute) -> sys::CUmemPool_attribute {
    use sys::CUmemPool_attribute as A;
    match attribute {
        PoolAttribute::ReleaseThreshold => A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        PoolAttribute::ReservedCurrent => A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        PoolAttribute::ReservedHigh => A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        PoolAttribute::UsedCurrent => A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        PoolAttribute::UsedHigh => A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
    }
}

impl AsyncPools for CudaBackend {
    fn pool_default(&self) -> Result<AsyncPool> {
        let s = self.state()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer; the device is the context's.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, s.ctx.cu_device()) }
            .result()
            .map_err(|e| Error::driver("cuDeviceGetDefaultMemPool", e))?;
        Ok(AsyncPool(pool as usize as u64))
    }

    fn pool_create(&self) -> Result<AsyncPool> {
        self.state()?;
        // SAFETY: a plain C struct for which all-zero is a valid value (no handle types,
        // no security attributes, no maximum size).
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = self.ordinal as i32;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and property struct, both live through the call.
        unsafe { sys::cuMemPoolCreate(&mut pool, &props) }
            .result()
            .map_err(|e| Error::driver("cuMemPoolCreate", e))?;
        Ok(AsyncPool(pool as usize as u64))
    }

    fn pool_destroy(&self, pool: AsyncPool) -> Result<()> {
        self.state()?;
        // SAFETY: `pool` came from `pool_create` and is destroyed once; the driver keeps
        // its memory until outstanding allocations are freed.
        unsafe { sys::cuMemPoolDestroy(raw(pool)) }
            .result()
            .map_err(|e| Error::driver("cuMemPoolDestroy", e))
    }

    fn pool_alloc_async(
        &self,
        pool: AsyncPool,
        bytes: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        self.state()?;
        let stream = cuda_stream(stream, self.id_())?.raw();
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the pool and the stream belong to this
        // device.
        let r = unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes.max(1), raw(pool), stream) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(self.oom_or("cuMemAllocFromPoolAsync", bytes, r));
        }
        Ok(ptr)
    }

    fn pool_attribute(&self, pool: AsyncPool, attribute: PoolAttribute) -> Result<u64> {
        self.state()?;
        let mut value: u64 = 0;
        // SAFETY: each of these attributes is a `cuuint64_t`, which `value` is.
        unsafe {
            sys::cuMemPoolGetAttribute(
                raw(pool),
                attribute_of(attribute),
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| Error::driver("cuMemPoolGetAttribute", e))?;
        Ok(value)
    }

    fn pool_set_attribute(
        &self,
        pool: AsyncPool,
        attribute: PoolAttribute,
        value: u64,
    ) -> Result<()> {
        self.state()?;
        let mut value = value;
        // SAFETY: each of these attributes is a `cuuint64_t`, which `value` is; the
        // driver refuses values it does not allow (a high-water mark other than 0).
        unsafe {
            sys::cuMemPoolSetAttribute(
                raw(pool),
                attribute_of(attribute),
                (&mut value as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| Error::driver("cuMemPoolSetAttribute", e))
    }

    fn pool_trim_to(&self, pool: AsyncPool, keep: u64) -> Result<()> {
        self.state()?;
        // SAFETY: trims a live pool of this device; memory in use stays.
        unsafe { sys::cuMemPoolTrimTo(raw(pool), keep as usize) }
            .result()
            .map_err(|e| Error::driver("cuMemPoolTrimTo", e))
    }
}
