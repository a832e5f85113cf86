//! Mapped (zero-copy) host memory against device memory: the same kernel reading its
//! input over the bus instead of from the GPU's own memory. Also managed memory, with
//! and without a prefetch before the kernel.

use std::time::Duration;

use labs_core::device::{FillPattern, MemLocation};
use labs_core::format::bytes;
use labs_core::host::MappedBuffer;
use labs_core::kernels::Kernel;
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::{DType, Device, Result, Stream, Tensor};

use crate::bandwidth::gbps;

pub struct KernelRead {
    pub bytes: usize,
    pub device_memory: Duration,
    pub mapped_host: Duration,
    pub managed_first_touch: Duration,
    pub managed_prefetched: Duration,
}

fn timed(device: &Device, stream: &Stream, kernel: &Kernel) -> Result<Duration> {
    let (a, b) = (device.new_event()?, device.new_event()?);
    stream.record(&a)?;
    device.backend().launch(kernel, stream)?;
    stream.record(&b)?;
    b.synchronize()?;
    Ok(Duration::from_secs_f64(a.elapsed_ms(&b)? as f64 / 1e3))
}

// ANCHOR: mapped_read
/// `out = 2 * x` over `size` bytes with `x` in device memory, in mapped host memory
/// and in managed memory (migrated on first touch, or prefetched).
pub fn measure(device: &Device, size: usize, samples: usize) -> Result<KernelRead> {
    let n = size / 4;
    let stream = device.new_stream()?;
    let out = Tensor::zeros(&[n], DType::F32, device)?;
    let x = Tensor::full(&[n], 1.0f32, device)?;
    let mapped = MappedBuffer::new(device, size)?;
    let scale = |x| Kernel::scale(x, 2.0, out.ptr(), n);
    device.synchronize()?;
    let mut on_device = Vec::new();
    let mut on_host = Vec::new();
    for _ in 0..samples {
        on_device.push(timed(device, &stream, &scale(x.ptr()))?);
        on_host.push(timed(device, &stream, &scale(mapped.device_ptr()))?);
    }

    // Managed memory, never more than is free (the backend refuses otherwise).
    let backend = device.backend();
    let managed = backend.managed_alloc(size)?;
    let result = (|| {
        backend.managed_prefetch(managed, size, MemLocation::Host, &stream)?;
        backend.fill(managed, FillPattern::U32(1.0f32.to_bits()), n, &stream)?;
        backend.managed_prefetch(managed, size, MemLocation::Host, &stream)?;
        let first_touch = timed(device, &stream, &scale(managed))?;
        backend.managed_prefetch(managed, size, MemLocation::Host, &stream)?;
        backend.managed_prefetch(managed, size, MemLocation::Device, &stream)?;
        let prefetched = timed(device, &stream, &scale(managed))?;
        Ok::<_, labs_core::Error>((first_touch, prefetched))
    })();
    stream.synchronize()?;
    backend.managed_free(managed)?;
    let (first_touch, prefetched) = result?;
    // ANCHOR_END: mapped_read
    Ok(KernelRead {
        bytes: size,
        device_memory: median(&mut on_device),
        mapped_host: median(&mut on_host),
        managed_first_touch: first_touch,
        managed_prefetched: prefetched,
    })
}

pub fn table(device: &Device, m: &KernelRead) -> Table {
    let mut t = Table::new(
        format!(
            "A kernel reading {} on {device}: where its input lives (read bandwidth, GB/s)",
            bytes(m.bytes as u64)
        ),
        &["input in", "kernel time", "GB/s"],
    );
    for (name, d) in [
        ("device memory", m.device_memory),
        ("mapped pinned host memory", m.mapped_host),
        ("managed, pages on the host", m.managed_first_touch),
        ("managed, prefetched to the device", m.managed_prefetched),
    ] {
        t.row([
            name.to_string(),
            labs_core::format::duration(d),
            format!("{:.1}", gbps(m.bytes, d)),
        ]);
    }
    t
}
