//! A training-like loop: copy a batch to the device, run a kernel on it. Naively the
//! two take turns on one stream; with the prefetcher the copy of batch N+1 overlaps the
//! kernel on batch N, and a step costs the longer of the two instead of their sum.

use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use labs_core::host::{HostAllocator, HostStats};
use labs_core::kernels::Kernel;
use labs_core::timing::median;
use labs_core::{Device, Result, Stream};
use serde::Serialize;

use crate::driver_work::{Counters, DriverWork};
use crate::loader::{HostLoader, LoaderConfig, PrefetchLoader};

/// Each loop runs this many times; the step times reported are the medians. One pass
/// is a few tens of milliseconds on a GPU: a single stall of the host (the scheduler,
/// another process) would otherwise weigh on every step of the only sample.
pub const PASSES: usize = 3;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StepTimes {
    pub batch_bytes: usize,
    /// The kernel: `spin_iterations` multiply-adds on each of `spin_elems` values.
    pub spin_elems: usize,
    pub spin_iterations: u32,
    /// One batch's host-to-device copy from pinned memory, alone.
    pub copy_ms: f64,
    /// One kernel on a batch, alone.
    pub compute_ms: f64,
    pub naive_step_ms: f64,
    pub prefetch_step_ms: f64,
    /// The slowest pass of the prefetched loop: far above the median, something
    /// outside the loop interrupted it.
    pub prefetch_step_worst_ms: f64,
    /// prefetch step / max(copy, compute); the target is at most 1.05.
    pub prefetch_ratio: f64,
    /// Driver work during the timed steps of every pass of both loops: all zero when
    /// the step times measure copies and kernels only.
    pub timed_driver_work: DriverWork,
    /// The loop's own pinned pool after the passes.
    #[serde(skip)]
    pub pool: HostStats,
}

/// One timed pass of a loop.
struct Pass {
    step: Duration,
    work: DriverWork,
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

/// How long one pinned copy of a batch takes, and a spin kernel that takes about as
/// long: `(copy, kernel, compute time)`.
pub fn calibrate(
    device: &Device,
    pool: &Arc<HostAllocator>,
    config: &LoaderConfig,
    samples: usize,
) -> Result<(Duration, Kernel, Duration)> {
    let stream = device.new_stream()?;
    let buffer = device.raw_buffer(config.batch_bytes())?;
    let host = pool.allocate(config.batch_bytes())?;
    let mut copies = Vec::new();
    for _ in 0..samples + 1 {
        copies.push(event_ms(device, &stream, &mut || {
            host.copy_to_device_async(buffer.ptr(), host.len(), &stream)
        })?);
    }
    copies.remove(0);
    let copy = median(&mut copies);
    let kernel = |n, iterations| Kernel::Spin {
        x: buffer.ptr(),
        n,
        iterations,
    };
    let time = |k: &Kernel| event_ms(device, &stream, &mut || device.backend().launch(k, &stream));
    let mut n = config.batch_elems();
    let (iterations, took) = loop {
        let mut iterations = 1u32;
        let took = loop {
            let took = time(&kernel(n, iterations))?;
            if took >= copy / 4 || iterations >= 1 << 24 {
                break took;
            }
            iterations *= 2;
        };
        if iterations > 1 || took <= copy || n <= 4096 {
            break (iterations, took);
        }
        // One pass over the batch already outlasts the copy (a device simulated on the
        // CPU, where it competes with the copy for memory bandwidth): spin on a
        // cache-sized part of the batch instead, so that the kernel is pure compute.
        n = (n / 256).max(4096);
    };
    let scale = copy.as_secs_f64() / took.as_secs_f64().max(1e-9);
    let iterations = ((iterations as f64 * scale) as u32).max(1);
    let spin = kernel(n, iterations);
    let mut computes = Vec::new();
    for _ in 0..samples {
        computes.push(time(&spin)?);
    }
    Ok((copy, spin, median(&mut computes)))
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
fn naive(
    device: &Device,
    pool: &Arc<HostAllocator>,
    config: LoaderConfig,
    spin: &Kernel,
    warmup: usize,
    show: bool,
) -> Result<Pass> {
    let compute = device.new_stream()?;
    let target = device.raw_buffer(config.batch_bytes())?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    let bar = progress(config.batches, "naive", show);
    let mut pace = Pace::new(device)?;
    let mut window = Window::new(device, pool);
    for (i, batch) in HostLoader::with_allocator(pool.clone(), config).enumerate() {
        let batch = batch?;
        if i == warmup {
            compute.record(&start)?;
            window.open()?;
        }
        batch
            .data
            .copy_to_device_async(target.ptr(), batch.data.len(), &compute)?;
        device.backend().launch(&on(spin, target.ptr()), &compute)?;
        pace.step(&compute)?;
        bar.inc(1);
    }
    compute.record(&end)?;
    let work = window.close()?;
    end.synchronize()?;
    bar.finish_and_clear();
    Ok(Pass {
        step: per_step(&start, &end, config.batches - warmup)?,
        work,
    })
}
// ANCHOR_END: naive_loop

// ANCHOR: prefetch_loop
/// The same work through the prefetcher: copies on their own stream, one step ahead.
fn prefetched(
    device: &Device,
    pool: &Arc<HostAllocator>,
    config: LoaderConfig,
    spin: &Kernel,
    warmup: usize,
    show: bool,
) -> Result<Pass> {
    let compute = device.new_stream()?;
    let mut loader = PrefetchLoader::with_allocator(device, pool.clone(), config)?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    let bar = progress(config.batches, "prefetch", show);
    let mut pace = Pace::new(device)?;
    let mut window = Window::new(device, pool);
    let mut i = 0;
    while let Some(batch) = loader.next_batch(&compute)? {
        if i == warmup {
            compute.record(&start)?;
            window.open()?;
        }
        device.backend().launch(&on(spin, batch.ptr), &compute)?;
        pace.step(&compute)?;
        i += 1;
        bar.inc(1);
    }
    compute.record(&end)?;
    let work = window.close()?;
    end.synchronize()?;
    bar.finish_and_clear();
    Ok(Pass {
        step: per_step(&start, &end, config.batches - warmup)?,
        work,
    })
}
// ANCHOR_END: prefetch_loop

/// The driver work between the start and the end events of a loop.
struct Window<'a> {
    device: &'a Device,
    pool: &'a HostAllocator,
    opened: Option<Counters>,
}

impl<'a> Window<'a> {
    fn new(device: &'a Device, pool: &'a HostAllocator) -> Self {
        Window {
            device,
            pool,
            opened: None,
        }
    }

    fn open(&mut self) -> Result<()> {
        self.opened = Some(Counters::read(self.device, self.pool)?);
        Ok(())
    }

    fn close(self) -> Result<DriverWork> {
        let end = Counters::read(self.device, self.pool)?;
        Ok(self.opened.map(|o| o.until(&end)).unwrap_or_default())
    }
}

/// Keeps the host one step ahead of the device, as a training loop that reads the
/// previous step's loss does. Without it the host would queue every step at once and
/// pin a new buffer for each, measuring the pinning instead of the steps.
struct Pace {
    done: [labs_core::Event; 2],
    step: usize,
}

impl Pace {
    fn new(device: &Device) -> Result<Pace> {
        Ok(Pace {
            done: [device.new_event()?, device.new_event()?],
            step: 0,
        })
    }

    fn step(&mut self, stream: &Stream) -> Result<()> {
        stream.record(&self.done[self.step % 2])?;
        if self.step > 0 {
            self.done[(self.step - 1) % 2].synchronize()?;
        }
        self.step += 1;
        Ok(())
    }
}

/// The calibrated kernel, aimed at another buffer.
fn on(spin: &Kernel, ptr: u64) -> Kernel {
    match *spin {
        Kernel::Spin { n, iterations, .. } => Kernel::Spin {
            x: ptr,
            n,
            iterations,
        },
        ref other => other.clone(),
    }
}

fn per_step(start: &labs_core::Event, end: &labs_core::Event, steps: usize) -> Result<Duration> {
    let total = start.elapsed_ms(end)? as f64 / 1e3;
    Ok(Duration::from_secs_f64(total / steps.max(1) as f64))
}

/// Calibrates, then runs both loops on the same batches, `PASSES` times each.
pub fn measure(device: &Device, config: LoaderConfig, show: bool) -> Result<StepTimes> {
    // The loop's batches come from a pinned pool of its own, not the device's shared
    // one: what the loop finds in its pool (how many blocks of the batch's size class,
    // pending blocks whose events sit on other experiments' streams, a miss that pins
    // 64 MiB under the driver's lock in the middle of the timed steps) must not depend
    // on what ran before it in the same process.
    let pool = Arc::new(HostAllocator::new(device));
    // Fill it first: a miss costs a slow cuMemHostAlloc, which belongs to a first
    // epoch, not to a step time. Each worker holds a batch it built and one in its
    // queue; the loop has up to `depth` copies in flight and a step's worth waiting
    // for events; then a margin.
    let blocks = 3 * config.workers + 2 * config.prefetch_depth + 4;
    let warm = (0..blocks)
        .map(|_| pool.allocate(config.batch_bytes()))
        .collect::<Result<Vec<_>>>()?;
    drop(warm);
    // The device allocator's counters are read in the timed steps: create it now if no
    // earlier experiment did. And let whatever earlier experiments queued finish.
    device.allocator()?;
    device.synchronize()?;
    let (copy, spin, compute) = calibrate(device, &pool, &config, 5)?;
    let warmup = (config.batches / 10)
        .clamp(1, 5)
        .min(config.batches.saturating_sub(1));
    let mut work = DriverWork::default();
    let (mut naive_steps, mut prefetch_steps) = (Vec::new(), Vec::new());
    for _ in 0..PASSES {
        let n = naive(device, &pool, config, &spin, warmup, show)?;
        let p = prefetched(device, &pool, config, &spin, warmup, show)?;
        work.add(n.work);
        work.add(p.work);
        naive_steps.push(n.step);
        prefetch_steps.push(p.step);
    }
    let worst = prefetch_steps.iter().copied().max().unwrap_or_default();
    let (naive, prefetch) = (median(&mut naive_steps), median(&mut prefetch_steps));
    let Kernel::Spin { n, iterations, .. } = spin else {
        unreachable!("calibrate returns a spin kernel")
    };
    pool.process_events()?;
    Ok(StepTimes {
        batch_bytes: config.batch_bytes(),
        spin_elems: n,
        spin_iterations: iterations,
        copy_ms: ms(copy),
        compute_ms: ms(compute),
        naive_step_ms: ms(naive),
        prefetch_step_ms: ms(prefetch),
        prefetch_step_worst_ms: ms(worst),
        prefetch_ratio: ms(prefetch) / ms(copy).max(ms(compute)),
        timed_driver_work: work,
        pool: pool.stats(),
    })
}

/// The loop's pinned pool after its passes: how often a batch buffer came from the
/// cache.
pub fn pool_table(device: &Device, steps: &StepTimes) -> labs_core::table::Table {
    use labs_core::format::bytes;
    let s = steps.pool;
    let mut t = labs_core::table::Table::new(
        format!("The training loop's pinned-memory pool on {device} after its passes"),
        &["statistic", "value"],
    );
    t.row(["allocations", &s.alloc_calls.to_string()]);
    t.row(["served from the cache", &s.cache_hits.to_string()]);
    t.row(["cuMemHostAlloc calls", &s.host_alloc_calls.to_string()]);
    t.row(["reserved now", &bytes(s.reserved_bytes)]);
    t.row(["peak allocated", &bytes(s.allocated_peak)]);
    t.row([
        "freed, waiting for their copies",
        &s.pending_blocks.to_string(),
    ]);
    t
}
