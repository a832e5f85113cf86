//! The transport of simulated GPUs. A rank's collective reads its input back to the
//! host once the communication stream reaches it, hands it to an [`Exchange`] that
//! returns every rank's input once all have arrived, computes its own output there
//! (`reduce.rs`) and writes it to its device. Where the ranks meet is the exchange's
//! business: threads of one process, or one process per rank.
//!
//! Dry runs (`dry:N`) form groups too: their ranks meet and are checked, no data moves,
//! so a data-parallel step's memory is known without running it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::SimBackend;
use crate::backend::prelude::*;
use crate::backend::{CollectiveCall, DeviceId, Exchange, Stream, Transport, UniqueId};
use crate::error::{Error, Result};

/// One rank's side of the simulator's transport.
struct SimTransport {
    backend: Arc<SimBackend>,
    rank: usize,
    world: usize,
    exchange: Arc<dyn Exchange>,
    /// How many collectives this rank has called: every rank's n-th call meets the
    /// others' n-th.
    calls: AtomicU64,
}

impl Transport for SimTransport {
    // ANCHOR: sim_run
    fn run(&self, call: &CollectiveCall, stream: &Stream) -> Result<()> {
        let seq = self.calls.fetch_add(1, Ordering::Relaxed);
        if self.backend.is_dry() {
            // A dry run has no values: the ranks still meet, and still must agree.
            self.exchange
                .exchange(self.rank, seq, &call.signature(), Vec::new())?;
            return Ok(());
        }
        let backend = &self.backend;
        // The stream has been told to wait for the input's producer: reading it back
        // waits for that, as NCCL's kernel would start only then.
        let mut input = vec![0u8; call.input_bytes(self.world)];
        backend.copy_dtoh(&mut input, call.send, stream)?;
        let inputs = self
            .exchange
            .exchange(self.rank, seq, &call.signature(), input)?;
        let output = super::reduce::output_of(call, self.rank, &inputs)?;
        backend.copy_htod(call.recv, &output, stream)
    }
    // ANCHOR_END: sim_run
}

impl Drop for SimTransport {
    fn drop(&mut self) {
        self.exchange.leave(self.rank);
    }
}

impl SimBackend {
    /// The error of asking a simulated GPU for NCCL.
    fn no_nccl(&self, what: &str) -> Error {
        Error::InvalidArgument(format!(
            "{what}: NCCL runs on GPUs (cuda:N), not on {}; simulated GPUs meet in an \
             exchange",
            self.id
        ))
    }
}

impl Collectives for SimBackend {
    fn comm_unique_id(&self) -> Result<UniqueId> {
        Err(self.no_nccl("ncclGetUniqueId"))
    }

    fn comm_init_rank(
        &self,
        _rank: usize,
        _world_size: usize,
        _id: &UniqueId,
    ) -> Result<Box<dyn Transport>> {
        Err(self.no_nccl("ncclCommInitRank"))
    }

    fn comm_init_all(&self, _devices: &[DeviceId]) -> Result<Vec<Box<dyn Transport>>> {
        Err(self.no_nccl("ncclCommInitAll"))
    }

    fn comm_exchange(
        self: Arc<Self>,
        rank: usize,
        world_size: usize,
        exchange: Arc<dyn Exchange>,
    ) -> Result<Box<dyn Transport>> {
        if rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "{}: rank {rank} is not a rank of a group of {world_size}",
                self.id
            )));
        }
        Ok(Box::new(SimTransport {
            backend: self,
            rank,
            world: world_size,
            exchange,
            calls: AtomicU64::new(0),
        }))
    }
}
