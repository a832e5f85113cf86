//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-05 --features exercises`.

use labs_core::oom_report::Suggestion;
use labs_core::snapshot::Snapshot;
use labs_core::Result;

use super::Accounting;
use crate::model::{MlpSpec, Trainer};

// ANCHOR: exercise_halve
/// Exercise 1: one training step of `batch`, halving the batch after each
/// out-of-memory error until a step runs; returns the batch that ran. After a failure
/// nothing of the failed step may stay: no gradient on a parameter, no cached block
/// (`memory_allocated` back at the model and optimizer state). Any other error, or
/// out-of-memory at a batch of 1, is returned.
pub fn step_or_halve(trainer: &mut Trainer, batch: usize) -> Result<usize> {
    let _ = (trainer, batch);
    todo!("the loop of 'Recovering in a training loop': catch, clean up, halve, retry")
}
// ANCHOR_END: exercise_halve

// ANCHOR: exercise_finder
/// Exercise 2: the largest batch in `1..=max` for which `fits(batch)` is true, for a
/// `fits` that is true up to some batch and false after it: double from 1 until it is
/// false (or `max` is reached), then binary search between the last true and the first
/// false. At most about 2·log2(max) calls.
pub fn largest_fitting(max: usize, fits: impl FnMut(usize) -> bool) -> usize {
    let _ = (max, fits);
    todo!("doubling, then a binary search keeping `good` (fits) and `bad` (does not)")
}
// ANCHOR_END: exercise_finder

// ANCHOR: exercise_dry
/// Exercise 3: whether `steps` training steps of `batch` samples fit on a GPU of
/// `capacity` bytes, decided on a dry-run device of that size (`Device::new_dry`):
/// `Ok(false)` for out-of-memory, other errors returned.
pub fn fits_on(capacity: u64, spec: MlpSpec, batch: usize, steps: usize) -> Result<bool> {
    let _ = (capacity, spec, batch, steps);
    todo!("a dry-run device, one training run (model::train_run), and the error's kind")
}
// ANCHOR_END: exercise_dry

// ANCHOR: exercise_report
/// Exercise 4: the out-of-memory report, rebuilt from a snapshot. `snapshot` was taken
/// by an out-of-memory observer when a request failed for good; return the figures the
/// allocator's report gives for that failure.
pub fn account(snapshot: &Snapshot) -> Accounting {
    let _ = snapshot;
    todo!(
        "what each block state means (labs_core::snapshot::BlockState), \
         and what the report counts as a free piece ('How the report is built')"
    )
}

/// The suggestion those figures call for, for a request of `requested` bytes on a
/// device of `capacity` bytes under the memory fraction `fraction`: the first cause of
/// this list that holds.
///
/// 1. `RequestExceedsDevice`: the request alone is larger than the device.
/// 2. `ExpandableSegments`: at least the request is cached (reserved but unallocated),
///    and no free piece is as large as the request.
/// 3. `RaiseMemoryFraction`: a fraction below 1 is in force, and what is allocated
///    plus the request would fit the device.
/// 4. `CheckpointOrSmallerBatch`: activations hold at least half of the allocated
///    memory (and some memory).
/// 5. `FreeOrSmallerBatch`: none of these.
pub fn diagnose(figures: &Accounting, requested: u64, capacity: u64, fraction: f64) -> Suggestion {
    let _ = (figures, requested, capacity, fraction);
    todo!("'An out-of-memory error, explained' reads the same figures in this order")
}
// ANCHOR_END: exercise_report
