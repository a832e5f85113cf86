//! Experiment 1: full against mixed precision. The same model and batch trained in
//! float32, under autocast to bfloat16, and under autocast to float16 with a gradient
//! scaler: the peak of memory allocated during a step (after a first step has made
//! Adam's state) and the median step time.

use std::time::Instant;

use labs_core::table::Table;
use labs_core::{Device, Result};

use crate::mib;
use crate::model::{batch, Precision, Sizes, Trainer};

/// One precision's measurement.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub precision: Precision,
    /// Allocated before the step: parameters and Adam's state.
    pub before: u64,
    /// The most allocated during a step.
    pub peak: u64,
    pub step_ms: f64,
    pub loss: f32,
}

// ANCHOR: measure
/// Two warm-up steps, then the peak of one step and the median time of `steps`.
pub fn measure_one(device: &Device, s: Sizes, precision: Precision, steps: usize) -> Result<Row> {
    let alloc = device.allocator()?;
    let mut t = Trainer::new(device, s, precision, 1)?;
    let (x, y) = batch(device, s, 0)?;
    for _ in 0..2 {
        t.step(&x, &y)?;
    }
    device.synchronize()?;
    let before = alloc.memory_allocated();
    alloc.reset_peak_stats();
    let mut loss = t.step(&x, &y)?;
    let peak = alloc.max_memory_allocated();
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps.max(1) {
        device.synchronize()?;
        let start = Instant::now();
        loss = t.step(&x, &y)?; // `item` waits for the step
        times.push(start.elapsed());
    }
    let step = labs_core::timing::median(&mut times);
    Ok(Row {
        precision,
        before,
        peak,
        step_ms: step.as_secs_f64() * 1e3,
        loss,
    })
}
// ANCHOR_END: measure

pub fn measure(device: &Device, s: Sizes, steps: usize) -> Result<Vec<Row>> {
    Precision::ALL
        .iter()
        .map(|&p| measure_one(device, s, p, steps))
        .collect()
}

pub fn table(device: &Device, s: Sizes, rows: &[Row]) -> Table {
    let mut t = Table::new(
        format!(
            "1. Full against mixed precision on {device}: an MLP {} wide ({} hidden layers), \
             batch {}, Adam; memory in MiB, median step time",
            s.width, s.hidden_layers, s.batch
        ),
        &[
            "precision",
            "allocated between steps",
            "peak during a step",
            "peak / float32's",
            "step (ms)",
            "loss",
        ],
    );
    let base = rows.first().map_or(1, |r| r.peak.max(1));
    for r in rows {
        t.row([
            r.precision.name().to_string(),
            mib(r.before),
            mib(r.peak),
            format!("{:.2}", r.peak as f64 / base as f64),
            format!("{:.2}", r.step_ms),
            format!("{:.4}", r.loss),
        ]);
    }
    t
}
