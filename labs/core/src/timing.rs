//! Timing helpers for the labs' tables: repeat, take the median. Device work is timed
//! either with events or by synchronising before reading the clock, never otherwise.

use std::time::{Duration, Instant};

// ANCHOR: median_of
/// The median of `samples` runs of `f`, after `warmup` untimed runs.
pub fn median_of<E>(
    warmup: usize,
    samples: usize,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<Duration, E> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(samples.max(1));
    for _ in 0..samples.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed());
    }
    Ok(median(&mut times))
}
// ANCHOR_END: median_of

pub fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// Chooses a `spin_` iteration count that keeps `x`'s device busy for about `target` on
/// `stream`. It times with events, so that only the kernel is measured, not the host.
pub fn calibrate_spin(
    x: &crate::Tensor,
    stream: &crate::Stream,
    target: Duration,
) -> crate::Result<u32> {
    let device = x.device();
    let (begin, end) = (device.new_event()?, device.new_event()?);
    let mut iterations = 16u32;
    loop {
        stream.record(&begin)?;
        x.spin_on(iterations, stream)?;
        stream.record(&end)?;
        end.synchronize()?;
        let took = Duration::from_secs_f64(begin.elapsed_ms(&end)? as f64 / 1e3);
        if took >= target / 8 || iterations >= 1 << 24 {
            let scale = target.as_secs_f64() / took.as_secs_f64().max(1e-9);
            return Ok(((iterations as f64 * scale) as u32).clamp(1, 1 << 28));
        }
        iterations *= 4;
    }
}
