//! `bench`: the cost of one alloc+free pair on each path, measured side by side.

use std::time::Instant;

use anyhow::Result;
use labs_core::alloc::{Allocator, Config};
use labs_core::Device;

pub const SIZES: [(usize, &str); 3] = [(512, "512 B"), (1 << 20, "1 MiB"), (20 << 20, "20 MiB")];

/// Median nanoseconds per call of `pair`, timed in batches of `batch` calls.
fn median_ns(batches: usize, batch: usize, mut pair: impl FnMut() -> Result<()>) -> Result<f64> {
    // Warm up for a while, not a number of calls: the first case measured otherwise
    // pays for cold caches and a CPU still raising its clock (it read 2x slower on the
    // GPU machine).
    let warm = Instant::now();
    while warm.elapsed().as_millis() < 50 {
        for _ in 0..batch.min(100) {
            pair()?;
        }
    }
    let mut samples = Vec::with_capacity(batches);
    for _ in 0..batches {
        let start = Instant::now();
        for _ in 0..batch {
            pair()?;
        }
        samples.push(start.elapsed().as_secs_f64() * 1e9 / batch as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Our cached pair; with `live` blocks of varying sizes allocated first.
pub fn cached_pair_ns(device: &Device, size: usize, live: usize) -> Result<f64> {
    let allocator = Allocator::new(device.backend_arc(), Config::default())?;
    let stream = device.default_stream()?;
    let mut x: u64 = 12345;
    let mut kept = Vec::with_capacity(live);
    for _ in 0..live {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Sizes from 512 B to 4 MiB, log-uniform, as in a model's activations.
        let size = 512u64 << ((x >> 40) % 14);
        kept.push(allocator.malloc(size as usize, &stream)?);
    }
    let handle = stream.handle();
    let ns = median_ns(101, 2000, || {
        let b = allocator.malloc_on(size as u64, handle)?;
        allocator.free(b)?;
        Ok(())
    })?;
    for b in kept {
        allocator.free(b)?;
    }
    Ok(ns)
}

pub fn raw_pair_ns(device: &Device, size: usize) -> Result<f64> {
    let backend = device.backend();
    let (batches, batch) = if device.is_cuda() {
        (21, 10)
    } else {
        (51, 200)
    };
    median_ns(batches, batch, || {
        let p = backend.raw_alloc(size)?;
        backend.raw_free(p)?;
        Ok(())
    })
}

pub fn async_pair_ns(device: &Device, size: usize) -> Result<f64> {
    let backend = device.backend();
    let stream = device.default_stream()?;
    let ns = median_ns(51, 200, || {
        let p = backend.raw_alloc_async(size, &stream)?;
        backend.raw_free_async(p, &stream)?;
        Ok(())
    })?;
    stream.synchronize()?;
    Ok(ns)
}

struct Row {
    size: usize,
    label: &'static str,
    alone: f64,
    busy: f64,
    raw: f64,
    pool: Option<f64>,
}

/// The least reservation [`crate::vm_costs::access_among`] maps in: the size of the
/// allocator's expandable segments.
const ACCESS_AMONG_VA: usize = labs_core::alloc::EXPANDABLE_VA as usize;

pub fn run(device: &Device, json: bool) -> Result<()> {
    let page = device.backend().vm_granularity()?;
    let rounds = if device.is_cuda() { 21 } else { 201 };
    // One page, one run of the allocator's mappings, and larger ranges: whether a call
    // costs per call or per byte decides how the allocator should group its mappings.
    let vm = [1, 8, 32, 128]
        .into_iter()
        .map(|pages| crate::vm_costs::measure(device, pages * page, rounds))
        .collect::<Result<Vec<_>>>()?;
    // One access call over 32 pages, made of mappings of 1, 8 and 32 pages.
    let access_32_pages: Vec<(usize, f64)> = [(32, 1), (4, 8), (1, 32)]
        .into_iter()
        .map(|(n, each)| Ok((n, crate::vm_costs::access_over(device, n, each, rounds)?)))
        .collect::<Result<_>>()?;
    // One access call for a new mapping of 8 pages (the allocator's longest run) in a
    // reservation at least as large as the allocator's segments, beside more and more
    // live mappings.
    let live_counts: &[usize] = if device.is_cuda() {
        &[0, 64, 512]
    } else {
        &[0, 4, 16]
    };
    let access_among: Vec<(usize, f64)> = (live_counts.iter())
        .map(|&live| {
            let ns = crate::vm_costs::access_among(device, live, 8, ACCESS_AMONG_VA, rounds)?;
            Ok((live, ns))
        })
        .collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for (size, label) in SIZES {
        let alone = cached_pair_ns(device, size, 0)?;
        let busy = cached_pair_ns(device, size, 1000)?;
        let raw = raw_pair_ns(device, size)?;
        let pool = if device.is_cuda() {
            Some(async_pair_ns(device, size)?)
        } else {
            None
        };
        rows.push(Row {
            size,
            label,
            alone,
            busy,
            raw,
            pool,
        });
    }
    if json {
        let per_size = |f: &dyn Fn(&Row) -> serde_json::Value| {
            serde_json::Value::Object(rows.iter().map(|r| (r.size.to_string(), f(r))).collect())
        };
        let object = serde_json::json!({
            "device": device.to_string(),
            "alloc_free_pair_ns": rows[0].alone,
            "cached_pair_ns": per_size(&|r| r.alone.into()),
            "cached_pair_1000_live_ns": per_size(&|r| r.busy.into()),
            "raw_driver_pair_ns": per_size(&|r| r.raw.into()),
            "alloc_async_pair_ns": per_size(&|r| r.pool.map_or(serde_json::Value::Null, Into::into)),
            "vm_call_ns": serde_json::Value::Object(vm.iter().map(|c| (c.bytes.to_string(), serde_json::json!({
                "create": c.create, "map": c.map, "access": c.access, "unmap": c.unmap, "release": c.release,
                "synchronize_idle": c.synchronize,
            }))).collect()),
            "access_32_pages_ns_by_mappings": serde_json::Value::Object(access_32_pages.iter()
                .map(|(n, ns)| (n.to_string(), (*ns).into())).collect()),
            "access_16_mib_ns_by_live_mappings": serde_json::Value::Object(access_among.iter()
                .map(|(n, ns)| (n.to_string(), (*ns).into())).collect()),
        });
        println!("{object}");
        return Ok(());
    }
    println!("alloc+free pair on {} (median, one thread)", device);
    println!(
        "{:<8} {:>14} {:>20} {:>16} {:>18}",
        "size", "ours, cached", "ours, 1,000 live", "raw driver", "cuMemAllocAsync"
    );
    for r in rows {
        let pool = r
            .pool
            .map_or("n/a (sim)".to_string(), |p| format!("{p:.0} ns"));
        println!(
            "{:<8} {:>11.0} ns {:>17.0} ns {:>13.0} ns {:>18}",
            r.label, r.alone, r.busy, r.raw, pool
        );
    }
    println!();
    println!("virtual-memory calls of an expandable segment on {device} (median)");
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>18}",
        "mapping", "create", "map", "access", "unmap", "release", "sync, idle GPU"
    );
    for c in &vm {
        println!(
            "{:<10} {:>9.0} ns {:>9.0} ns {:>9.0} ns {:>9.0} ns {:>9.0} ns {:>15.0} ns",
            labs_core::format::bytes(c.bytes as u64),
            c.create,
            c.map,
            c.access,
            c.unmap,
            c.release,
            c.synchronize
        );
    }
    println!();
    println!("one access call over 32 pages on {device}, by how many mappings they are (median)");
    for (n, ns) in &access_32_pages {
        println!("{n:>3} mapping(s) of {:>2} pages   {ns:>9.0} ns", 32 / n);
    }
    println!();
    println!(
        "one access call for a new 16 MiB mapping on {device}, by how many live mappings \
         share its reservation (median)"
    );
    for (n, ns) in &access_among {
        println!("{n:>4} live mappings   {ns:>9.0} ns");
    }
    Ok(())
}
