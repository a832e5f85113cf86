//! The shared runtime of the labs, one crate per layer, each importing only the crates
//! below it (Cargo keeps it so); this crate is the façade every lab imports, with every
//! module under one path (`labs_core::alloc`, `labs_core::tensor` …):
//!
//! - `labs-base`: `dtype`, `device_id`, `error`, `oom_report`, `format`, `input`,
//!   `threads`: element types, device names and addresses, the one error type and its
//!   out-of-memory report, text helpers, bounded file input;
//! - `labs-alloc`: `backend`'s memory half, the caching allocator `alloc` over it, and
//!   `snapshot`, the memory snapshots lab 3 reads (ours and PyTorch's), plain data;
//! - `labs-device`: the whole `backend` contract, the op layer `kernels`, the `cuda`
//!   and `sim` backends and the `device` registry;
//! - `labs-tensor`: `tensor`, `host` and `autograd`;
//! - `labs-nn`: `nn` and `optim`;
//! - `labs-dist`: `dist`, collectives, DDP, ZeRO, rendezvous and launch;
//! - here: `cli`, `table`, `timing`, `testing`, `bandwidth`, what the labs and their
//!   tests share;
//!   `plot` and `compare`, a snapshot's pictures (SVG) and two snapshots side by side,
//!   which the monitoring and training chapters both show.
//!
//! The training driver the labs share is the crate above this one, `labs-train`.

pub use labs_alloc::{alloc, snapshot};
pub use labs_base::{clock, device_id, dtype, error, format, input, oom_report, threads};
pub use labs_device::{backend, cuda, device, kernels, sim};
pub use labs_dist::dist;
pub use labs_nn::{nn, optim};
pub use labs_tensor::{autograd, host, tensor};

pub mod bandwidth;
pub mod cli;
pub mod compare;
pub mod plot;
pub mod table;
pub mod testing;
pub mod timing;

pub use device::{select_device, Device, DeviceId, Event, Selection, Stream};
pub use error::{Error, Result};
pub use tensor::{DType, Element, Tensor};
