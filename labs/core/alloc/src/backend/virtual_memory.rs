//! Virtual memory: address ranges reserved without memory behind them, and physical
//! memory mapped into them page by page. Expandable segments are built on it.

use crate::device_id::{DeviceId, DevicePtr};
use crate::error::Result;

/// Physical device memory not mapped anywhere (`CUmemGenericAllocationHandle`): made
/// by `vm_create`, placed by `vm_map_memory`, taken back by `vm_unmap_memory`, and
/// given back to the driver by `vm_free_memory`. Keeping one across an unmap and a
/// map somewhere else moves memory without creating or releasing any.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "physical memory is leaked unless it is mapped or freed"]
pub struct PhysicalMemory {
    handle: u64,
    bytes: usize,
}

impl PhysicalMemory {
    /// A backend's handle on `bytes` of physical memory; only the backend that made
    /// the handle reads it back.
    pub fn new(handle: u64, bytes: usize) -> Self {
        PhysicalMemory { handle, bytes }
    }

    /// The backend's handle for it.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

// ANCHOR: virtual_memory_trait
pub trait VirtualMemory {
    /// The page size of virtual memory mappings (`cuMemGetAllocationGranularity`).
    fn vm_granularity(&self) -> Result<usize>;
    /// Reserves a range of device addresses with no memory behind it
    /// (`cuMemAddressReserve`); `bytes` is a multiple of the granularity.
    fn vm_reserve(&self, bytes: usize) -> Result<DevicePtr>;
    /// Gives a reserved range back (`cuMemAddressFree`); none of it may be mapped.
    fn vm_release(&self, base: DevicePtr, bytes: usize) -> Result<()>;

    /// Creates physical memory (`cuMemCreate`); `bytes` is a multiple of the granularity.
    fn vm_create(&self, bytes: usize) -> Result<PhysicalMemory>;
    /// Maps physical memory at `ptr` inside a reserved, unmapped range (`cuMemMap`); on
    /// failure the memory is released. The device may touch it only after
    /// `vm_set_access`. The unit of `vm_unmap_memory` is the unit mapped here.
    fn vm_map_memory(&self, ptr: DevicePtr, memory: PhysicalMemory) -> Result<()>;
    /// Makes `ptr..ptr+bytes` readable and writable by the device (`cuMemSetAccess`),
    /// and by every peer granted access to its memory (one descriptor each, the
    /// device's own first). The range must be wholly mapped, and may span several
    /// mappings: one call for neighbouring mappings costs less than one call each.
    fn vm_set_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Whether `device` may read and write the mapped memory at `ptr`
    /// (`cuMemGetAccess`): this device once `vm_set_access` covered it, a peer once
    /// granted access (`PeerAccess::grant_peer_access`).
    fn vm_access(&self, ptr: DevicePtr, device: DeviceId) -> Result<bool>;
    /// Unmaps what one `vm_map_memory` mapped at `ptr` (`cuMemUnmap`) and hands its
    /// memory back, still allocated. The caller makes sure no queued work still uses
    /// the range.
    fn vm_unmap_memory(&self, ptr: DevicePtr, bytes: usize) -> Result<PhysicalMemory>;
    /// Releases physical memory that is mapped nowhere (`cuMemRelease`).
    fn vm_free_memory(&self, memory: PhysicalMemory) -> Result<()>;

    /// New memory mapped at `ptr..ptr+bytes`, ready for the device: `vm_create`, then
    /// `vm_map_memory`, then `vm_set_access`.
    fn vm_map(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let memory = self.vm_create(bytes)?;
        self.vm_map_memory(ptr, memory)?;
        if let Err(e) = self.vm_set_access(ptr, bytes) {
            let _ = self.vm_unmap(ptr, bytes);
            return Err(e);
        }
        Ok(())
    }
    /// Unmaps and releases: `vm_unmap_memory` then `vm_free_memory`.
    fn vm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let memory = self.vm_unmap_memory(ptr, bytes)?;
        self.vm_free_memory(memory)
    }
}
// ANCHOR_END: virtual_memory_trait
