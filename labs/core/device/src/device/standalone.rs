//! Simulated GPUs outside the registry, for trace replays: each replay gets a device
//! of its own, so that replays neither share memory nor see each other's statistics.

use std::sync::Arc;

use crate::alloc::replay::{replay, ReplayReport, Trace};
use crate::alloc::{Allocator, Config};
use crate::backend::{Backend, DeviceId};
use crate::error::Result;

/// A simulated GPU of `capacity` bytes, not registered as `sim:N`.
pub fn sim_backend(capacity: u64) -> Arc<dyn Backend> {
    Arc::new(crate::sim::SimBackend::new(DeviceId::Sim(0), capacity))
}

/// Replays `trace` with `conf` on a fresh simulated GPU of `capacity` bytes.
pub fn replay_on_sim(trace: &Trace, conf: Config, capacity: u64) -> Result<ReplayReport> {
    let allocator = Allocator::new(sim_backend(capacity), conf)?;
    replay(trace, &allocator)
}
