//! The GPU's collectives: each collective is one NCCL call on the chosen stream. NCCL
//! trusts its callers: ranks that disagree about a collective hang or corrupt memory
//! there, so the checks that can be made (sizes against the rank's tensors) happen
//! above, before the call.

use std::sync::Arc;

use super::nccl::{self, NcclComm};
use super::CudaBackend;
use crate::backend::prelude::*;
use crate::backend::{
    CollectiveCall, CollectiveKind, DeviceId, Exchange, ReduceOp, Stream, Transport, UniqueId,
};
use crate::error::{Error, Result};

/// One rank's NCCL communicator, as the contract's transport.
struct NcclTransport {
    comm: NcclComm,
    world_size: usize,
}

impl NcclTransport {
    /// The reduction NCCL is asked for. Over a group of one rank an average is the
    /// input itself, as a sum is, and NCCL is asked for the sum: its one-rank
    /// reduce-scatter with `ncclAvg` leaves the last elements of some lengths unwritten
    /// (measured on an H200 with PyTorch 2.11's NCCL: the last 12 of 49,984 `f32`, the
    /// length of a ZeRO-3 unit of GPT-2 at width 64, whose last parameters then kept
    /// stale values). `tests/one_rank.rs` of labs-dist checks every collective over
    /// one rank at such lengths.
    fn op(&self, op: ReduceOp) -> ReduceOp {
        if self.world_size == 1 && op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        }
    }
}

impl Transport for NcclTransport {
    fn run(&self, call: &CollectiveCall, stream: &Stream) -> Result<()> {
        let c = &self.comm;
        let (send, recv, n, dtype) = (call.send, call.recv, call.count, call.dtype);
        match call.kind {
            CollectiveKind::AllReduce(op) => {
                c.all_reduce(send, recv, n, dtype, self.op(op), stream)
            }
            CollectiveKind::Broadcast { root } => c.broadcast(send, recv, n, dtype, root, stream),
            CollectiveKind::AllGather => c.all_gather(send, recv, n, dtype, stream),
            CollectiveKind::ReduceScatter(op) => {
                c.reduce_scatter(send, recv, n, dtype, self.op(op), stream)
            }
        }
    }
}

impl Collectives for CudaBackend {
    fn comm_unique_id(&self) -> Result<UniqueId> {
        nccl::unique_id()
    }

    fn comm_init_rank(
        &self,
        rank: usize,
        world_size: usize,
        id: &UniqueId,
    ) -> Result<Box<dyn Transport>> {
        let comm = NcclComm::init_rank(&self.default_stream()?, world_size, id, rank)?;
        Ok(Box::new(NcclTransport { comm, world_size }))
    }

    fn comm_init_all(&self, devices: &[DeviceId]) -> Result<Vec<Box<dyn Transport>>> {
        let mut ordinals = Vec::with_capacity(devices.len());
        for d in devices {
            let DeviceId::Cuda(o) = *d else {
                return Err(Error::InvalidArgument(format!(
                    "ncclCommInitAll: {d} is not a GPU; NCCL runs on GPUs (cuda:N)"
                )));
            };
            ordinals.push(o);
        }
        let comms = NcclComm::init_all(&ordinals, &self.default_stream()?)?;
        let world_size = comms.len();
        Ok(comms
            .into_iter()
            .map(|comm| Box::new(NcclTransport { comm, world_size }) as Box<dyn Transport>)
            .collect())
    }

    fn comm_exchange(
        self: Arc<Self>,
        _rank: usize,
        _world_size: usize,
        _exchange: Arc<dyn Exchange>,
    ) -> Result<Box<dyn Transport>> {
        Err(Error::InvalidArgument(format!(
            "{}: GPUs meet through NCCL (a unique id, or all of a process's GPUs at \
             once); an exchange serves simulated GPUs",
            self.id_()
        )))
    }
}
