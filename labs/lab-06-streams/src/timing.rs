//! "Async looks free": a host clock around launches measures the launches, not the
//! work. Synchronising first, or timing with events, measures the work.

use std::time::{Duration, Instant};

use labs_core::format::duration;
use labs_core::table::Table;
use labs_core::{Device, Result};

pub struct Timing {
    pub kernels: usize,
    pub host_no_sync: Duration,
    pub host_sync: Duration,
    pub events: Duration,
}

// ANCHOR: timing
pub fn measure(device: &Device, kernel: Duration, kernels: usize) -> Result<Timing> {
    let stream = device.new_stream()?;
    let (x, iterations) = crate::busy_work(device, &stream, kernel)?;

    let t = Instant::now();
    for _ in 0..kernels {
        x.spin_on(iterations, &stream)?;
    }
    let host_no_sync = t.elapsed(); // only the launches
    stream.synchronize()?;

    let t = Instant::now();
    for _ in 0..kernels {
        x.spin_on(iterations, &stream)?;
    }
    stream.synchronize()?;
    let host_sync = t.elapsed();

    let (start, end) = (device.new_event()?, device.new_event()?);
    stream.record(&start)?;
    for _ in 0..kernels {
        x.spin_on(iterations, &stream)?;
    }
    stream.record(&end)?;
    end.synchronize()?;
    let events = crate::event_duration(&start, &end)?;
    // ANCHOR_END: timing
    Ok(Timing {
        kernels,
        host_no_sync,
        host_sync,
        events,
    })
}

pub fn table(device: &Device, m: &Timing) -> Table {
    let mut t = Table::new(
        format!("Timing {} kernels on one stream of {device}", m.kernels),
        &["method", "measured"],
    );
    t.row([
        "host clock, no synchronize (wrong)",
        &duration(m.host_no_sync),
    ]);
    t.row(["host clock + synchronize", &duration(m.host_sync)]);
    t.row(["events", &duration(m.events)]);
    t
}
