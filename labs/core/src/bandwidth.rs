//! Copy bandwidth between host and device memory, from pageable and from pinned host
//! memory, by size: the copy engines reading memory that cannot move, against the
//! driver staging memory that can through a pinned buffer of its own. Chapter 8's
//! `lab-08 bench` and chapter 11's `lab-11 bandwidth` both measure it.

use std::time::{Duration, Instant};

use labs_base::error::{Error, Result};
use labs_base::format::bytes;
use labs_device::device::Device;
use labs_tensor::host::HostAllocator;
use serde::Serialize;

use crate::table::Table;
use crate::timing::median;

/// Bytes per second, in GB/s, of `bytes` moved in `d`.
pub fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-12) / 1e9
}

/// The sizes measured, each at most the largest asked for.
pub const SIZES: [usize; 6] = [64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30];

/// The largest size measured by default: 1 GiB on a GPU; 64 MiB on the simulated GPU,
/// whose copies are host `memcpy` calls and show nothing more at larger sizes; 1 MiB
/// with `--quick`.
pub fn default_max(device: &Device, quick: bool) -> usize {
    match (quick, device.is_cuda()) {
        (true, _) => 1 << 20,
        (false, true) => 1 << 30,
        (false, false) => 64 << 20,
    }
}

/// The sizes of [`SIZES`] up to `max`; empty when `max` is below the smallest.
pub fn sizes_up_to(max: usize) -> Vec<usize> {
    SIZES.into_iter().filter(|&s| s <= max).collect()
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Bandwidth {
    pub bytes: usize,
    pub pageable_htod_gbps: f64,
    pub pinned_htod_gbps: f64,
    pub pageable_dtoh_gbps: f64,
    pub pinned_dtoh_gbps: f64,
}

fn samples_for(size: usize) -> usize {
    match size {
        s if s <= 1 << 20 => 20,
        s if s <= 64 << 20 => 10,
        _ => 5,
    }
}

/// The byte at `i` of the data copied back and forth.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Pageable memory of `size` bytes holding [`pattern`], or an error (never an abort)
/// when the host cannot give it.
fn pageable(size: usize) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(size).map_err(|_| {
        Error::InvalidArgument(format!(
            "cannot allocate {} of pageable host memory",
            bytes(size as u64)
        ))
    })?;
    v.extend((0..size).map(pattern));
    Ok(v)
}

// ANCHOR: bandwidth
/// Each size copied both ways from pageable and from pinned memory, median of several
/// rounds after an untimed one (which pays for first-touch page faults). Pageable
/// copies are timed with the host clock, since the host does part of the work (the
/// staging) and the call returns when the copy is done; pinned copies with events, the
/// device's own view of the transfer.
pub fn measure(device: &Device, sizes: &[usize]) -> Result<Vec<Bandwidth>> {
    let max = sizes.iter().copied().max().unwrap_or(0);
    let free = device.mem_info()?.free;
    if max as u64 > free {
        return Err(Error::InvalidArgument(format!(
            "the largest copy, {}, does not fit the {} free on {device}",
            bytes(max as u64),
            bytes(free)
        )));
    }
    let backend = device.backend();
    let stream = device.new_stream()?;
    let buffer = device.raw_buffer(max)?;
    let mut pageable = pageable(max)?;
    let mut pinned = HostAllocator::get(device).allocate(max)?;
    pinned.as_mut_slice().copy_from_slice(&pageable);
    let (begin, end) = (device.new_event()?, device.new_event()?);
    let event_time = || -> Result<Duration> {
        end.synchronize()?;
        Ok(Duration::from_secs_f64(
            begin.elapsed_ms(&end)? as f64 / 1e3,
        ))
    };
    let mut rows = Vec::new();
    for &size in sizes {
        let mut times: [Vec<Duration>; 4] = Default::default();
        for round in 0..=samples_for(size) {
            let t = Instant::now();
            backend.copy_htod(buffer.ptr(), &pageable[..size], &stream)?;
            let up = t.elapsed();
            let t = Instant::now();
            backend.copy_dtoh(&mut pageable[..size], buffer.ptr(), &stream)?;
            let down = t.elapsed();

            stream.record(&begin)?;
            pinned.copy_to_device_async(buffer.ptr(), size, &stream)?;
            stream.record(&end)?;
            let pinned_up = event_time()?;
            stream.record(&begin)?;
            pinned.copy_from_device_async(buffer.ptr(), size, &stream)?;
            stream.record(&end)?;
            let pinned_down = event_time()?;
            if round > 0 {
                for (v, d) in times.iter_mut().zip([up, pinned_up, down, pinned_down]) {
                    v.push(d);
                }
            }
        }
        let [a, b, c, d] = &mut times;
        rows.push(Bandwidth {
            bytes: size,
            pageable_htod_gbps: gbps(size, median(a)),
            pinned_htod_gbps: gbps(size, median(b)),
            pageable_dtoh_gbps: gbps(size, median(c)),
            pinned_dtoh_gbps: gbps(size, median(d)),
        });
    }
    // Every byte went to the device and back, both ways: it must be what it was.
    let intact = |data: &[u8]| data.iter().enumerate().all(|(i, &b)| b == pattern(i));
    if !(intact(&pageable) && intact(pinned.as_slice())) {
        return Err(Error::InvalidArgument(format!(
            "copies between host memory and {device} corrupted the data"
        )));
    }
    Ok(rows)
}
// ANCHOR_END: bandwidth

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

/// The line under the table: the largest size's figures, whatever the sizes were.
pub fn largest_line(rows: &[Bandwidth]) -> Option<String> {
    let r = rows.iter().max_by_key(|r| r.bytes)?;
    Some(format!(
        "At the largest size, {}: pinned {:.1} GB/s up and {:.1} GB/s down, pageable {:.1} GB/s up \
         and {:.1} GB/s down",
        bytes(r.bytes as u64),
        r.pinned_htod_gbps,
        r.pinned_dtoh_gbps,
        r.pageable_htod_gbps,
        r.pageable_dtoh_gbps
    ))
}
