//! A training-like loop: copy a batch to the device, run a kernel on it. Naively the
//! two take turns on one stream; with the prefetcher the copy of batch N+1 overlaps the
//! kernel on batch N, and a step costs the longer of the two instead of their sum.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use labs_core::host::HostAllocator;
use labs_core::kernels::Kernel;
use labs_core::timing::median;
use labs_core::{Device, Result, Stream};
use serde::Serialize;

use crate::loader::{HostLoader, LoaderConfig, PrefetchLoader};

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StepTimes {
    pub batch_bytes: usize,
    pub spin_iterations: u32,
    /// One batch's host-to-device copy from pinned memory, alone.
    pub copy_ms: f64,
    /// One kernel on a batch, alone.
    pub compute_ms: f64,
    pub naive_step_ms: f64,
    pub prefetch_step_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn event_ms(
    device: &Device,
    stream: &Stream,
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<Duration> {
    let (a, b) = (device.new_event()?, device.new_event()?);
    stream.record(&a)?;
    f()?;
    stream.record(&b)?;
    b.synchronize()?;
    Ok(Duration::from_secs_f64(a.elapsed_ms(&b)? as f64 / 1e3))
}

/// The time of one pinned copy of a batch and an iteration count that makes the
/// kernel take as long.
pub fn calibrate(
    device: &Device,
    config: &LoaderConfig,
    samples: usize,
) -> Result<(Duration, u32, Duration)> {
    let stream = device.new_stream()?;
    let buffer = device.raw_buffer(config.batch_bytes())?;
    let host = HostAllocator::get(device).allocate(config.batch_bytes())?;
    let mut copies = Vec::new();
    for _ in 0..samples + 1 {
        copies.push(event_ms(device, &stream, &mut || {
            host.copy_to_device_async(buffer.ptr(), host.len(), &stream)
        })?);
    }
    copies.remove(0);
    let copy = median(&mut copies);
    let kernel = |iterations| Kernel::Spin {
        x: buffer.ptr(),
        n: config.batch_elems(),
        iterations,
    };
    let mut iterations = 1u32;
    let mut took;
    loop {
        took = event_ms(device, &stream, &mut || {
            device.backend().launch(&kernel(iterations), &stream)
        })?;
        if took >= copy / 4 || iterations >= 1 << 24 {
            break;
        }
        iterations *= 2;
    }
    let iterations =
        ((iterations as f64 * copy.as_secs_f64() / took.as_secs_f64().max(1e-9)) as u32).max(1);
    let mut computes = Vec::new();
    for _ in 0..samples {
        computes.push(event_ms(device, &stream, &mut || {
            device.backend().launch(&kernel(iterations), &stream)
        })?);
    }
    Ok((copy, iterations, median(&mut computes)))
}

fn progress(total: usize, label: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} batches {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(label.to_string());
    bar
}

// ANCHOR: naive_loop
/// Copy, then compute, on one stream: every step pays for both.
pub fn naive(
    device: &Device,
    config: LoaderConfig,
    iterations: u32,
    warmup: usize,
    show: bool,
) -> Result<Duration> {
    let compute = device.new_stream()?;
    let target = device.raw_buffer(config.batch_bytes())?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    let bar = progress(config.batches, "naive", show);
    for (i, batch) in HostLoader::new(device, config).enumerate() {
        let batch = batch?;
        if i == warmup {
            compute.record(&start)?;
        }
        batch
            .data
            .copy_to_device_async(target.ptr(), batch.data.len(), &compute)?;
        device.backend().launch(
            &Kernel::Spin {
                x: target.ptr(),
                n: config.batch_elems(),
                iterations,
            },
            &compute,
        )?;
        bar.inc(1);
    }
    compute.record(&end)?;
    end.synchronize()?;
    bar.finish_and_clear();
    per_step(&start, &end, config.batches - warmup)
}
// ANCHOR_END: naive_loop

// ANCHOR: prefetch_loop
/// The same work through the prefetcher: copies on their own stream, one step ahead.
pub fn prefetched(
    device: &Device,
    config: LoaderConfig,
    iterations: u32,
    warmup: usize,
    show: bool,
) -> Result<Duration> {
    let compute = device.new_stream()?;
    let mut loader = PrefetchLoader::new(device, config)?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    let bar = progress(config.batches, "prefetch", show);
    let mut i = 0;
    while let Some(batch) = loader.next_batch(&compute)? {
        if i == warmup {
            compute.record(&start)?;
        }
        device.backend().launch(
            &Kernel::Spin {
                x: batch.ptr,
                n: batch.elems,
                iterations,
            },
            &compute,
        )?;
        i += 1;
        bar.inc(1);
    }
    compute.record(&end)?;
    end.synchronize()?;
    bar.finish_and_clear();
    per_step(&start, &end, config.batches - warmup)
}
// ANCHOR_END: prefetch_loop

fn per_step(start: &labs_core::Event, end: &labs_core::Event, steps: usize) -> Result<Duration> {
    let total = start.elapsed_ms(end)? as f64 / 1e3;
    Ok(Duration::from_secs_f64(total / steps.max(1) as f64))
}

/// Calibrates, then runs both loops on the same batches.
pub fn measure(device: &Device, config: LoaderConfig, show: bool) -> Result<StepTimes> {
    let (copy, iterations, compute) = calibrate(device, &config, 5)?;
    let warmup = (config.batches / 10)
        .clamp(1, 5)
        .min(config.batches.saturating_sub(1));
    let naive = naive(device, config, iterations, warmup, show)?;
    let prefetch = prefetched(device, config, iterations, warmup, show)?;
    Ok(StepTimes {
        batch_bytes: config.batch_bytes(),
        spin_iterations: iterations,
        copy_ms: ms(copy),
        compute_ms: ms(compute),
        naive_step_ms: ms(naive),
        prefetch_step_ms: ms(prefetch),
    })
}
