//! The contract every backend fulfils, as small traits, one per kind of work: memory,
//! virtual memory, streams and events, copies, kernels, host memory, managed memory,
//! peer access and collectives. The GPU (`cuda`), the simulated GPU (`sim`) and host memory (`cpu`)
//! implement it, so everything above it (allocator, device registry, tensors, labs) is
//! written once. This layer names devices and dtypes, nothing above it.

mod collectives;
mod copy;
mod host_memory;
mod kernels;
mod managed;
mod memory;
mod peer;
mod stream;
mod virtual_memory;

pub use collectives::{
    CollectiveCall, CollectiveKind, Collectives, Exchange, Inputs, ReduceOp, Transport, UniqueId,
    UNIQUE_ID_BYTES,
};
pub use copy::Copies;
pub use host_memory::HostMemory;
pub use kernels::{gemm_workspace_bytes, Kernels};
pub use managed::{ManagedAdvice, ManagedMemory, MemLocation};
pub(crate) use memory::check_size;
pub use memory::{DeviceProperties, MemInfo, Memory};
pub use peer::PeerAccess;
pub use stream::{Event, EventImpl, Stream, StreamImpl, Streams};
pub use virtual_memory::{PhysicalMemory, VirtualMemory};

pub use crate::device_id::{DeviceId, DevicePtr, HostPtr};
pub use crate::dtype::FillPattern;

/// Every trait of the contract, for `use labs_core::backend::prelude::*`: calling a
/// method of one of them on a `dyn Backend` needs that trait in scope.
pub mod prelude {
    pub use super::{
        Backend, Collectives, Copies, HostMemory, Kernels, ManagedMemory, Memory, MemoryBackend,
        PeerAccess, Streams, VirtualMemory,
    };
}

use crate::error::Result;

// ANCHOR: memory_backend_trait
/// The memory half of the contract: what a caching allocator needs of a device, and
/// nothing of its kernels, copies or host memory, so that the allocator (`alloc/`) is
/// built, tested and read without the op layer.
pub trait MemoryBackend: Memory + VirtualMemory + Streams + Send + Sync + 'static {
    fn id(&self) -> DeviceId;
    /// Free and total memory, as `cudaMemGetInfo` reports them.
    fn mem_info(&self) -> Result<MemInfo>;
}
// ANCHOR_END: memory_backend_trait

// ANCHOR: backend_trait
/// A whole device: all of the contract, and what the device says about itself.
pub trait Backend:
    MemoryBackend + Copies + Kernels + HostMemory + ManagedMemory + PeerAccess + Collectives
{
    /// Name, memory, multiprocessors, compute capability. On `cuda` this is the first
    /// call that initialises the context.
    fn properties(&self) -> Result<DeviceProperties>;
    /// Makes this device the calling thread's current one for driver calls
    /// (`cuCtxSetCurrent` on `cuda`, creating the context if need be); nothing elsewhere.
    fn make_current(&self) -> Result<()> {
        Ok(())
    }
}
// ANCHOR_END: backend_trait
