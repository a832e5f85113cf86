//! Collectives: the part of the contract that moves data between the devices of a
//! group. A backend hands out one [`Transport`] per rank, which runs one checked call
//! (all-reduce, broadcast, all-gather, reduce-scatter) on a stream of its device: NCCL
//! on GPUs, where the ranks join a communicator named by a unique id; on simulated GPUs
//! an [`Exchange`], where the ranks meet on the host. Checking a call against the
//! rank's tensors, ordering it among streams and forming groups of ranks are done above
//! this layer (`dist`).

use std::fmt;
use std::sync::Arc;

use super::Stream;
use crate::device_id::{DeviceId, DevicePtr};
use crate::dtype::DType;
use crate::error::Result;

/// The bytes of an NCCL unique id (`ncclUniqueId`): rank 0 makes it, every rank needs
/// it to join the communicator.
pub const UNIQUE_ID_BYTES: usize = 128;

/// A communicator's unique id, as rank 0 sends it to the others.
pub type UniqueId = [u8; UNIQUE_ID_BYTES];

/// How a reduction combines the ranks' values (`torch.distributed.ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size (floating-point dtypes only).
    Avg,
    Product,
    Max,
    Min,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Product => "product",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        })
    }
}

/// Which collective, with its own arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveKind {
    AllReduce(ReduceOp),
    Broadcast { root: usize },
    AllGather,
    ReduceScatter(ReduceOp),
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveKind::AllReduce(op) => write!(f, "all_reduce({op})"),
            CollectiveKind::Broadcast { root } => write!(f, "broadcast(root={root})"),
            CollectiveKind::AllGather => write!(f, "all_gather"),
            CollectiveKind::ReduceScatter(op) => write!(f, "reduce_scatter({op})"),
        }
    }
}

/// One checked collective call of one rank: what a transport runs. `count` is what
/// NCCL calls it: the elements of `all_reduce` and `broadcast`, each rank's share of
/// `all_gather`'s output and of `reduce_scatter`'s input. The caller has checked that
/// `send` and `recv` hold that many elements of `dtype` on the rank's device.
#[derive(Debug, Clone, Copy)]
pub struct CollectiveCall {
    pub kind: CollectiveKind,
    pub dtype: DType,
    pub send: DevicePtr,
    pub recv: DevicePtr,
    pub count: usize,
}

impl CollectiveCall {
    /// What every rank must agree on: the collective, its count and its dtype.
    pub fn signature(&self) -> String {
        format!("{} of {} {} elements", self.kind, self.count, self.dtype)
    }

    /// Bytes of this rank's input.
    pub fn input_bytes(&self, world_size: usize) -> usize {
        let per_rank = self.count * self.dtype.size();
        match self.kind {
            CollectiveKind::ReduceScatter(_) => per_rank * world_size,
            _ => per_rank,
        }
    }
}

/// One rank's communicator on its device: moves the data of a collective.
pub trait Transport: Send + Sync {
    /// Enqueues `call` on `stream` (a stream of the rank's device), after its earlier
    /// work.
    fn run(&self, call: &CollectiveCall, stream: &Stream) -> Result<()>;
}

/// Every rank's input of one collective, in rank order.
pub type Inputs = Arc<Vec<Vec<u8>>>;

/// Where the ranks of a simulated group meet: threads of one process, or one process
/// per rank over the network. An exchange checks what NCCL trusts: ranks that disagree
/// about a collective, a rank that leaves and a rank that never comes are errors on
/// every other rank, never a hang.
pub trait Exchange: Send + Sync {
    /// Deposits this rank's `input` to collective number `seq`, described by
    /// `signature`; returns every rank's input once all have come, or why not.
    fn exchange(&self, rank: usize, seq: u64, signature: &str, input: Vec<u8>) -> Result<Inputs>;
    /// This rank is gone: the others stop waiting for it.
    fn leave(&self, rank: usize);
}

// ANCHOR: collectives_trait
/// How a device's ranks join a group. GPUs join an NCCL communicator (by a unique id,
/// or all of one process's at once); simulated GPUs meet in an [`Exchange`]. A backend
/// refuses the way that is not its own with an error naming the other.
pub trait Collectives {
    /// A fresh unique id for a new communicator (`ncclGetUniqueId`), made by rank 0.
    fn comm_unique_id(&self) -> Result<UniqueId>;

    /// This device's rank `rank` of `world_size` in the communicator `id`
    /// (`ncclCommInitRank`); blocks until every rank has joined.
    fn comm_init_rank(
        &self,
        rank: usize,
        world_size: usize,
        id: &UniqueId,
    ) -> Result<Box<dyn Transport>>;

    /// One communicator per device of `devices`, all of this process and of this
    /// backend's kind (this device among them), rank `i` on `devices[i]`
    /// (`ncclCommInitAll`).
    fn comm_init_all(&self, devices: &[DeviceId]) -> Result<Vec<Box<dyn Transport>>>;

    /// This device's rank `rank` of `world_size`, meeting the others in `exchange`;
    /// dropping the transport leaves the exchange.
    fn comm_exchange(
        self: Arc<Self>,
        rank: usize,
        world_size: usize,
        exchange: Arc<dyn Exchange>,
    ) -> Result<Box<dyn Transport>>;
}
// ANCHOR_END: collectives_trait
