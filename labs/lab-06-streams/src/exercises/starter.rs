//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-06 --features exercises`.

use std::time::Duration;

use labs_core::device_id::DevicePtr;
use labs_core::{Device, Result, Stream, Tensor};

use super::StreamPool;

// ANCHOR: exercise_wait
/// Exercise 1: make everything enqueued on `consumer` from now on wait for everything
/// enqueued on `producer` so far, without blocking the host.
pub fn make_wait(device: &Device, producer: &Stream, consumer: &Stream) -> Result<()> {
    let _ = (device, producer, consumer);
    todo!("an ordering made on the device, not by the host: 'Waiting one stream on another'")
}
// ANCHOR_END: exercise_wait

// ANCHOR: exercise_events
/// Exercise 2: how long the work that `work` enqueues on `stream` takes on the device,
/// measured with events.
pub fn time_with_events(
    device: &Device,
    stream: &Stream,
    work: &mut dyn FnMut() -> Result<()>,
) -> Result<Duration> {
    let _ = (device, stream, work);
    todo!("the device's time between two points of the stream ('Events'), once it is known")
}
// ANCHOR_END: exercise_events

// ANCHOR: exercise_overlap
/// Exercise 3: spin `a` and `b` (`spin_on`) so that the two kernels can run at the
/// same time, and return when both are done.
pub fn spin_both(device: &Device, a: &Tensor, b: &Tensor, iterations: u32) -> Result<()> {
    let _ = (device, a, b, iterations);
    todo!("return once both are done; 'Overlap: one stream or two' says what lets them overlap")
}
// ANCHOR_END: exercise_overlap

// ANCHOR: exercise_stream_pool
impl StreamPool {
    /// Marks the live block at `ptr` as used by work on `stream` (PyTorch's
    /// `tensor.record_stream(stream)`), so that freeing it waits for that work.
    pub fn record_stream(&mut self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        let _ = (ptr, stream);
        todo!("which streams does a free have to wait for, and which one never?")
    }

    /// Gives the live block at `ptr` back: reusable at once by its own stream, or
    /// pending until the other streams that used it have done the work they had queued.
    /// An error for a pointer that is not a live block of the pool.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        let _ = ptr;
        todo!("how can the pool mark the point each of those streams has reached ('Events')?")
    }

    /// Moves every pending block whose streams have done that work to `free`.
    pub(super) fn process_events(&mut self) -> Result<()> {
        todo!("the 'host blocks?' column of the table in 'Events'")
    }
}
// ANCHOR_END: exercise_stream_pool
