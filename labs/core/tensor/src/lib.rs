//! Tensors and the backward pass, on the devices of `labs-device`:
//!
//! - `tensor`: tensors over the allocator's memory, strided views, the graph their ops
//!   record for autograd, autocast;
//! - `host`: pinned host memory and host tensors;
//! - `autograd`: the backward pass over that graph, gradient and saved-tensor hooks,
//!   checkpointing and offloading.

pub mod autograd;
pub mod host;
pub mod tensor;
pub mod testing;

// The lower crates' modules under the paths this crate's files name them by.
use labs_alloc::alloc;
use labs_base::{dtype, error};
use labs_device::{device, kernels};

pub use tensor::{DType, Element, Tensor};
