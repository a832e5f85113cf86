//! `lab-08 bench`: bandwidth and the training loop side by side in one run, as a table
//! or as one JSON object; with `--pytorch FILE`, PyTorch's bandwidth beside ours, read
//! from the JSON object `ci/pytorch-reference.py` printed on the same machine (the GPU
//! bundle runs it before the labs and passes its file to every bench).

use std::path::Path;

use anyhow::Context;
use labs_core::table::Table;
use labs_core::{Device, Result};
use serde::{Deserialize, Serialize};

use crate::bandwidth::{self, Bandwidth};
use crate::driver_work::DriverWork;
use crate::loader::{Fill, LoaderConfig};
use crate::training::{self, StepTimes};

/// PyTorch's copy bandwidth (GB/s, 1 GiB copies), as `ci/pytorch-reference.py` prints
/// it (its other keys are left out here), and the GPU it ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PyTorchFigures {
    pub device_name: String,
    /// `torch.__version__`, when the file has it.
    #[serde(default)]
    pub torch: Option<String>,
    pub pinned_htod_gbps: f64,
    pub pinned_dtoh_gbps: f64,
    pub pageable_htod_gbps: f64,
    pub pageable_dtoh_gbps: f64,
}

/// What `bench` prints where no `--pytorch FILE` was given.
pub const PYTORCH_NOT_MEASURED: &str = "PyTorch: not measured in this run (pass --pytorch FILE)";

/// Reads PyTorch's figures from the JSON object `ci/pytorch-reference.py` printed. The
/// error names the file and says what is wrong with it: missing, not JSON, or a key
/// missing or not a number.
pub fn read_pytorch(path: &Path) -> anyhow::Result<PyTorchFigures> {
    let text = labs_core::input::read_report(path)
        .with_context(|| format!("reading PyTorch's figures from {}", path.display()))?;
    let figures: PyTorchFigures = serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "{} is not the JSON object ci/pytorch-reference.py prints (device_name, \
             pinned_htod_gbps, pinned_dtoh_gbps, pageable_htod_gbps, pageable_dtoh_gbps)",
            path.display()
        )
    })?;
    for (key, v) in [
        ("pinned_htod_gbps", figures.pinned_htod_gbps),
        ("pinned_dtoh_gbps", figures.pinned_dtoh_gbps),
        ("pageable_htod_gbps", figures.pageable_htod_gbps),
        ("pageable_dtoh_gbps", figures.pageable_dtoh_gbps),
    ] {
        anyhow::ensure!(
            v.is_finite() && v > 0.0,
            "{}: {key} is {v}, not a bandwidth in GB/s",
            path.display()
        );
    }
    Ok(figures)
}

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
    /// PyTorch's figures from `--pytorch FILE`, or null when not measured in this run.
    pub pytorch: Option<PyTorchFigures>,
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

pub fn run(
    device: &Device,
    quick: bool,
    progress: bool,
    pytorch: Option<PyTorchFigures>,
) -> Result<Report> {
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
        pytorch,
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
    vec![bandwidth::table(device, &r.bandwidth), peak_table(r), steps]
}

/// The tables as `bench` prints them, one blank line after each, with
/// [`pytorch_note`] under the bandwidth comparison.
pub fn text(device: &Device, r: &Report) -> String {
    let mut out = String::new();
    for (i, t) in tables(device, r).iter().enumerate() {
        out.push_str(&format!("{t}\n"));
        if i == 1 {
            if let Some(note) = pytorch_note(r) {
                out.push_str(&format!("{note}\n\n"));
            }
        }
    }
    out
}

/// Our best bandwidth over all sizes and, when given, PyTorch's (1 GiB copies) beside
/// it, the GPU it ran on named in the title.
pub fn peak_table(r: &Report) -> Table {
    let rows = [
        (
            "host->device",
            r.pageable_htod_gbps,
            r.pinned_htod_gbps,
            r.pytorch
                .as_ref()
                .map(|p| (p.pageable_htod_gbps, p.pinned_htod_gbps)),
        ),
        (
            "device->host",
            r.pageable_dtoh_gbps,
            r.pinned_dtoh_gbps,
            r.pytorch
                .as_ref()
                .map(|p| (p.pageable_dtoh_gbps, p.pinned_dtoh_gbps)),
        ),
    ];
    let mut peak = match &r.pytorch {
        Some(p) => Table::new(
            format!(
                "Best bandwidth over all sizes (GB/s), beside PyTorch's 1 GiB copies on {}{}",
                p.device_name,
                p.torch
                    .as_ref()
                    .map(|v| format!(" (torch {v})"))
                    .unwrap_or_default()
            ),
            &[
                "direction",
                "pageable",
                "pinned",
                "PyTorch pageable",
                "PyTorch pinned",
            ],
        ),
        None => Table::new(
            "Best bandwidth over all sizes (GB/s)",
            &["direction", "pageable", "pinned"],
        ),
    };
    for (direction, pageable, pinned, theirs) in rows {
        let mut row = vec![
            direction.to_string(),
            format!("{pageable:.1}"),
            format!("{pinned:.1}"),
        ];
        if let Some((t_pageable, t_pinned)) = theirs {
            row.push(format!("{t_pageable:.1}"));
            row.push(format!("{t_pinned:.1}"));
        }
        peak.row(row);
    }
    peak
}

/// The line printed under the bandwidth table: that PyTorch was not measured, or, when
/// its figures come from another GPU than ours, which.
pub fn pytorch_note(r: &Report) -> Option<String> {
    match &r.pytorch {
        None => Some(PYTORCH_NOT_MEASURED.to_string()),
        Some(p) if p.device_name != r.device_name => Some(format!(
            "(PyTorch's figures are from {}, this run's from {}: not the same GPU)",
            p.device_name, r.device_name
        )),
        Some(_) => None,
    }
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
