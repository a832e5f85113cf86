//! Host memory the GPU can reach quickly: page-locked ("pinned") buffers from a caching
//! host allocator, host tensors in them, and mapped host memory that kernels read
//! directly. Chapter 8 is about all three.

mod allocator;
mod tensor;

pub use allocator::{size_class, HostAllocator, HostStats, PinnedBuffer};
pub use tensor::{MappedBuffer, PinnedTensor};
