//! Stream priorities: when both streams have work waiting, the GPU's scheduler starts
//! thread blocks of the higher-priority stream first (lower numbers are higher, as in
//! CUDA). Running kernels are not pre-empted, so it matters only under load.

use std::time::Duration;

use labs_core::format::duration;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

pub struct Priorities {
    /// When the urgent kernel finished, measured from when the backlog was queued.
    pub urgent_low: Duration,
    pub urgent_high: Duration,
    pub backlog: Duration,
}

// ANCHOR: priorities
/// Fills a low-priority stream with a backlog of kernels that occupy the whole device,
/// then queues one urgent kernel on a second stream, once of equal and once of higher
/// priority, and times when it finishes.
pub fn measure(device: &Device, kernel: Duration, backlog: usize) -> Result<Priorities> {
    let low = device.backend().new_stream(0)?;
    // On a GPU the backlog must fill every multiprocessor; the simulator runs each
    // stream on its own thread and needs no more than a small kernel.
    let n = if device.is_cuda() {
        1 << 22
    } else {
        crate::SMALL
    };
    let big = Tensor::zeros(&[n], DType::F32, device)?;
    let iterations = labs_core::timing::calibrate_spin(&big, &low, kernel)?;
    let (small, small_iterations) = crate::busy_work(device, &low, kernel / 4)?;

    let urgent_after = |priority: i32| -> Result<(Duration, Duration)> {
        let urgent = device.backend().new_stream(priority)?;
        let (start, done, all) = (
            device.new_event()?,
            device.new_event()?,
            device.new_event()?,
        );
        low.record(&start)?;
        urgent.wait(&start)?;
        for _ in 0..backlog {
            big.spin_on(iterations, &low)?;
        }
        small.spin_on(small_iterations, &urgent)?;
        urgent.record(&done)?;
        low.record(&all)?;
        all.synchronize()?;
        done.synchronize()?;
        Ok((
            crate::event_duration(&start, &done)?,
            crate::event_duration(&start, &all)?,
        ))
    };
    let (urgent_low, backlog_time) = urgent_after(0)?;
    let (urgent_high, _) = urgent_after(-1)?;
    // ANCHOR_END: priorities
    Ok(Priorities {
        urgent_low,
        urgent_high,
        backlog: backlog_time,
    })
}

pub fn table(device: &Device, m: &Priorities) -> Table {
    let mut t = Table::new(
        format!("An urgent kernel behind a backlog on another stream of {device}"),
        &["urgent stream", "urgent kernel done after"],
    );
    t.row(["same priority (0)", &duration(m.urgent_low)]);
    t.row(["higher priority (-1)", &duration(m.urgent_high)]);
    t.row(["(whole backlog)", &duration(m.backlog)]);
    t
}
