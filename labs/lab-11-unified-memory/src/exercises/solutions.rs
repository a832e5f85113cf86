//! Reference solutions to the exercises in `starter.rs`.

use std::time::Duration;

use labs_core::device_id::DevicePtr;
use labs_core::host::PinnedBuffer;
use labs_core::{Error, Result, Stream};

pub fn staged_copy(
    src: &[u8],
    dst: DevicePtr,
    staging: &mut PinnedBuffer,
    stream: &Stream,
) -> Result<()> {
    if staging.is_empty() && !src.is_empty() {
        return Err(Error::InvalidArgument(
            "a staged copy needs a staging buffer of at least one byte".into(),
        ));
    }
    let chunk = staging.len().max(1);
    for (i, part) in src.chunks(chunk).enumerate() {
        // The copy queued last reads `staging` when the stream reaches it, not when it
        // was queued: wait for it before writing the next chunk over it.
        stream.synchronize()?;
        staging.as_mut_slice()[..part.len()].copy_from_slice(part);
        staging.copy_to_device_async(dst + (i * chunk) as u64, part.len(), stream)?;
    }
    stream.synchronize()
}

pub fn copies_to_repay_pinning(
    bytes: usize,
    pin_cost: Duration,
    pageable_gbps: f64,
    pinned_gbps: f64,
) -> Option<u64> {
    let saved = bytes as f64 / (pageable_gbps * 1e9) - bytes as f64 / (pinned_gbps * 1e9);
    if saved <= 0.0 {
        return None;
    }
    Some((pin_cost.as_secs_f64() / saved).ceil() as u64)
}

pub fn mapped_is_faster(
    buffer_bytes: usize,
    bytes_read: usize,
    passes: u32,
    bus_gbps: f64,
    device_gbps: f64,
) -> bool {
    let reads = bytes_read as f64 * passes as f64;
    let mapped = reads / bus_gbps;
    let copied = buffer_bytes as f64 / bus_gbps + reads / device_gbps;
    mapped < copied
}
