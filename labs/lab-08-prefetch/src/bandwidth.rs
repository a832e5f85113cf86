//! Copy bandwidth between the host and the device, from pageable and from pinned
//! memory, at sizes from 64 KiB up: the first half of `bench`. Chapter 11's lab,
//! `lab-11 bandwidth`, measures the same by size and discusses it.

use std::time::{Duration, Instant};

use labs_core::format::bytes;
use labs_core::host::HostAllocator;
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::{Device, Result};
use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Bandwidth {
    pub bytes: usize,
    pub pageable_htod_gbps: f64,
    pub pageable_dtoh_gbps: f64,
    pub pinned_htod_gbps: f64,
    pub pinned_dtoh_gbps: f64,
}

pub fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-12) / 1e9
}

/// The sizes measured: 64 KiB to 1 GiB on a GPU, up to 64 MiB on the simulator, whose
/// copies are memcpy and gain nothing from larger sizes.
pub fn sizes(device: &Device, quick: bool) -> Vec<usize> {
    let max: usize = match (quick, device.is_cuda()) {
        (true, _) => 1 << 20,
        (false, true) => 1 << 30,
        (false, false) => 64 << 20,
    };
    [64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
        .into_iter()
        .filter(|&s| s <= max)
        .collect()
}

fn samples_for(size: usize) -> usize {
    match size {
        s if s <= 1 << 20 => 20,
        s if s <= 64 << 20 => 10,
        _ => 5,
    }
}

// ANCHOR: bandwidth_pinned
/// Pageable copies are timed with the host clock, since the host does part of the work
/// (staging); pinned copies with events, the device's own view of the transfer.
pub fn measure(device: &Device, sizes: &[usize]) -> Result<Vec<Bandwidth>> {
    let max = sizes.iter().copied().max().unwrap_or(0);
    let backend = device.backend();
    let stream = device.new_stream()?;
    let buffer = device.raw_buffer(max)?;
    let mut pageable: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    let mut pinned = HostAllocator::get(device).allocate(max)?;
    pinned.as_mut_slice().copy_from_slice(&pageable);
    let (begin, end) = (device.new_event()?, device.new_event()?);
    let mut rows = Vec::new();
    for &size in sizes {
        let n = samples_for(size);
        let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        // One untimed round first: it pays for first-touch page faults.
        for round in 0..=n {
            let t = Instant::now();
            backend.copy_htod(buffer.ptr(), &pageable[..size], &stream)?;
            let up = t.elapsed();
            let t = Instant::now();
            backend.copy_dtoh(&mut pageable[..size], buffer.ptr(), &stream)?;
            let down = t.elapsed();

            stream.record(&begin)?;
            pinned.copy_to_device_async(buffer.ptr(), size, &stream)?;
            stream.record(&end)?;
            end.synchronize()?;
            let pin_up = Duration::from_secs_f64(begin.elapsed_ms(&end)? as f64 / 1e3);
            stream.record(&begin)?;
            pinned.copy_from_device_async(buffer.ptr(), size, &stream)?;
            stream.record(&end)?;
            end.synchronize()?;
            let pin_down = Duration::from_secs_f64(begin.elapsed_ms(&end)? as f64 / 1e3);
            if round > 0 {
                for (v, d) in times.iter_mut().zip([up, down, pin_up, pin_down]) {
                    v.push(d);
                }
            }
        }
        let [a, b, c, d] = &mut times;
        rows.push(Bandwidth {
            bytes: size,
            pageable_htod_gbps: gbps(size, median(a)),
            pageable_dtoh_gbps: gbps(size, median(b)),
            pinned_htod_gbps: gbps(size, median(c)),
            pinned_dtoh_gbps: gbps(size, median(d)),
        });
    }
    assert!(
        pinned.as_slice()[..max.min(1 << 20)] == pageable[..max.min(1 << 20)],
        "round trips corrupted data"
    );
    Ok(rows)
}
// ANCHOR_END: bandwidth_pinned

pub fn table(device: &Device, rows: &[Bandwidth]) -> Table {
    let mut t = Table::new(
        format!("Copy bandwidth between host memory and {device} (GB/s, median)"),
        &[
            "size",
            "pageable h->d",
            "pinned h->d",
            "pageable d->h",
            "pinned d->h",
        ],
    );
    for r in rows {
        t.row([
            bytes(r.bytes as u64),
            format!("{:.1}", r.pageable_htod_gbps),
            format!("{:.1}", r.pinned_htod_gbps),
            format!("{:.1}", r.pageable_dtoh_gbps),
            format!("{:.1}", r.pinned_dtoh_gbps),
        ]);
    }
    t
}
