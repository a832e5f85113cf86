//! Why timing GPU work with a host clock and no synchronisation lies: a kernel launch
//! returns as soon as the work is queued, long before it has run.

use std::time::{Duration, Instant};

use labs_core::format::duration;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

pub struct AsyncTiming {
    pub iterations: u32,
    pub without_sync: Duration,
    pub with_sync: Duration,
    pub events: Duration,
}

/// Chooses a `spin_` iteration count that keeps `x`'s device busy for about `target`
/// (timed with events on the default stream, so that only the kernel is measured).
pub fn calibrate(x: &Tensor, target: Duration) -> Result<u32> {
    labs_core::timing::calibrate_spin(x, &x.device().default_stream()?, target)
}

// ANCHOR: async_timing
/// Times the same kernel three ways.
pub fn measure(device: &Device, target: Duration) -> Result<AsyncTiming> {
    let x = Tensor::zeros(&[1 << 20], DType::F32, device)?;
    let iterations = calibrate(&x, target)?;

    // Wrong: the clock stops when the launch returns, not when the work ends.
    let start = Instant::now();
    x.spin_(iterations)?;
    let without_sync = start.elapsed();
    device.synchronize()?;

    // Right: wait for the device before reading the clock.
    let start = Instant::now();
    x.spin_(iterations)?;
    device.synchronize()?;
    let with_sync = start.elapsed();

    // Also right, and without the host in the measurement: events on the stream.
    let stream = device.default_stream()?;
    let (begin, end) = (device.new_event()?, device.new_event()?);
    stream.record(&begin)?;
    x.spin_(iterations)?;
    stream.record(&end)?;
    end.synchronize()?;
    let events = Duration::from_secs_f64(begin.elapsed_ms(&end)? as f64 / 1e3);
    // ANCHOR_END: async_timing

    Ok(AsyncTiming {
        iterations,
        without_sync,
        with_sync,
        events,
    })
}

pub fn table(device: &Device, m: &AsyncTiming) -> Table {
    let mut t = Table::new(
        format!(
            "Timing one kernel on {device} ({} dependent multiply-adds per element, 1M elements)",
            m.iterations
        ),
        &["method", "measured"],
    );
    t.row([
        "host clock, no synchronize (wrong)",
        &duration(m.without_sync),
    ]);
    t.row([
        "host clock around launch + synchronize",
        &duration(m.with_sync),
    ]);
    t.row(["events recorded on the stream", &duration(m.events)]);
    t
}
