//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-06 --features exercises`.

use std::time::Duration;

use labs_core::{Device, Result, Stream, Tensor};

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
