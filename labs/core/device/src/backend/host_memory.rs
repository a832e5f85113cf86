//! Host memory the device can reach directly (chapters 6 and 8).

use crate::device_id::{DevicePtr, HostPtr};
use crate::error::Result;

pub trait HostMemory {
    /// Page-locked host memory (`cuMemHostAlloc`, portable to every context): the DMA
    /// engines read it directly, so copies from it can run asynchronously. `mapped` also
    /// maps it into the device's address space (`CU_MEMHOSTALLOC_DEVICEMAP`).
    fn host_alloc(&self, bytes: usize, mapped: bool) -> Result<HostPtr>;
    /// Releases memory from `host_alloc` (`cuMemFreeHost`); no queued copy may still use it.
    fn host_free(&self, ptr: HostPtr) -> Result<()>;
    /// The device address of mapped host memory (`cuMemHostGetDevicePointer`): kernels
    /// given it read and write host memory over the bus.
    fn host_device_ptr(&self, ptr: HostPtr) -> Result<DevicePtr>;
}
