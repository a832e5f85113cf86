//! The chapter's experiments, each printed as a table.

use anyhow::Result;
use labs_core::alloc::{replay, Allocator, Config};
use labs_core::format::bytes;
use labs_core::{DType, Device, Tensor};

use crate::bench::{cached_pair_ns, raw_pair_ns, SIZES};

pub fn run(device: &Device) -> Result<()> {
    println!("Chapter 2 experiments on {device}");
    println!("{}\n", labs_core::cli::allocator_line(device)?);
    cost(device)?;
    reuse(device)?;
    tutorial_004(device)?;
    what_empty_cache_returns(device)?;
    fragmentation()?;
    Ok(())
}

fn cost(device: &Device) -> Result<()> {
    println!("1. The cost of an alloc+free pair: the driver against the cache");
    println!(
        "{:<8} {:>14} {:>14} {:>9}",
        "size", "raw driver", "cached", "ratio"
    );
    for (size, label) in SIZES {
        let raw = raw_pair_ns(device, size)?;
        let cached = cached_pair_ns(device, size, 0)?;
        println!(
            "{label:<8} {raw:>11.0} ns {cached:>11.0} ns {:>8.1}x",
            raw / cached
        );
    }
    println!();
    Ok(())
}

fn reuse(device: &Device) -> Result<()> {
    println!("2. Reuse: allocate, drop, allocate the same size");
    let allocator = device.allocator()?;
    let before = allocator.stats().device_allocs;
    let first = Tensor::empty(&[1000, 1000], DType::F32, device)?;
    let first_ptr = first.ptr();
    let after_first = allocator.stats().device_allocs;
    drop(first);
    let second = Tensor::empty(&[1000, 1000], DType::F32, device)?;
    let after_second = allocator.stats().device_allocs;
    println!(
        "{:<10} {:>18} {:>24}",
        "tensor", "address", "new device allocations"
    );
    println!(
        "{:<10} {:>#18x} {:>24}",
        "first",
        first_ptr,
        after_first - before
    );
    println!(
        "{:<10} {:>#18x} {:>24}",
        "second",
        second.ptr(),
        after_second - after_first
    );
    println!(
        "same block: {}\n",
        if second.ptr() == first_ptr {
            "yes"
        } else {
            "no"
        }
    );
    Ok(())
}

// ANCHOR: tutorial_004
fn tutorial_004(device: &Device) -> Result<()> {
    println!("3. 100 tensors of 1000x1000 f32: kept alive vs dropped (empty_cache each time)");
    let allocator = device.allocator()?;
    let mut rows = Vec::new();
    for keep in [true, false] {
        allocator.empty_cache()?;
        allocator.reset_peak_stats();
        let base = allocator.stats().requested.current;
        let mut kept = Vec::new();
        for _ in 0..100 {
            let t = Tensor::empty(&[1000, 1000], DType::F32, device)?;
            if keep {
                kept.push(t);
            } else {
                drop(t);
                allocator.empty_cache()?;
            }
        }
        let s = allocator.stats();
        rows.push((
            keep,
            s.requested.peak - base,
            s.allocated.peak,
            s.reserved.peak,
        ));
        drop(kept);
        allocator.empty_cache()?;
    }
    println!(
        "{:<10} {:>16} {:>16} {:>16}",
        "tensors", "peak requested", "peak allocated", "peak reserved"
    );
    for (keep, requested, allocated, reserved) in rows {
        println!(
            "{:<10} {:>13.2} MB {:>16} {:>16}",
            if keep { "kept" } else { "dropped" },
            requested as f64 / 1e6,
            bytes(allocated),
            bytes(reserved)
        );
    }
    println!(
        "(the tutorial's 400.00 MB vs 3.81 MB: \
         100 x 4,000,000 B in MB against one tensor in MiB)\n"
    );
    Ok(())
}
// ANCHOR_END: tutorial_004

// ANCHOR: empty_cache
fn what_empty_cache_returns(device: &Device) -> Result<()> {
    println!("4. What empty_cache really returns");
    let allocator = Allocator::new(device.backend_arc(), Config::default())?;
    let stream = device.default_stream()?;
    let mut blocks = Vec::new();
    for i in 0..64u64 {
        blocks.push(allocator.malloc(((i % 8) + 1) as usize * (700 << 10), &stream)?);
    }
    let survivor = blocks.remove(17);
    for b in blocks {
        allocator.free(b)?;
    }
    let before = allocator.stats();
    let released = allocator.empty_cache()?;
    let after = allocator.stats();
    println!(
        "{:<34} {:>14}",
        "live (one block)",
        bytes(before.allocated.current)
    );
    println!(
        "{:<34} {:>14}",
        "reserved before empty_cache",
        bytes(before.reserved.current)
    );
    println!("{:<34} {:>14}", "returned by empty_cache", bytes(released));
    println!(
        "{:<34} {:>14}",
        "reserved after (segments in use)",
        bytes(after.reserved.current)
    );
    // PyTorch users read this table first: the free blocks of the survivor's segment
    // are its non-releasable rows.
    println!("\n{}", allocator.memory_summary());
    allocator.free(survivor)?;
    println!(
        "(only whole segments nothing uses go back: the live block keeps its segment, and \
         every free block in it, reserved)\n"
    );
    Ok(())
}
// ANCHOR_END: empty_cache

fn fragmentation() -> Result<()> {
    println!(
        "5. Fragmentation on real traces (peak reserved / peak requested, simulated 80 GiB GPU)"
    );
    let dir = labs_core::testing::data_dir().join("traces");
    let Ok(files) = crate::mappings::trace_files_in(&dir) else {
        println!("(no traces at {}; set LABS_DATA_DIR)\n", dir.display());
        return Ok(());
    };
    println!(
        "{:<28} {:>14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8}",
        "trace", "peak requested", "fixed", "allocs", "expand.", "maps", "unmaps", "syncs", "ns/op"
    );
    for path in files {
        let trace = replay::read_trace(&path)?;
        let fixed = labs_core::device::replay_on_sim(&trace, Config::default(), crate::TRACE_GPU)?;
        let expandable =
            labs_core::device::replay_on_sim(&trace, Config::labs(), crate::TRACE_GPU)?;
        println!(
            "{:<28} {:>14} {:>8.3} {:>8} {:>8.3} {:>8} {:>8} {:>6} {:>8.0}",
            trace.name,
            bytes(fixed.peak_requested),
            fixed.fragmentation(),
            fixed.device_allocs,
            expandable.fragmentation(),
            expandable.num_maps,
            expandable.num_unmaps,
            expandable.num_sync_all_streams,
            expandable.ns_per_op()
        );
    }
    println!(
        "(fixed: PyTorch's defaults, fixed segments, and their cuMemAlloc calls; expand.: \
         preset labs, expandable segments whose idle pages move, with its page maps, unmaps, \
         device-wide synchronisations and time per operation on the simulated GPU)"
    );
    println!();
    Ok(())
}
