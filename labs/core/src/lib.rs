//! The shared runtime of the labs: a device layer with a real GPU backend (`cuda`) and
//! a simulated one (`sim`), the kernels both run, a caching allocator that every
//! tensor's memory comes from, and tensors on top of them. Every chapter of the book
//! adds to it; `snapshot` holds the memory snapshots lab 3 reads (ours and PyTorch's).

pub mod alloc;
pub mod backend;
pub mod cli;
pub mod cuda;
pub mod device;
pub mod device_id;
pub mod dtype;
pub mod error;
pub mod format;
pub mod host;
pub mod kernels;
pub mod sim;
pub mod snapshot;
pub mod table;
pub mod tensor;
pub mod testing;
pub mod timing;

pub use device::{select_device, Device, DeviceId, Event, Selection, Stream};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
