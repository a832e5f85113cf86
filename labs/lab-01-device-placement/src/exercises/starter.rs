//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-01 --features exercises`.

use std::time::Duration;

use labs_core::{DType, Device, Result, Tensor};

// ANCHOR: exercise_bytes
/// Exercise 1: how many bytes of device memory a tensor of this shape and dtype needs.
/// (Hint: `DType` knows the size of one element; a shape with no dimensions is a
/// scalar.)
pub fn bytes_needed(shape: &[usize], dtype: DType) -> usize {
    let _ = (shape, dtype);
    todo!("the data's size in bytes: what do the shape and the dtype each contribute?")
}
// ANCHOR_END: exercise_bytes

// ANCHOR: exercise_add
/// Exercise 2: `a + b` where `b` may live on another device. The result lives on
/// `a`'s device, and `b` is only copied when it has to be. (Hint: chapter 1's
/// section on `to()` says what it does when the tensor is already there.)
pub fn add_on_device_of(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _ = (a, b);
    todo!("a result on a's device; see 'One operation, one device' and what to() does")
}
// ANCHOR_END: exercise_add

// ANCHOR: exercise_time
/// Exercise 3: how long `work` keeps `device` busy, measured with the host clock,
/// correctly: the work it enqueues must be finished when the clock stops. (Hint:
/// `work` only enqueues; chapter 1's "Asynchronous execution" lists the calls that
/// wait for the device.)
pub fn time_device_work(device: &Device, work: &mut dyn FnMut() -> Result<()>) -> Result<Duration> {
    let _ = (device, work);
    todo!("the time until the device is done: 'Asynchronous execution' says when that is")
}
// ANCHOR_END: exercise_time
