//! The NCCL transport: each collective is one NCCL call on the chosen stream. NCCL
//! trusts its callers: ranks that disagree about a collective hang or corrupt memory
//! there, so the checks this module can make (sizes against this rank's tensors) happen
//! in [`Communicator`] before the call.

use super::communicator::{Call, Communicator, Kind, ReduceOp, Transport};
use crate::cuda::nccl::{NcclComm, RedOp, UNIQUE_ID_BYTES};
use crate::device::{Device, DeviceId, Stream};
use crate::error::{Error, Result};

pub(crate) struct NcclTransport {
    comm: NcclComm,
}

fn red_op(op: ReduceOp) -> RedOp {
    match op {
        ReduceOp::Sum => RedOp::Sum,
        ReduceOp::Avg => RedOp::Avg,
        ReduceOp::Product => RedOp::Product,
        ReduceOp::Max => RedOp::Max,
        ReduceOp::Min => RedOp::Min,
    }
}

impl Transport for NcclTransport {
    fn run(&self, call: &Call, stream: &Stream) -> Result<()> {
        let c = &self.comm;
        let (send, recv, n, dtype) = (call.send, call.recv, call.count, call.dtype);
        match call.kind {
            Kind::AllReduce(op) => c.all_reduce(send, recv, n, dtype, red_op(op), stream),
            Kind::Broadcast { root } => c.broadcast(send, recv, n, dtype, root, stream),
            Kind::AllGather => c.all_gather(send, recv, n, dtype, stream),
            Kind::ReduceScatter(op) => c.reduce_scatter(send, recv, n, dtype, red_op(op), stream),
        }
    }
}

/// Rank `rank` of `world_size` on GPU `device`, joining the NCCL communicator `id`
/// (made by rank 0 with `ncclGetUniqueId` and sent to the others by the rendezvous).
pub(crate) fn nccl_rank(
    device: &Device,
    rank: usize,
    world_size: usize,
    id: &[u8; UNIQUE_ID_BYTES],
) -> Result<Communicator> {
    check_cuda(device)?;
    let comm = NcclComm::init_rank(&device.default_stream()?, world_size, id, rank)?;
    Communicator::new(
        rank,
        world_size,
        device.clone(),
        Box::new(NcclTransport { comm }),
    )
}

/// A communicator per GPU of this process (`ncclCommInitAll`), rank `i` on
/// `devices[i]`: hand each to its own thread, which then issues that rank's calls.
pub fn nccl_group(devices: &[Device]) -> Result<Vec<Communicator>> {
    let mut ordinals = Vec::with_capacity(devices.len());
    for d in devices {
        check_cuda(d)?;
        let DeviceId::Cuda(o) = d.id() else {
            unreachable!()
        };
        if ordinals.contains(&o) {
            return Err(Error::InvalidArgument(format!(
                "nccl_group: {} is listed twice; NCCL needs one rank per GPU",
                d.id()
            )));
        }
        ordinals.push(o);
    }
    let first = devices.first().ok_or_else(|| {
        Error::InvalidArgument("nccl_group: a group needs at least one device".into())
    })?;
    let comms = NcclComm::init_all(&ordinals, &first.default_stream()?)?;
    let world = devices.len();
    comms
        .into_iter()
        .zip(devices)
        .enumerate()
        .map(|(rank, (comm, d))| {
            Communicator::new(rank, world, d.clone(), Box::new(NcclTransport { comm }))
        })
        .collect()
}

fn check_cuda(device: &Device) -> Result<()> {
    if device.is_cuda() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "NCCL runs on GPUs (cuda:N), not on {}; simulated GPUs use sim_group",
            device.id()
        )))
    }
}
