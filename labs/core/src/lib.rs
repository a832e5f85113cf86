//! The shared runtime of the labs, in layers that import only downwards
//! (`ci/check-layers.py` fails the build on a cycle):
//!
//! - `dtype`, `device_id`, `error`, `oom_report`, `format`, `input`: element types,
//!   device names and addresses, the one error type and its out-of-memory report, text
//!   helpers, and the opening of the files users give the readers (regular files only,
//!   within a size limit per kind);
//! - `backend`: the contract every device fulfils, as small traits; `cuda` (the real
//!   GPU) and `sim` (a simulated GPU in host memory) implement it;
//! - `kernels`: the op layer, each op declared once with its CUDA source and CPU twin,
//!   and the matrix product (cuBLAS on the GPU, a CPU GEMM crate on the simulator);
//! - `alloc`: the caching allocator, which sees only the contract; `snapshot`, the
//!   memory snapshots lab 3 reads (ours and PyTorch's), plain data;
//! - `device`: the registry that opens devices and owns one allocator each, counts
//!   them, keeps each thread's current device, and copies between two devices (peer
//!   copies, or staged through pinned host memory);
//! - `tensor` and `host`: tensors over the allocator's memory (and the graph their ops
//!   record for autograd), pinned host memory;
//! - `autograd`: the backward pass over that graph;
//! - `dist`: collectives across devices (NCCL on GPUs, an in-process exchange between
//!   simulated GPUs), the rendezvous of a job's processes and its launcher;
//! - `nn` and `optim`: modules with PyTorch's parameter names and layouts, safetensors
//!   state dicts, and optimizers (SGD, Adam, AdamW) with one fused kernel per step;
//! - `cli`, `table`, `timing`, `testing`: what the labs and their tests share; `plot`
//!   and `compare`, a snapshot's pictures (SVG) and two snapshots side by side, which
//!   the monitoring and training chapters both show.

pub mod alloc;
pub mod autograd;
pub mod backend;
pub mod cli;
pub mod compare;
pub mod cuda;
pub mod device;
pub mod device_id;
pub mod dist;
pub mod dtype;
pub mod error;
pub mod format;
pub mod host;
pub mod input;
pub mod kernels;
pub mod nn;
pub mod oom_report;
pub mod optim;
pub mod plot;
pub mod sim;
pub mod snapshot;
pub mod table;
pub mod tensor;
pub mod testing;
mod threads;
pub mod timing;

pub use device::{select_device, Device, DeviceId, Event, Selection, Stream};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
