//! Two independent kernels, and a copy beside a kernel: on one stream they take turns,
//! on two they overlap (on the simulator each stream is a thread, so they really do).

use std::time::{Duration, Instant};

use labs_core::format::duration;
use labs_core::host::HostAllocator;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

pub struct Overlap {
    pub kernel: Duration,
    pub one_stream: Duration,
    pub two_streams: Duration,
    pub copy_and_kernel_one_stream: Duration,
    pub copy_and_kernel_two_streams: Duration,
}

// ANCHOR: overlap
/// Times two kernels of about `target` each, both on one stream and one per stream.
pub fn measure(device: &Device, target: Duration) -> Result<Overlap> {
    let (a, b) = (device.new_stream()?, device.new_stream()?);
    let (x, iterations) = crate::busy_work(device, &a, target)?;
    let y = Tensor::zeros(&[crate::SMALL], DType::F32, device)?;
    device.synchronize()?;

    let run = |second: &labs_core::Stream| -> Result<Duration> {
        let t = Instant::now();
        x.spin_on(iterations, &a)?;
        y.spin_on(iterations, second)?;
        a.synchronize()?;
        second.synchronize()?;
        Ok(t.elapsed())
    };
    let one_stream = run(&a)?;
    let two_streams = run(&b)?;
    // ANCHOR_END: overlap

    // A pinned copy about as long as the kernel, beside it.
    let bytes = copy_size(device, target)?;
    let host = HostAllocator::get(device).allocate(bytes)?;
    let dst = device.raw_buffer(bytes)?;
    let with_copy = |copy_stream: &labs_core::Stream| -> Result<Duration> {
        let t = Instant::now();
        x.spin_on(iterations, &a)?;
        host.copy_to_device_async(dst.ptr(), bytes, copy_stream)?;
        a.synchronize()?;
        copy_stream.synchronize()?;
        Ok(t.elapsed())
    };
    let copy_one = with_copy(&a)?;
    let copy_two = with_copy(&b)?;
    let t = Instant::now();
    x.spin_on(iterations, &a)?;
    a.synchronize()?;
    Ok(Overlap {
        kernel: t.elapsed(),
        one_stream,
        two_streams,
        copy_and_kernel_one_stream: copy_one,
        copy_and_kernel_two_streams: copy_two,
    })
}

/// A copy size that takes about `target` from pinned memory.
fn copy_size(device: &Device, target: Duration) -> Result<usize> {
    let probe = 4 << 20;
    let stream = device.new_stream()?;
    let host = HostAllocator::get(device).allocate(probe)?;
    let dst = device.raw_buffer(probe)?;
    let t = Instant::now();
    for _ in 0..4 {
        host.copy_to_device_async(dst.ptr(), probe, &stream)?;
    }
    stream.synchronize()?;
    let per_byte = t.elapsed().as_secs_f64() / (4 * probe) as f64;
    let bytes = (target.as_secs_f64() / per_byte.max(1e-13)) as usize;
    Ok(bytes.clamp(1 << 20, 512 << 20))
}

pub fn table(device: &Device, m: &Overlap) -> Table {
    let mut t = Table::new(
        format!("Independent work on {device}: one stream or two (host clock, synchronized)"),
        &["work", "one stream", "two streams"],
    );
    t.row([
        "two kernels".to_string(),
        duration(m.one_stream),
        duration(m.two_streams),
    ]);
    t.row([
        "a kernel and a pinned copy".to_string(),
        duration(m.copy_and_kernel_one_stream),
        duration(m.copy_and_kernel_two_streams),
    ]);
    t.row([
        "(one kernel alone)".to_string(),
        duration(m.kernel),
        String::new(),
    ]);
    t
}
