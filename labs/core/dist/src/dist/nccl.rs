//! Groups of GPUs: NCCL communicators, made by each GPU's backend, one per rank. NCCL
//! trusts its callers: ranks that disagree about a collective hang or corrupt memory
//! there, so the checks this module can make (sizes against this rank's tensors) happen
//! in [`Communicator`] before the call.

use super::communicator::Communicator;
use crate::device::{Device, DeviceId, UniqueId};
use crate::error::{Error, Result};

/// Rank `rank` of `world_size` on GPU `device`, joining the NCCL communicator `id`
/// (made by rank 0 with `ncclGetUniqueId` and sent to the others by the rendezvous).
pub(crate) fn nccl_rank(
    device: &Device,
    rank: usize,
    world_size: usize,
    id: &UniqueId,
) -> Result<Communicator> {
    check_cuda(device)?;
    let transport = device.comm_init_rank(rank, world_size, id)?;
    Communicator::new(rank, world_size, device.clone(), transport)
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
    if devices.is_empty() {
        return Err(Error::InvalidArgument(
            "nccl_group: a group needs at least one device".into(),
        ));
    }
    let transports = Device::comm_init_all(devices)?;
    let world = devices.len();
    transports
        .into_iter()
        .zip(devices)
        .enumerate()
        .map(|(rank, (transport, d))| Communicator::new(rank, world, d.clone(), transport))
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
