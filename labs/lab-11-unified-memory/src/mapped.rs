//! Mapped (zero-copy) host memory against device memory: the same kernel reading its
//! input over the bus instead of from the GPU's own memory, and, for comparison, a copy
//! from pinned memory followed by the kernel, what a program does without mapping.

use std::time::Duration;

use labs_core::format::{bytes, duration};
use labs_core::host::{HostAllocator, MappedBuffer};
use labs_core::kernels::Kernel;
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::{DType, Device, Stream, Tensor};
use serde::Serialize;

use crate::{as_ms, gbps};

/// The input's size by default: 256 MiB on a GPU; 16 MiB on the simulated GPU, whose
/// kernels run on a host thread; 4 MiB with `--quick`.
pub fn default_size(device: &Device, quick: bool) -> usize {
    match (quick, device.is_cuda()) {
        (true, _) => 4 << 20,
        (false, true) => 256 << 20,
        (false, false) => 16 << 20,
    }
}

/// The device buffers the experiment allocates at the input's size: the input's copy
/// on the device and the kernel's output.
pub const DEVICE_BUFFERS: usize = 2;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct MappedRead {
    pub bytes: usize,
    /// Timed runs of each way (the times are medians).
    pub samples: usize,
    #[serde(rename = "device_memory_ms", serialize_with = "as_ms")]
    pub device_memory: Duration,
    #[serde(rename = "mapped_host_ms", serialize_with = "as_ms")]
    pub mapped_host: Duration,
    #[serde(rename = "copy_then_kernel_ms", serialize_with = "as_ms")]
    pub copy_then_kernel: Duration,
}

/// The float32 at `i` of the input.
pub fn value(i: usize) -> f32 {
    (i % 1000) as f32
}

/// The time between two events around `work` queued on `stream`.
pub fn timed(
    device: &Device,
    stream: &Stream,
    work: impl FnOnce() -> labs_core::Result<()>,
) -> labs_core::Result<Duration> {
    let (a, b) = (device.new_event()?, device.new_event()?);
    stream.record(&a)?;
    work()?;
    stream.record(&b)?;
    b.synchronize()?;
    Ok(Duration::from_secs_f64(a.elapsed_ms(&b)? as f64 / 1e3))
}

/// Checks that `out` holds `alpha` times the input.
pub fn check_output(out: &Tensor, alpha: f32, what: &str) -> anyhow::Result<()> {
    let got = out.to_vec::<f32>()?;
    if let Some(i) = (0..got.len()).find(|&i| got[i] != alpha * value(i)) {
        anyhow::bail!(
            "{what}: element {i} is {}, not {}",
            got[i],
            alpha * value(i)
        );
    }
    Ok(())
}

// ANCHOR: mapped_read
/// `out = 2 * x` over `size` bytes, `x` in device memory, in mapped pinned host memory,
/// and copied from pinned memory just before the kernel; `samples` timed runs of each
/// after one untimed run that checks every result.
pub fn measure(device: &Device, size: usize, samples: usize) -> anyhow::Result<MappedRead> {
    let n = size / 4;
    let stream = device.new_stream()?;
    let input: Vec<u8> = (0..n).flat_map(|i| value(i).to_ne_bytes()).collect();
    let mut mapped = MappedBuffer::new(device, size)?;
    mapped.as_mut_slice().copy_from_slice(&input);
    let mut pinned = HostAllocator::get(device).allocate(size)?;
    pinned.as_mut_slice().copy_from_slice(&input);
    let x = Tensor::zeros(&[n], DType::F32, device)?;
    let out = Tensor::zeros(&[n], DType::F32, device)?;
    let scale = |from| Kernel::scale(from, 2.0, out.ptr(), n);
    let launch = |k: &Kernel| device.backend().launch(k, &stream);
    device.synchronize()?;

    // Untimed: the first launch compiles the kernel; every path's result is checked.
    pinned.copy_to_device_async(x.ptr(), size, &stream)?;
    launch(&scale(x.ptr()))?;
    stream.synchronize()?;
    check_output(&out, 2.0, "the kernel reading device memory")?;
    out.zero_()?;
    device.synchronize()?;
    launch(&scale(mapped.device_ptr()))?;
    stream.synchronize()?;
    check_output(&out, 2.0, "the kernel reading mapped host memory")?;
    // And back: a kernel writing mapped memory, read by the host with no copy.
    launch(&Kernel::scale(out.ptr(), 0.5, mapped.device_ptr(), n))?;
    stream.synchronize()?;
    anyhow::ensure!(
        mapped.as_slice() == input.as_slice(),
        "a kernel's writes to mapped memory did not reach the host"
    );

    let (mut on_device, mut on_host, mut copied) = (vec![], vec![], vec![]);
    for _ in 0..samples.max(1) {
        on_device.push(timed(device, &stream, || launch(&scale(x.ptr())))?);
        on_host.push(timed(device, &stream, || {
            launch(&scale(mapped.device_ptr()))
        })?);
        copied.push(timed(device, &stream, || {
            pinned.copy_to_device_async(x.ptr(), size, &stream)?;
            launch(&scale(x.ptr()))
        })?);
    }
    check_output(&out, 2.0, "the kernel after a copy")?;
    // ANCHOR_END: mapped_read
    Ok(MappedRead {
        bytes: size,
        samples: samples.max(1),
        device_memory: median(&mut on_device),
        mapped_host: median(&mut on_host),
        copy_then_kernel: median(&mut copied),
    })
}

pub fn table(device: &Device, m: &MappedRead) -> Table {
    let mut t = Table::new(
        format!(
            "A kernel reading {} on {device}: where its input lives (median of {})",
            bytes(m.bytes as u64),
            m.samples
        ),
        &["input in", "time", "GB/s"],
    );
    for (name, d) in [
        ("device memory", m.device_memory),
        ("mapped pinned host memory", m.mapped_host),
        ("pinned host memory, copied first", m.copy_then_kernel),
    ] {
        t.row([
            name.to_string(),
            duration(d),
            format!("{:.1}", gbps(m.bytes, d)),
        ]);
    }
    t
}

/// What the simulated GPU models of mapped memory.
pub const SIM: &str = "device memory and mapped memory are both host memory, read by a host \
thread, and no bus is modelled: where the rows differ, it is the simulator's bookkeeping \
(device memory is kept in chunks, gathered into one buffer for a kernel that spans several; \
mapped memory is one buffer) and the copy's memcpy, not a bus";
