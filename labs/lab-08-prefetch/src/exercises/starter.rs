//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-08 --features exercises`.

use std::time::Duration;

use labs_core::{Device, Result, Stream, Tensor};

// ANCHOR: exercise_upload
/// Exercise 1: copy `data` to `device` without blocking the host: the call must
/// return before `stream` has run the copy. (Hint: `PinnedTensor`.)
pub fn upload_async(data: &[f32], device: &Device, stream: &Stream) -> Result<Tensor> {
    let _ = (data, device, stream);
    todo!("a copy that is only queued: which host memory allows that ('pin_memory()')?")
}
// ANCHOR_END: exercise_upload

// ANCHOR: exercise_step
/// Exercise 2: the time of one training step whose batch copy takes `copy` and whose
/// kernel takes `compute`, without and with a prefetcher.
pub fn expected_step(copy: Duration, compute: Duration, prefetch: bool) -> Duration {
    let _ = (copy, compute, prefetch);
    todo!("a step's time in each of the two timelines of chapter 8's 'A prefetching loader'")
}
// ANCHOR_END: exercise_step

// ANCHOR: exercise_in_flight
/// Exercise 3: the most pinned memory the worker queues of a `HostLoader` can hold:
/// each of `workers` queues holds `prefetch_depth / workers` batches (rounded up, at
/// least one), each in a block of the host allocator's size class for `batch_bytes`.
pub fn pinned_bytes_in_flight(batch_bytes: usize, workers: usize, prefetch_depth: usize) -> usize {
    let _ = (batch_bytes, workers, prefetch_depth);
    todo!("bytes: batches the queues can hold, each in a block of the pinned allocator's sizes")
}
// ANCHOR_END: exercise_in_flight
