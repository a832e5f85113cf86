//! The memory half of the device contract: memory, stream-ordered pools, virtual memory,
//! streams and events.
//! It is all a caching allocator needs of a device, so the allocator is built, tested and
//! read without any kernel, copy or host memory. The full contract (`labs-device`'s
//! `backend`) extends it.

mod async_pool;
mod memory;
mod stream;
mod virtual_memory;

pub use async_pool::{AsyncPool, AsyncPools, PoolAttribute};
#[doc(hidden)]
pub use memory::check_size;
pub use memory::{DeviceProperties, MemInfo, Memory};
pub use stream::{Event, EventImpl, Stream, StreamImpl, Streams};
pub use virtual_memory::{PhysicalMemory, VirtualMemory};

pub use crate::device_id::{DeviceId, DevicePtr, HostPtr};
pub use crate::dtype::FillPattern;

use crate::error::Result;

// ANCHOR: memory_backend_trait
/// The memory half of the contract: what a caching allocator needs of a device, and
/// nothing of its kernels, copies or host memory, so that the allocator (`alloc/`) is
/// built, tested and read without the op layer.
pub trait MemoryBackend:
    Memory + AsyncPools + VirtualMemory + Streams + Send + Sync + 'static
{
    fn id(&self) -> DeviceId;
    /// Free and total memory, as `cudaMemGetInfo` reports them.
    fn mem_info(&self) -> Result<MemInfo>;
}
// ANCHOR_END: memory_backend_trait
