//! `lab-08 bench`: bandwidth and the training loop side by side in one run, as a table
//! or as one JSON object.

use labs_core::table::Table;
use labs_core::{Device, Result};
use serde::Serialize;

use crate::bandwidth::{self, Bandwidth};
use crate::driver_work::DriverWork;
use crate::loader::{Fill, LoaderConfig};
use crate::training::{self, StepTimes};

/// PyTorch's figures on the H100 of the project's reference measurements (GB/s).
pub const PYTORCH_PINNED_HTOD: f64 = 55.1;
pub const PYTORCH_PINNED_DTOH: f64 = 55.2;

#[derive(Debug, Serialize)]
pub struct Report {
    pub device: String,
    pub device_name: String,
    pub naive_step_ms: f64,
    pub prefetch_step_ms: f64,
    pub copy_ms: f64,
    pub compute_ms: f64,
    pub batch_bytes: usize,
    /// prefetch step / max(copy, compute); the target is at most 1.05.
    pub prefetch_ratio: f64,
    /// The slowest of the prefetched loop's passes (the step time is their median).
    pub prefetch_step_worst_ms: f64,
    /// Driver calls during the timed steps: all zero when the loop measured copies and
    /// kernels only.
    pub timed_driver_work: DriverWork,
    pub pinned_htod_gbps: f64,
    pub pinned_dtoh_gbps: f64,
    pub pageable_htod_gbps: f64,
    pub pageable_dtoh_gbps: f64,
    pub pytorch_pinned_htod_gbps: f64,
    pub pytorch_pinned_dtoh_gbps: f64,
    pub bandwidth: Vec<Bandwidth>,
}

/// The training loop's batch: 64 MiB on a GPU (about a millisecond over PCIe, long
/// enough that per-step overheads stay small), 16 MiB on the simulator.
pub fn loader_config(device: &Device, quick: bool) -> LoaderConfig {
    let (sample_elems, batches) = match (quick, device.is_cuda()) {
        (true, _) => (1 << 10, 12),
        (false, true) => (1 << 16, 60),
        (false, false) => (1 << 16, 30),
    };
    LoaderConfig {
        batch_size: 256,
        sample_elems,
        batches,
        // The simulator's streams are threads too: on a small machine, fewer workers
        // leave the cores to the copy and compute streams.
        workers: if device.is_cuda() { 4 } else { 1 },
        prefetch_depth: 2,
        fill: Fill::Header,
    }
}

pub fn run(device: &Device, quick: bool, progress: bool) -> Result<Report> {
    let rows = bandwidth::measure(device, &bandwidth::sizes(device, quick))?;
    let steps: StepTimes = training::measure(device, loader_config(device, quick), progress)?;
    let best = |f: fn(&Bandwidth) -> f64| rows.iter().map(f).fold(0.0, f64::max);
    Ok(Report {
        device: device.to_string(),
        device_name: device.properties()?.name,
        naive_step_ms: steps.naive_step_ms,
        prefetch_step_ms: steps.prefetch_step_ms,
        copy_ms: steps.copy_ms,
        compute_ms: steps.compute_ms,
        batch_bytes: steps.batch_bytes,
        prefetch_ratio: steps.prefetch_ratio,
        prefetch_step_worst_ms: steps.prefetch_step_worst_ms,
        timed_driver_work: steps.timed_driver_work,
        pinned_htod_gbps: best(|r| r.pinned_htod_gbps),
        pinned_dtoh_gbps: best(|r| r.pinned_dtoh_gbps),
        pageable_htod_gbps: best(|r| r.pageable_htod_gbps),
        pageable_dtoh_gbps: best(|r| r.pageable_dtoh_gbps),
        pytorch_pinned_htod_gbps: PYTORCH_PINNED_HTOD,
        pytorch_pinned_dtoh_gbps: PYTORCH_PINNED_DTOH,
        bandwidth: rows,
    })
}

pub fn tables(device: &Device, r: &Report) -> Vec<Table> {
    let mut steps = Table::new(
        format!(
            "A training-like loop on {device} ({}): batch {} copied, then a kernel of about the same length",
            r.device_name,
            labs_core::format::bytes(r.batch_bytes as u64)
        ),
        &["measure", "ms per step"],
    );
    steps.row(["copy alone", &format!("{:.3}", r.copy_ms)]);
    steps.row(["compute alone", &format!("{:.3}", r.compute_ms)]);
    steps.row([
        "naive (copy, then compute)",
        &format!("{:.3}", r.naive_step_ms),
    ]);
    steps.row([
        "prefetched (overlapped)",
        &format!("{:.3}", r.prefetch_step_ms),
    ]);
    steps.row([
        "prefetched / max(copy, compute)".to_string(),
        format!("{:.3}", r.prefetch_ratio),
    ]);
    steps.row([
        "prefetched, slowest pass".to_string(),
        format!("{:.3}", r.prefetch_step_worst_ms),
    ]);
    steps.row([
        "driver calls in the timed steps".to_string(),
        driver_work_summary(&r.timed_driver_work),
    ]);
    let mut peak = Table::new(
        "Best bandwidth over all sizes (GB/s), beside PyTorch's on an H100",
        &["direction", "pageable", "pinned", "PyTorch pinned"],
    );
    peak.row([
        "host->device".to_string(),
        format!("{:.1}", r.pageable_htod_gbps),
        format!("{:.1}", r.pinned_htod_gbps),
        format!("{:.1}", r.pytorch_pinned_htod_gbps),
    ]);
    peak.row([
        "device->host".to_string(),
        format!("{:.1}", r.pageable_dtoh_gbps),
        format!("{:.1}", r.pinned_dtoh_gbps),
        format!("{:.1}", r.pytorch_pinned_dtoh_gbps),
    ]);
    vec![bandwidth::table(device, &r.bandwidth), peak, steps]
}

/// `none`, or which driver calls the timed steps made (pinned allocs and frees, device
/// allocs, frees and synchronisations).
pub fn driver_work_summary(w: &DriverWork) -> String {
    if w.is_none() {
        return "none".to_string();
    }
    format!(
        "pinned alloc {} free {}, device alloc {} free {} sync {}",
        w.pinned_allocs, w.pinned_frees, w.device_allocs, w.device_frees, w.device_syncs
    )
}
