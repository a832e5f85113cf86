//! Host-to-device and device-to-host copy bandwidth from ordinary (pageable) host
//! memory. Pinned memory, which is faster, is the subject of chapter 8.

use std::time::{Duration, Instant};

use labs_core::format::{bytes, duration, gb_per_s};
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::{Device, Result};

pub struct Bandwidth {
    pub bytes: usize,
    pub htod: Duration,
    pub dtoh: Duration,
}

// ANCHOR: bandwidth
/// Median time to copy `size` bytes each way; checks that the bytes arrived intact.
pub fn measure(device: &Device, size: usize, samples: usize) -> Result<Bandwidth> {
    let backend = device.backend();
    let stream = device.default_stream()?;
    let buffer = device.raw_buffer(size)?;
    let host: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; size];
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..samples + 1 {
        let start = Instant::now();
        backend.copy_htod(buffer.ptr(), &host, &stream)?; // returns when the copy is done
        up.push(start.elapsed());
        let start = Instant::now();
        backend.copy_dtoh(&mut back, buffer.ptr(), &stream)?;
        down.push(start.elapsed());
    }
    // The first round pays for first-touch page faults on both sides: drop it.
    up.remove(0);
    down.remove(0);
    assert!(host == back, "the round trip corrupted data");
    Ok(Bandwidth {
        bytes: size,
        htod: median(&mut up),
        dtoh: median(&mut down),
    })
}
// ANCHOR_END: bandwidth

pub fn table(device: &Device, rows: &[Bandwidth]) -> Table {
    let mut t = Table::new(
        format!("Copies between pageable host memory and {device}"),
        &[
            "size",
            "host->device",
            "bandwidth",
            "device->host",
            "bandwidth",
        ],
    );
    for b in rows {
        t.row([
            bytes(b.bytes as u64),
            duration(b.htod),
            gb_per_s(b.bytes as u64, b.htod),
            duration(b.dtoh),
            gb_per_s(b.bytes as u64, b.dtoh),
        ]);
    }
    t
}
