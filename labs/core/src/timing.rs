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
