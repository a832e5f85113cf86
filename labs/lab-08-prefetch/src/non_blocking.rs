//! What `to(device, non_blocking=True)` really does. From pinned memory the call
//! returns as soon as the copy is queued; from pageable memory the driver has to wait
//! for the stream and stage the bytes, so the call returns only when the copy is done.

use std::time::{Duration, Instant};

use labs_core::format::{bytes, duration};
use labs_core::table::Table;
use labs_core::timing::calibrate_spin;
use labs_core::{DType, Device, Result, Tensor};

pub struct NonBlocking {
    pub bytes: usize,
    pub busy: Duration,
    /// (call returned, copy done) after the kernel was queued, from each kind of memory.
    pub pinned: (Duration, Duration),
    pub pageable: (Duration, Duration),
}

// ANCHOR: non_blocking
/// Queues `busy` of kernel work on a stream, then a non-blocking copy of `size` bytes
/// behind it, and times when the call returns and when the copy is done.
pub fn measure(device: &Device, size: usize, busy: Duration) -> Result<NonBlocking> {
    let stream = device.new_stream()?;
    let x = Tensor::zeros(&[1 << 16], DType::F32, device)?;
    let iterations = calibrate_spin(&x, &stream, busy)?;
    let elems = size / 4;
    let host = Tensor::zeros(&[elems], DType::F32, &Device::cpu())?;
    let pinned = host.pin_memory(device)?;

    let time = |copy: &mut dyn FnMut() -> Result<Tensor>| -> Result<(Duration, Duration)> {
        stream.synchronize()?;
        x.spin_on(iterations, &stream)?;
        let t = Instant::now();
        let _on_device = copy()?;
        let returned = t.elapsed();
        stream.synchronize()?;
        Ok((returned, t.elapsed()))
    };
    let pinned_times = time(&mut || pinned.to_non_blocking(device, &stream))?;
    let pageable_times = time(&mut || host.to_non_blocking(device, &stream))?;
    // ANCHOR_END: non_blocking
    Ok(NonBlocking {
        bytes: size,
        busy,
        pinned: pinned_times,
        pageable: pageable_times,
    })
}

pub fn table(device: &Device, m: &NonBlocking) -> Table {
    let mut t = Table::new(
        format!(
            "to({device}, non_blocking=True) of {} queued behind {} of kernel work",
            bytes(m.bytes as u64),
            duration(m.busy)
        ),
        &["source", "call returned after", "copy done after"],
    );
    t.row(["pinned", &duration(m.pinned.0), &duration(m.pinned.1)]);
    t.row(["pageable", &duration(m.pageable.0), &duration(m.pageable.1)]);
    t
}
