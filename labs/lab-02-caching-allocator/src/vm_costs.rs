//! What each virtual-memory call of an expandable segment costs on the device: creating
//! physical memory, mapping it, granting the device access, unmapping it, releasing it,
//! and a device-wide synchronisation with nothing queued. Recycling a mapping costs an
//! unmap and a map when the physical memory is kept, and a release and a create more
//! when it is not: these figures say which part to avoid.

use std::time::Instant;

use anyhow::Result;
use labs_core::Device;

/// Median nanoseconds of each call, for mappings of `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct VmCosts {
    pub bytes: usize,
    pub create: f64,
    pub map: f64,
    pub access: f64,
    pub unmap: f64,
    pub release: f64,
    pub synchronize: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `rounds` create → map → unmap → release cycles of `bytes` (a multiple of the
/// page size) in one reserved range.
pub fn measure(device: &Device, bytes: usize, rounds: usize) -> Result<VmCosts> {
    let be = device.backend();
    let base = be.vm_reserve(bytes)?;
    let mut t: [Vec<f64>; 6] = Default::default();
    for _ in 0..rounds {
        let start = Instant::now();
        let memory = be.vm_create(bytes)?;
        let created = Instant::now();
        be.vm_map_memory(base, memory)?;
        let mapped = Instant::now();
        be.vm_set_access(base, bytes)?;
        let accessible = Instant::now();
        let memory = be.vm_unmap_memory(base, bytes)?;
        let unmapped = Instant::now();
        be.vm_free_memory(memory)?;
        let released = Instant::now();
        device.synchronize()?;
        let synced = Instant::now();
        for (i, (a, b)) in [
            (start, created),
            (created, mapped),
            (mapped, accessible),
            (accessible, unmapped),
            (unmapped, released),
            (released, synced),
        ]
        .into_iter()
        .enumerate()
        {
            t[i].push((b - a).as_nanos() as f64);
        }
    }
    be.vm_release(base, bytes)?;
    let [create, map, access, unmap, release, synchronize] = t.map(median);
    Ok(VmCosts {
        bytes,
        create,
        map,
        access,
        unmap,
        release,
        synchronize,
    })
}

/// Median nanoseconds of one `cuMemSetAccess` over `mappings` neighbouring mappings of
/// `pages_each` pages: does granting access cost per call, per mapping, or per byte?
pub fn access_over(
    device: &Device,
    mappings: usize,
    pages_each: usize,
    rounds: usize,
) -> Result<f64> {
    let be = device.backend();
    let each = pages_each * be.vm_granularity()?;
    let base = be.vm_reserve(mappings * each)?;
    let mut t = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        for i in 0..mappings {
            let memory = be.vm_create(each)?;
            be.vm_map_memory(base + (i * each) as u64, memory)?;
        }
        let start = Instant::now();
        be.vm_set_access(base, mappings * each)?;
        t.push(start.elapsed().as_nanos() as f64);
        for i in 0..mappings {
            be.vm_unmap(base + (i * each) as u64, each)?;
        }
    }
    be.vm_release(base, mappings * each)?;
    Ok(median(t))
}

/// Median nanoseconds of one `cuMemSetAccess` over one new mapping of `pages_each` pages,
/// made in a reservation of `reserve` bytes that already holds `live` mappings of that
/// size with access granted: does granting access cost more as a segment fills (the
/// allocator's replays pay about twice what [`access_over`] measures alone)?
pub fn access_among(
    device: &Device,
    live: usize,
    pages_each: usize,
    reserve: usize,
    rounds: usize,
) -> Result<f64> {
    let be = device.backend();
    let each = pages_each * be.vm_granularity()?;
    let reserve = reserve.max((live + 1) * each).div_ceil(each) * each;
    let base = be.vm_reserve(reserve)?;
    let mut mapped = Vec::with_capacity(live);
    let result = (|| -> Result<f64> {
        for i in 0..live {
            let at = base + (i * each) as u64;
            be.vm_map_memory(at, be.vm_create(each)?)?;
            mapped.push(at);
            be.vm_set_access(at, each)?;
        }
        let at = base + (live * each) as u64;
        let mut t = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            be.vm_map_memory(at, be.vm_create(each)?)?;
            let start = Instant::now();
            be.vm_set_access(at, each)?;
            t.push(start.elapsed().as_nanos() as f64);
            be.vm_unmap(at, each)?;
        }
        Ok(median(t))
    })();
    for at in mapped {
        be.vm_unmap(at, each)?;
    }
    be.vm_release(base, reserve)?;
    result
}
