//! Collectives across devices, with PyTorch's `torch.distributed` names and semantics:
//! one [`Communicator`] per rank (one rank per device) running `all_reduce`,
//! `broadcast`, `all_gather` (PyTorch's `all_gather_into_tensor`), `reduce_scatter`
//! (`reduce_scatter_tensor`) and `barrier`.
//!
//! Two transports carry the data, behind the same API and the same results, each made
//! by the rank's device (the collectives of the device contract):
//!
//! - NCCL on GPUs ([`nccl_group`] for the GPUs of one process, [`init_process_group`]
//!   for one process per GPU, started by [`launch`]);
//! - on simulated GPUs, an exchange where the ranks' inputs meet on the host: ranks on
//!   threads meet in a shared state ([`sim_group`]), one process per rank over the
//!   rendezvous's connections, so the chapter's programs and tests run on any machine.
//!
//! Each collective is enqueued on the communicator's own stream, ordered after the work
//! already enqueued on the default stream by an event, as PyTorch's `ProcessGroupNCCL`
//! does; the [`Work`] it returns makes the default stream wait for it (`wait`), which is
//! what `async_op=False` does at once.
//!
//! On top of them, data-parallel training: [`DistributedDataParallel`] (gradients
//! averaged in buckets during backward), [`ZeroRedundancyOptimizer`] (ZeRO stage 1: the
//! optimizer state sharded across the ranks) and [`ShardedGradientOptimizer`] (ZeRO
//! stage 2: the gradients too).
//!
//! Every rank must call the same collectives in the same order, each rank from its own
//! thread or process: a collective returns only once its peers have joined it (on the
//! simulator, once the data has moved; with NCCL, once the kernel is enqueued, the
//! kernel itself waiting for the peers on the GPU).

mod bench;
mod buckets;
mod communicator;
mod ddp;
mod env;
mod grad_shard;
mod in_process;
mod launch;
mod nccl;
mod process_group;
mod rendezvous;
mod wire;
mod zero;
mod zero2;
mod zero3;

pub use bench::{bus_bandwidth_factor, time_collective, BenchOp, CollectiveTiming};
pub use buckets::{
    assign_buckets, BucketInput, DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES_CAP,
};
pub use communicator::{Communicator, ReduceOp, Work};
pub use ddp::{DdpEvent, DdpOptions, DistributedDataParallel, NoSync};
pub use env::{new_job_token, DistEnv, ENV_JOB_TOKEN, MAX_TOKEN_BYTES, MAX_WORLD_SIZE};
pub use in_process::{dry_lone_rank, sim_group, sim_group_with_timeout};
pub use launch::{
    free_loopback_port, launch, launch_nodes, launch_nodes_with, launch_with, launch_writing,
    Nodes, OutputLine, OutputStream, MAX_LOCAL_RANKS,
};
pub use nccl::nccl_group;
pub use process_group::{
    init_process_group, init_process_group_with, ProcessGroupOptions, ENV_DIST_TIMEOUT,
};
pub use rendezvous::{Rendezvous, DEFAULT_TIMEOUT, GREETING_TIMEOUT};
pub use wire::{MAX_GREETING_BYTES, MAX_MESSAGE_BYTES};
pub use zero::ZeroRedundancyOptimizer;
pub use zero2::ShardedGradientOptimizer;
pub use zero3::{FullyShardedDataParallel, ShardedParameters};

use crate::device::Device;
use crate::error::{Error, Result};

/// A communicator per device, on the transport their kind calls for: NCCL for GPUs,
/// the in-process exchange for simulated GPUs.
pub fn group(devices: &[Device]) -> Result<Vec<Communicator>> {
    match devices.first() {
        Some(d) if d.is_cuda() => nccl_group(devices),
        Some(_) => sim_group(devices),
        None => Err(Error::InvalidArgument(
            "a process group needs at least one device".into(),
        )),
    }
}
