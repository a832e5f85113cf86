//! The driver work a timed loop did: pinning or unpinning host memory, device memory
//! allocated, freed or mapped, device-wide synchronisations. A step time measures
//! copies and kernels only when all of it is zero during the timed steps; otherwise one
//! `cuMemHostAlloc` (tens of milliseconds for a 64 MiB batch, and it holds the driver
//! meanwhile) is spread over every step of the mean.

use std::collections::BTreeMap;

use labs_core::host::{HostAllocator, HostStats};
use labs_core::{Device, Error, Result};
use serde::Serialize;

/// The device allocator's counters of driver calls, under PyTorch's `memory_stats()`
/// names.
const DEVICE_KEYS: [&str; 3] = [
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
];

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DriverWork {
    /// `cuMemHostAlloc` calls of the loop's pinned pool: batches it could not serve
    /// from its cache.
    pub pinned_allocs: u64,
    /// `cuMemFreeHost` calls of the loop's pinned pool.
    pub pinned_frees: u64,
    /// The device allocator's `num_device_alloc` (`cuMemAlloc` or `cuMemCreate`).
    pub device_allocs: u64,
    /// The device allocator's `num_device_free` (`cuMemFree` or `cuMemRelease`).
    pub device_frees: u64,
    /// The device allocator's `num_sync_all_streams`.
    pub device_syncs: u64,
}

impl DriverWork {
    pub fn is_none(&self) -> bool {
        *self == DriverWork::default()
    }

    pub fn add(&mut self, other: DriverWork) {
        self.pinned_allocs += other.pinned_allocs;
        self.pinned_frees += other.pinned_frees;
        self.device_allocs += other.device_allocs;
        self.device_frees += other.device_frees;
        self.device_syncs += other.device_syncs;
    }
}

/// The counters at one moment; `DriverWork` is the difference of two.
pub struct Counters {
    pinned: HostStats,
    device: [u64; 3],
}

impl Counters {
    /// Reads the pool's and the device allocator's counters. The first call creates the
    /// device allocator if nothing has yet: make it before the timed steps.
    pub fn read(device: &Device, pool: &HostAllocator) -> Result<Counters> {
        let stats: BTreeMap<String, u64> = device.allocator()?.memory_stats();
        let mut counts = [0; 3];
        for (count, key) in counts.iter_mut().zip(DEVICE_KEYS) {
            // A renamed counter must fail loudly, not read as zero work.
            *count = *stats.get(key).ok_or_else(|| {
                Error::InvalidArgument(format!("memory_stats() has no {key} any more"))
            })?;
        }
        Ok(Counters {
            pinned: pool.stats(),
            device: counts,
        })
    }

    /// The work done between `self` and `later`.
    pub fn until(&self, later: &Counters) -> DriverWork {
        let [a, f, s] = later.device;
        let [a0, f0, s0] = self.device;
        DriverWork {
            pinned_allocs: later.pinned.host_alloc_calls - self.pinned.host_alloc_calls,
            pinned_frees: later.pinned.host_free_calls - self.pinned.host_free_calls,
            device_allocs: a - a0,
            device_frees: f - f0,
            device_syncs: s - s0,
        }
    }
}
