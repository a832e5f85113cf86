//! `poll`: what watching `nvidia-smi -l` sees of a training loop. A thread samples NVML
//! (the simulated GPU's model on `sim`) every interval, with the allocator's counters
//! read at the same moment, while the loop runs; the loop reads `memory_allocated()`
//! after each phase of each step, as the chapter's PyTorch program does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use labs_core::format::bytes;
use labs_core::table::Table;
use labs_core::Device;

use crate::model::{Spec, Trainer};
use crate::smi::{self, Source};

/// How long the loop runs, and how often NVML is sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    pub duration: Duration,
    pub interval: Duration,
}

impl Default for Options {
    /// Two seconds, sampled every 100 ms: the chapter's PyTorch program.
    fn default() -> Options {
        Options {
            duration: Duration::from_secs(2),
            interval: Duration::from_millis(100),
        }
    }
}

/// One sample: the allocator's counters and NVML's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Since the sampling started.
    pub at: Duration,
    pub allocated: u64,
    pub reserved: u64,
    /// NVML's line for this process (`None`: not listed).
    pub process: Option<u64>,
    /// NVML's used memory of the whole device.
    pub device: u64,
    /// NVML's utilisation (`None` on the simulated GPU, which has no clock to sample).
    pub util: Option<u32>,
}

/// The run's record.
#[derive(Debug, Clone)]
pub struct Poll {
    pub device: String,
    pub spec: Spec,
    pub options: Options,
    pub steps: usize,
    /// Every sample, the last one taken after the loop ended (the model still held).
    pub samples: Vec<Sample>,
    /// `memory_allocated()` after each phase of each step: the lowest and highest.
    pub phase_allocated: (u64, u64),
    pub max_allocated: u64,
    pub max_reserved: u64,
}

// ANCHOR: poll_sampler
/// One sample. The allocator first, NVML last: memory reserved between the reads can
/// only make NVML's figure larger, never smaller, than the counters beside it.
fn sample(device: &Device, source: &Source, started: Instant) -> anyhow::Result<Sample> {
    let a = device.allocator()?;
    let (allocated, reserved) = (a.memory_allocated(), a.memory_reserved());
    let report = source.sample_one()?;
    Ok(Sample {
        at: started.elapsed(),
        allocated,
        reserved,
        process: smi::this_process(&report).and_then(|p| p.used),
        device: report.used,
        util: report.utilization_percent,
    })
}

/// Runs the loop on `device`, a first step and then `options.duration` of steps, while a
/// thread samples NVML from before the model is made to after the last step. Starts
/// from an empty cache and leaves one.
pub fn run(device: &Device, source: &Source, options: Options) -> anyhow::Result<Poll> {
    let allocator = device.allocator()?;
    allocator.empty_cache()?;
    allocator.reset_peak_memory_stats();
    let spec = Spec::for_device(device);
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let (mut low, mut high) = (u64::MAX, 0);
    let mut steps = 0;
    let (trained, sampled) = std::thread::scope(|s| {
        let sampler = s.spawn(|| -> anyhow::Result<Vec<Sample>> {
            let mut samples = Vec::new();
            loop {
                let last = done.load(Ordering::Acquire);
                samples.push(sample(device, source, started)?);
                if last {
                    return Ok(samples);
                }
                std::thread::sleep(options.interval);
            }
        });
        let trained = (|| -> anyhow::Result<Trainer> {
            let mut trainer = Trainer::new(device, spec)?;
            // The first step loads (on a GPU, compiles) the kernels; the loop runs for
            // `duration` after it, as the PyTorch program's runs once its kernels are in.
            let mut steady: Option<Instant> = None;
            while steady.is_none_or(|t| t.elapsed() < options.duration) {
                trainer.step(|_| {
                    let now = allocator.memory_allocated();
                    low = low.min(now);
                    high = high.max(now);
                })?;
                // Each step's work is done before the clock is read again: the loop's
                // time is the device's, not the time to queue it.
                device.synchronize()?;
                steps += 1;
                steady.get_or_insert_with(Instant::now);
            }
            Ok(trainer)
        })();
        // The sampler's last sample comes after this, with the model still alive.
        done.store(true, Ordering::Release);
        let sampled = sampler.join().expect("the sampler thread panicked");
        (trained, sampled)
    });
    let trainer = trained?;
    let samples = sampled?;
    let (max_allocated, max_reserved) = (
        allocator.max_memory_allocated(),
        allocator.max_memory_reserved(),
    );
    drop(trainer);
    allocator.empty_cache()?;
    Ok(Poll {
        device: device.to_string(),
        spec,
        options,
        steps,
        samples,
        phase_allocated: (if steps == 0 { 0 } else { low }, high),
        max_allocated,
        max_reserved,
    })
}
// ANCHOR_END: poll_sampler

fn or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), bytes)
}

fn range(values: impl Iterator<Item = u64> + Clone) -> String {
    let (lo, hi) = (values.clone().min(), values.max());
    match (lo, hi) {
        (Some(lo), Some(hi)) if lo == hi => bytes(lo),
        (Some(lo), Some(hi)) => format!("{} to {}", bytes(lo), bytes(hi)),
        _ => "-".into(),
    }
}

/// Runs of samples in which NVML's line for this process (else the device's figure)
/// stayed the same: what a person watching `nvidia-smi -l` sees change.
pub fn runs(samples: &[Sample]) -> Vec<&[Sample]> {
    let key = |s: &Sample| s.process.unwrap_or(s.device);
    samples
        .chunk_by(|a, b| key(a) == key(b) && a.process.is_some() == b.process.is_some())
        .collect()
}

pub fn print(p: &Poll) {
    println!(
        "3. Polling NVML every {} while a training loop runs for {} after its first step \
         on {}: {} layers of {}x{}, a batch of {}, Adam",
        labs_core::format::duration(p.options.interval),
        labs_core::format::duration(p.options.duration),
        p.device,
        p.spec.layers,
        p.spec.width,
        p.spec.width,
        p.spec.batch
    );
    let mut t = Table::new(
        "NVML's samples, in runs of the same reading (what nvidia-smi -l shows)",
        &[
            "from",
            "samples",
            "NVML: this process",
            "NVML: device",
            "util, highest",
            "allocated when sampled",
            "reserved when sampled",
        ],
    );
    for run in runs(&p.samples) {
        let util = run.iter().filter_map(|s| s.util).max();
        t.row([
            format!("{} ms", run[0].at.as_millis()),
            run.len().to_string(),
            or_dash(run[0].process),
            range(run.iter().map(|s| s.device)),
            util.map_or_else(|| "-".into(), |u| format!("{u}%")),
            range(run.iter().map(|s| s.allocated)),
            range(run.iter().map(|s| s.reserved)),
        ]);
    }
    println!("{t}");
    let process_high = p.samples.iter().filter_map(|s| s.process).max();
    let process_last = p.samples.last().and_then(|s| s.process);
    let mut c = Table::new("The same run, from the allocator", &["figure", "value"]);
    c.row(["training steps".to_string(), p.steps.to_string()]);
    c.row(["NVML samples".to_string(), p.samples.len().to_string()]);
    c.row([
        "memory_allocated() after a phase, lowest".to_string(),
        bytes(p.phase_allocated.0),
    ]);
    c.row([
        "memory_allocated() after a phase, highest".to_string(),
        bytes(p.phase_allocated.1),
    ]);
    c.row(["max_memory_allocated()".to_string(), bytes(p.max_allocated)]);
    c.row(["max_memory_reserved()".to_string(), bytes(p.max_reserved)]);
    c.row([
        "NVML: this process, highest sample".to_string(),
        or_dash(process_high),
    ]);
    c.row([
        "NVML: this process, last sample".to_string(),
        or_dash(process_last),
    ]);
    c.row([
        "last sample - max_memory_reserved()".to_string(),
        or_dash(process_last.and_then(|l| l.checked_sub(p.max_reserved))),
    ]);
    println!("{c}");
    if p.samples.iter().all(|s| s.util.is_none()) {
        println!(
            "(util: the simulated GPU has no clock for NVML to sample, and its NVML line \
             is its reserved memory; a GPU shows both)"
        );
    }
    println!();
}

pub fn json(p: &Poll) -> serde_json::Value {
    serde_json::json!({
        "device": p.device,
        "width": p.spec.width,
        "layers": p.spec.layers,
        "batch": p.spec.batch,
        "duration_s": p.options.duration.as_secs_f64(),
        "interval_s": p.options.interval.as_secs_f64(),
        "steps": p.steps,
        "phase_allocated_min": p.phase_allocated.0,
        "phase_allocated_max": p.phase_allocated.1,
        "max_allocated": p.max_allocated,
        "max_reserved": p.max_reserved,
        "samples": p.samples.iter().map(|s| serde_json::json!({
            "at_ms": s.at.as_secs_f64() * 1000.0,
            "allocated": s.allocated,
            "reserved": s.reserved,
            "nvml_process": s.process,
            "nvml_device": s.device,
            "util_percent": s.util,
        })).collect::<Vec<_>>(),
    })
}
