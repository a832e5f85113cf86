//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-01 --features exercises`.

use std::time::Duration;

use labs_core::{DType, Device, Result, Tensor};

// ANCHOR: exercise_bytes
/// Exercise 1: how many bytes of device memory a tensor of this shape and dtype needs.
/// (Hint: `DType::size`.)
pub fn bytes_needed(shape: &[usize], dtype: DType) -> usize {
    let _ = (shape, dtype);
    todo!("multiply the dimensions and the element size")
}
// ANCHOR_END: exercise_bytes

// ANCHOR: exercise_add
/// Exercise 2: `a + b` where `b` may live on another device. The result lives on
/// `a`'s device, and `b` is only copied when it has to be.
pub fn add_on_device_of(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _ = (a, b);
    todo!("move b to a's device with to(), then add")
}
// ANCHOR_END: exercise_add

// ANCHOR: exercise_time
/// Exercise 3: how long `work` keeps `device` busy, measured with the host clock,
/// correctly: the work it enqueues must be finished when the clock stops.
pub fn time_device_work(device: &Device, work: &mut dyn FnMut() -> Result<()>) -> Result<Duration> {
    let _ = (device, work);
    todo!("start a clock, run the work, synchronize, stop the clock")
}
// ANCHOR_END: exercise_time
