//! The labs' devices, on the allocator (`labs-alloc`) and below everything that computes:
//!
//! - `backend`: the whole contract every device fulfils, as small traits (the memory half
//!   from `labs-alloc`, plus copies, kernels, host memory, managed memory, peer access);
//! - `kernels`: the op layer, each op declared once with its CUDA source and CPU twin,
//!   and the matrix product (cuBLAS on the GPU, a CPU GEMM crate on the simulator);
//! - `cuda` (the real GPU) and `sim` (a simulated GPU in host memory) implement the
//!   contract;
//! - `device`: the registry that opens devices and owns one allocator each, counts
//!   them, keeps each thread's current device, and copies between two devices (peer
//!   copies, or staged through pinned host memory).

pub mod backend;
#[cfg(not(target_arch = "wasm32"))]
pub mod cuda;
#[cfg(target_arch = "wasm32")]
#[path = "cuda_absent.rs"]
pub mod cuda;
pub mod device;
pub mod kernels;
pub mod sim;
pub mod testing;

// The lower crates' modules under the paths this crate's files name them by.
use labs_alloc::alloc;
use labs_base::{clock, device_id, dtype, error, format, threads};

pub use device::{select_device, Device, DeviceId, Event, Selection, Stream};
