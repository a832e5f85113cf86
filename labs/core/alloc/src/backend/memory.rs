//! Device memory straight from the driver, without a cache.

use super::Stream;
use crate::device_id::{DeviceId, DevicePtr};
use crate::error::{Error, Result};

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

// ANCHOR: memory_trait
pub trait Memory {
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
}
// ANCHOR_END: memory_trait

/// Rejects sizes no device could ever hold before they reach a driver.
pub fn check_size(device: DeviceId, bytes: usize, total: u64) -> Result<()> {
    if bytes as u64 > total {
        return Err(Error::OutOfMemory {
            device,
            requested: bytes as u64,
            free: 0,
            total,
            report: None,
        });
    }
    Ok(())
}
