//! The cost of asking the driver for memory directly (`cuMemAlloc` / `cuMemFree`),
//! by size. This is the price a caching allocator avoids paying on every tensor.

use std::time::{Duration, Instant};

use labs_core::format::{bytes, duration};
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::{Device, Result};

pub struct AllocCost {
    pub bytes: usize,
    pub alloc: Duration,
    pub free: Duration,
}

// ANCHOR: raw_alloc
/// Median time of `samples` raw allocations and frees of `size` bytes.
pub fn measure(device: &Device, size: usize, samples: usize) -> Result<AllocCost> {
    let mut allocs = Vec::with_capacity(samples);
    let mut frees = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let buffer = device.raw_buffer(size)?; // cuMemAlloc
        allocs.push(start.elapsed());
        let start = Instant::now();
        drop(buffer); // cuMemFree
        frees.push(start.elapsed());
    }
    Ok(AllocCost {
        bytes: size,
        alloc: median(&mut allocs),
        free: median(&mut frees),
    })
}
// ANCHOR_END: raw_alloc

/// The sizes the chapter reports, each within the device's free memory.
pub fn sizes(device: &Device) -> Result<Vec<usize>> {
    let free = device.mem_info()?.free as usize;
    Ok([512, 1 << 20, 20 << 20, 256 << 20, 1 << 30]
        .into_iter()
        .filter(|&s| s < free / 2)
        .collect())
}

pub fn table(device: &Device, costs: &[AllocCost]) -> Table {
    let mut t = Table::new(
        format!("Raw device allocation on {device} (median of repeated alloc/free)"),
        &["size", "alloc", "free", "alloc + free"],
    );
    for c in costs {
        t.row([
            bytes(c.bytes as u64),
            duration(c.alloc),
            duration(c.free),
            duration(c.alloc + c.free),
        ]);
    }
    t
}
