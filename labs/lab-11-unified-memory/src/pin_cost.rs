//! What getting pinned host memory costs, by size: a fresh block from the driver
//! (`cuMemHostAlloc`) and its release (`cuMemFreeHost`), a block from the caching host
//! allocator, and ordinary pageable memory whose pages are touched, for comparison.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use labs_core::format::{bytes, duration};
use labs_core::host::HostAllocator;
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::Device;
use serde::Serialize;

use crate::as_ms;

/// The sizes measured, each at most the largest asked for.
pub const SIZES: [usize; 4] = [64 << 10, 1 << 20, 16 << 20, 256 << 20];

/// The largest size measured by default: 256 MiB (1 MiB with `--quick`).
pub fn default_max(quick: bool) -> usize {
    if quick {
        1 << 20
    } else {
        256 << 20
    }
}

/// The sizes of [`SIZES`] up to `max`; empty when `max` is below the smallest.
pub fn sizes_up_to(max: usize) -> Vec<usize> {
    SIZES.into_iter().filter(|&s| s <= max).collect()
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct PinCost {
    pub bytes: usize,
    /// How many times each figure was measured (the figures are medians).
    pub samples: usize,
    #[serde(rename = "host_alloc_ms", serialize_with = "as_ms")]
    pub host_alloc: Duration,
    #[serde(rename = "host_free_ms", serialize_with = "as_ms")]
    pub host_free: Duration,
    #[serde(rename = "cache_hit_ms", serialize_with = "as_ms")]
    pub cache_hit: Duration,
    #[serde(rename = "pageable_ms", serialize_with = "as_ms")]
    pub pageable: Duration,
}

fn samples_for(size: usize) -> usize {
    if size <= 16 << 20 {
        5
    } else {
        3
    }
}

// ANCHOR: pin_cost
/// Each way of getting `size` bytes of host memory, timed with the host clock (each is
/// host work: the driver locking pages, a lookup in a cache, page faults).
pub fn measure(device: &Device, size: usize) -> anyhow::Result<PinCost> {
    let backend = device.backend();
    let samples = samples_for(size);
    let (mut alloc, mut free, mut hit, mut pageable) = (vec![], vec![], vec![], vec![]);
    // A pool of its own, so that the first allocation is a miss whatever ran before.
    let pool = Arc::new(HostAllocator::new(device));
    drop(pool.allocate(size)?);
    for _ in 0..samples {
        // The driver: every page faulted in and locked, then unlocked and released.
        let t = Instant::now();
        let p = backend
            .host_alloc(size, false)
            .with_context(|| format!("pinning {} of host memory", bytes(size as u64)))?;
        alloc.push(t.elapsed());
        let t = Instant::now();
        backend.host_free(p)?;
        free.push(t.elapsed());

        // The caching host allocator: the block freed above, handed out again.
        let t = Instant::now();
        let block = pool.allocate(size)?;
        hit.push(t.elapsed());
        drop(block);

        // Pageable memory, its pages touched so that they exist.
        let t = Instant::now();
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(size).map_err(|_| {
            anyhow::anyhow!(
                "cannot allocate {} of pageable host memory",
                bytes(size as u64)
            )
        })?;
        v.resize(size, 1);
        pageable.push(t.elapsed());
        drop(v);
    }
    pool.empty_cache()?;
    Ok(PinCost {
        bytes: size,
        samples,
        host_alloc: median(&mut alloc),
        host_free: median(&mut free),
        cache_hit: median(&mut hit),
        pageable: median(&mut pageable),
    })
}
// ANCHOR_END: pin_cost

pub fn table(device: &Device, rows: &[PinCost]) -> Table {
    let mut t = Table::new(
        format!("Getting host memory for copies to {device} (median)"),
        &[
            "size",
            "cuMemHostAlloc",
            "cuMemFreeHost",
            "cache hit",
            "pageable (touched)",
        ],
    );
    for r in rows {
        t.row([
            bytes(r.bytes as u64),
            duration(r.host_alloc),
            duration(r.host_free),
            duration(r.cache_hit),
            duration(r.pageable),
        ]);
    }
    t
}

/// What the simulated GPU models of pinning.
pub const SIM: &str = "nothing is locked: \"cuMemHostAlloc\" allocates and touches every \
page, the part of pinning the simulator can reproduce, so it costs about what pageable \
memory does; a cache hit is the same code as on a GPU";
