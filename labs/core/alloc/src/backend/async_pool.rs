//! The driver's stream-ordered memory pools (`CUmemoryPool`): what `cuMemAllocAsync`
//! allocates from, and what the allocator's `backend:cudaMallocAsync` reads its
//! statistics from and trims.

use super::Stream;
use crate::device_id::DevicePtr;
use crate::error::Result;

/// A stream-ordered pool of one device: the driver's handle, read back only by the
/// backend that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncPool(pub u64);

// ANCHOR: pool_attribute
/// The attributes of a pool that the allocator reads or sets (`CUmemPool_attribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolAttribute {
    /// Bytes of reserved memory the pool keeps at a synchronisation point instead of
    /// giving them back to the driver (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; 0 unless
    /// set: a synchronisation gives back every unused byte).
    ReleaseThreshold,
    /// Bytes of physical memory the pool holds now (`..._RESERVED_MEM_CURRENT`).
    ReservedCurrent,
    /// The most it held since the last reset (`..._RESERVED_MEM_HIGH`); setting it to 0
    /// resets it to the current value.
    ReservedHigh,
    /// Bytes of the pool's memory allocated and not yet freed (`..._USED_MEM_CURRENT`).
    UsedCurrent,
    /// The most allocated at once since the last reset (`..._USED_MEM_HIGH`); setting
    /// it to 0 resets it to the current value.
    UsedHigh,
}
// ANCHOR_END: pool_attribute

// ANCHOR: async_pools_trait
pub trait AsyncPools {
    /// The device's default pool (`cuDeviceGetDefaultMemPool`), the one
    /// `Memory::raw_alloc_async` allocates from.
    fn pool_default(&self) -> Result<AsyncPool>;
    /// A new pool of device memory on this device (`cuMemPoolCreate`), with the
    /// driver's defaults (release threshold 0).
    fn pool_create(&self) -> Result<AsyncPool>;
    /// Destroys a pool made by `pool_create` (`cuMemPoolDestroy`). Its memory goes back
    /// to the driver once no allocation from it is outstanding.
    fn pool_destroy(&self, pool: AsyncPool) -> Result<()>;
    /// A stream-ordered allocation from `pool` (`cuMemAllocFromPoolAsync`), usable by
    /// work on `stream` after the call; freed by `Memory::raw_free_async`.
    fn pool_alloc_async(&self, pool: AsyncPool, bytes: usize, stream: &Stream)
        -> Result<DevicePtr>;
    /// An attribute's value (`cuMemPoolGetAttribute`).
    fn pool_attribute(&self, pool: AsyncPool, attribute: PoolAttribute) -> Result<u64>;
    /// Sets an attribute (`cuMemPoolSetAttribute`): the release threshold to any value,
    /// a high-water mark only to 0 (a reset); the current values are read-only.
    fn pool_set_attribute(
        &self,
        pool: AsyncPool,
        attribute: PoolAttribute,
        value: u64,
    ) -> Result<()>;
    /// Gives unused memory back to the driver until the pool holds at most `keep`
    /// bytes or nothing more can be released (`cuMemPoolTrimTo`): memory behind
    /// outstanding allocations, or freed by work not yet known to be done, stays.
    fn pool_trim_to(&self, pool: AsyncPool, keep: u64) -> Result<()>;
}
// ANCHOR_END: async_pools_trait
