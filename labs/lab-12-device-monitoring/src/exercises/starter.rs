//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-12 --features exercises`.

use std::time::Duration;

use super::Reading;

// ANCHOR: exercise_outside
/// Exercise 1: a leak outside the allocator. `readings` are taken at the same point of
/// each step of a loop. Return each step at which the process's memory outside the
/// caching allocator grew, as `(index of the reading, bytes it grew by)`, in order,
/// compared with the last earlier reading in which NVML listed the process. Readings
/// without the process's line are skipped; a step at which that memory shrank or stayed
/// the same is not listed.
pub fn outside_growth(readings: &[Reading]) -> Vec<(usize, u64)> {
    let _ = readings;
    todo!("which of the two figures holds the other, and what is the difference made of?")
}
// ANCHOR_END: exercise_outside

// ANCHOR: exercise_peak
/// Exercise 2: the peak between polls. A sampler calls `read` every `interval` on a
/// thread of its own and keeps the highest value since the last `take_peak`, so that a
/// program polling it now and then still learns how high memory went in between.
pub struct PeakSampler {
    // Your fields.
}

impl PeakSampler {
    /// Reads once before returning (so that a peak is always known), then starts the
    /// thread.
    pub fn start(interval: Duration, read: impl FnMut() -> u64 + Send + 'static) -> PeakSampler {
        let _ = (interval, read);
        todo!(
            "what must the caller's thread and the sampler's share, \
             and how do both update it safely?"
        )
    }

    /// The highest value read since the previous `take_peak` (or since `start`); the
    /// next window then starts from the latest value read.
    pub fn take_peak(&self) -> u64 {
        todo!("take and reset in one step, or a sample can fall between the two")
    }

    /// Stops the thread and waits for it; returns how many times `read` was called.
    /// `read` is not called after this returns.
    pub fn stop(self) -> u64 {
        todo!()
    }
}
// ANCHOR_END: exercise_peak
