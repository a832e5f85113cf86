//! A device's side of a group: the communicators its backend makes (NCCL on GPUs, an
//! exchange on simulated GPUs), so that the layers above form groups without naming a
//! backend.

use std::sync::Arc;

use super::Device;
use crate::backend::{Exchange, Transport, UniqueId};
use crate::error::{Error, Result};

impl Device {
    /// A fresh unique id for a new communicator of devices of this kind
    /// (`ncclGetUniqueId` on GPUs; simulated GPUs have none and refuse).
    pub fn comm_unique_id(&self) -> Result<UniqueId> {
        self.backend().comm_unique_id()
    }

    /// This device as rank `rank` of `world_size` in the communicator `id` made by
    /// [`Device::comm_unique_id`] (`ncclCommInitRank`): GPUs only. Blocks until every
    /// rank has joined.
    pub fn comm_init_rank(
        &self,
        rank: usize,
        world_size: usize,
        id: &UniqueId,
    ) -> Result<Box<dyn Transport>> {
        self.backend().comm_init_rank(rank, world_size, id)
    }

    /// One communicator per device of `devices` (of one kind, this process's), rank
    /// `i` on `devices[i]`, made at once (`ncclCommInitAll`): GPUs only.
    pub fn comm_init_all(devices: &[Device]) -> Result<Vec<Box<dyn Transport>>> {
        let first = devices.first().ok_or_else(|| {
            Error::InvalidArgument("a communicator needs at least one device".into())
        })?;
        let ids: Vec<_> = devices.iter().map(Device::id).collect();
        first.backend().comm_init_all(&ids)
    }

    /// This device as rank `rank` of `world_size`, meeting the other ranks in
    /// `exchange`: simulated GPUs and dry runs (whose ranks meet, and are checked, but
    /// move no data). Dropping the transport leaves the exchange.
    pub fn comm_exchange(
        &self,
        rank: usize,
        world_size: usize,
        exchange: Arc<dyn Exchange>,
    ) -> Result<Box<dyn Transport>> {
        self.backend_arc().comm_exchange(rank, world_size, exchange)
    }
}
