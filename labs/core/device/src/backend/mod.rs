//! The contract every backend fulfils, as small traits, one per kind of work: memory,
//! stream-ordered pools, virtual memory, streams and events, copies, kernels, graphs, host memory, managed
//! memory, peer access and collectives. The GPU (`cuda`), the simulated GPU (`sim`) and host memory (`cpu`)
//! implement it, so everything above it (allocator, device registry, tensors, labs) is
//! written once. This layer names devices and dtypes, nothing above it.

mod collectives;
mod copy;
mod graphs;
mod host_memory;
mod kernels;
mod managed;
mod peer;

pub use collectives::{
    CollectiveCall, CollectiveKind, Collectives, Exchange, Inputs, ReduceOp, Transport, UniqueId,
    UNIQUE_ID_BYTES,
};
pub use copy::Copies;
pub use graphs::{GraphExec, GraphExecImpl, Graphs};
pub use host_memory::HostMemory;
pub use kernels::{gemm_workspace_bytes, Kernels};
pub use managed::{ManagedAdvice, ManagedMemory, MemLocation};
pub use peer::PeerAccess;
// The memory half lives with the allocator (`labs-alloc`), which takes it alone.
pub use labs_alloc::backend::{
    check_size, AsyncPool, AsyncPools, DeviceProperties, Event, EventImpl, MemInfo, Memory,
    MemoryBackend, PhysicalMemory, PoolAttribute, Stream, StreamImpl, Streams, VirtualMemory,
};

pub use crate::device_id::{DeviceId, DevicePtr, HostPtr};
pub use crate::dtype::FillPattern;

/// Every trait of the contract, for `use labs_core::backend::prelude::*`: calling a
/// method of one of them on a `dyn Backend` needs that trait in scope.
pub mod prelude {
    pub use super::{
        AsyncPools, Backend, Collectives, Copies, Graphs, HostMemory, Kernels, ManagedMemory,
        Memory, MemoryBackend, PeerAccess, Streams, VirtualMemory,
    };
}

use crate::error::Result;

// ANCHOR: backend_trait
/// A whole device: all of the contract, and what the device says about itself.
pub trait Backend:
    MemoryBackend + Copies + Kernels + Graphs + HostMemory + ManagedMemory + PeerAccess + Collectives
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
