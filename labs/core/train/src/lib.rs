//! The training driver later chapters share: one model (a Transformer or a GPT-2)
//! trained for a few steps with the memory techniques of the book switched on by
//! configuration, measured as PyTorch measures it. On the dry-run device the whole run
//! executes the allocator and every op's allocations without kernels, so its peaks
//! predict the GPU's.
//!
//! - [`config`]: a run as a [`TrainConfig`];
//! - [`args`]: `lab-10 train`'s flags, parsed into one;
//! - [`model`]: either model, its random micro-batches, one forward and loss;
//! - [`step`]: one optimizer step with accumulation, checkpoint, offload and AMP;
//! - [`measure`]: peaks, their split by category, step times;
//! - [`report`]: the [`TrainReport`], as JSON or tables;
//! - [`data_parallel`]: the same run on several devices, DDP or ZeRO-1, one rank each;
//! - [`snapshot`]: the allocator's history over a run, written as a memory snapshot.

pub mod args;
pub mod config;
pub mod data_parallel;
pub mod flops;
pub mod measure;
pub mod model;
pub mod report;
pub mod snapshot;
pub mod step;

pub use args::{parse_flags, parse_train_args, TrainArgs};
pub use config::{AmpMode, AttentionMode, CheckpointMode, ModelKind, OptimizerKind, TrainConfig};
pub use report::{GraphReport, OffloadReport, RankFigures, TrainReport};
pub use step::{DataParallel, Trainer};

use anyhow::Result;
use indicatif::ProgressBar;
use labs_core::nn::{reset_sdpa_calls, sdpa_calls};
use labs_core::Device;

/// Trains as `config` says on `device` and reports. An out-of-memory error ends the
/// run but not the report: it comes back with `oom` set and the figures so far (as a
/// caller searching for what fits needs them). Other errors are errors.
pub fn run(config: &TrainConfig, device: &Device) -> Result<TrainReport> {
    run_with_progress(config, device, &ProgressBar::hidden())
}

/// [`run`], advancing `bar` by one per optimizer step.
pub fn run_with_progress(
    config: &TrainConfig,
    device: &Device,
    bar: &ProgressBar,
) -> Result<TrainReport> {
    run_trainer(config, device, bar, 1, || Trainer::new(config, device))
}

/// A run of the trainer `make` builds, as one of `world_size` ranks.
pub(crate) fn run_trainer(
    config: &TrainConfig,
    device: &Device,
    bar: &ProgressBar,
    world_size: usize,
    make: impl FnOnce() -> Result<Trainer>,
) -> Result<TrainReport> {
    // cuBLAS's workspace, from the allocator (PyTorch's has its own made by the
    // warm-up step before its peaks are reset): there before the run, on every run.
    device.ensure_gemm_workspace()?;
    let ooms_before = device.allocator()?.stats().num_ooms;
    let mut trainer = match make() {
        Ok(t) => t,
        // The model itself does not fit: the figures are those of its allocation.
        Err(e) if is_out_of_memory(&e) => {
            let memory = measure::read(device, ooms_before)?;
            let mut report = TrainReport::new(config, device, 0, memory, Some(format!("{e:#}")));
            report.world_size = world_size;
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    let params = trainer.model.module().num_parameters();
    measure::start(device)?;
    reset_sdpa_calls();
    let mut losses = Vec::new();
    let mut times = Vec::new();
    // The offload copies' busy time in each timed step.
    let mut copy_times = Vec::new();
    let mut oom = None;
    let mut timeline = Vec::new();
    // The allocator's driver calls that take, give back or map memory, step by step.
    let mut driver_calls = Vec::new();
    // ANCHOR: timeline
    for step in 0..config.steps {
        let last = step + 1 == config.steps;
        // The kernel profile (`--profile`) covers the steps after the warm-up ones: the
        // first step also compiles every kernel, which the profile would charge to
        // the first launch of each.
        if step == config.warmup && labs_core::device::profile::enabled() {
            device.synchronize()?;
            labs_core::device::profile::take()?;
        }
        if config.timeline && last {
            device.allocator()?.record_category_timeline(1 << 22);
        }
        let driver_before = device.allocator()?.stats().driver;
        // `--graph`: the warm-up steps eager, the rest replays of one captured step.
        let captured = config.graph && step >= config.warmup;
        let result = measure::timed(device, || match captured {
            true => trainer.graph_step(step),
            false => trainer.step(step),
        });
        let driver = device.allocator()?.stats().driver.since(&driver_before);
        driver_calls.push(driver.memory_calls());
        if config.timeline && last {
            timeline = device.allocator()?.category_timeline().0;
            device.allocator()?.record_category_timeline(0);
        }
        // ANCHOR_END: timeline
        match result {
            Ok((loss, time)) => {
                losses.push(loss);
                // Taken every step (the step ended in a synchronisation), kept for the
                // timed ones.
                let copies = trainer.take_offload_copy_times()?;
                if step >= config.warmup {
                    times.push(time);
                    copy_times.extend(copies);
                }
            }
            Err(e) if is_out_of_memory(&e) => {
                oom = Some(format!("{e:#}"));
                break;
            }
            Err(e) => return Err(e),
        }
        bar.inc(1);
    }
    let calls = sdpa_calls();
    let offload = (trainer.offload_stats()).map(|s| OffloadReport::new(s, &copy_times));
    let skipped_steps = (config.amp == AmpMode::F16).then_some(trainer.skipped_steps);
    // The memory is read with the model alive: the peaks are those of the run.
    let memory = measure::read(device, ooms_before)?;
    let graph = trainer.graph_report()?;
    drop(trainer);
    let mut report = TrainReport::new(config, device, params, memory, oom);
    report.world_size = world_size;
    report.step_ms = measure::median_ms(&times).filter(|_| !device.is_dry());
    // Every rank trains on its own micro-batches: the job's samples per step.
    let samples = (world_size * config.batch * config.accum) as f64;
    report.samples_per_s = report.step_ms.map(|ms| samples / (ms / 1e3));
    report.mfu = report
        .step_ms
        .zip(report.peak_flops)
        .map(|(ms, peak)| flops::mfu(report.model_flops_per_step, ms, peak));
    if !device.is_dry() {
        report.losses = Some(losses.into_iter().map(|l| l.unwrap_or(f64::NAN)).collect());
    }
    report.attention_fused_calls = calls.fused;
    report.attention_math_calls = calls.math;
    report.skipped_steps = skipped_steps;
    report.offload = offload;
    report.graph = graph;
    report.timeline = timeline;
    report.steady_driver_calls_per_step = steady_calls(&driver_calls);
    report.driver_calls_per_step = driver_calls;
    Ok(report)
}

/// The steps a training loop may take to find its working set: from the fourth step on,
/// a step that repeats the one before it should make no driver call for memory.
pub const DRIVER_WARMUP_STEPS: usize = 3;

/// The most driver calls for memory of any step after the warm-up ones; `None` when
/// the run had no step after them.
pub fn steady_calls(per_step: &[u64]) -> Option<u64> {
    per_step.iter().skip(DRIVER_WARMUP_STEPS).copied().max()
}

/// Whether `e` is the runtime's out-of-memory error.
pub fn is_out_of_memory(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<labs_core::Error>()
            .is_some_and(labs_core::Error::is_out_of_memory)
    })
}
