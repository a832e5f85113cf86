//! Collectives across devices (NCCL on GPUs, an exchange between simulated GPUs), the
//! data-parallel wrappers that use them (DDP, ZeRO), and the rendezvous and launcher of
//! a job's processes.

pub mod dist;

// The lower crates' modules under the paths this crate's files name them by.
use labs_alloc::alloc;
use labs_base::{dtype, error, format, threads};
use labs_device::device;
use labs_nn::{nn, optim};
use labs_tensor::{autograd, tensor};
