//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-04 --features exercises`.

use labs_core::{Device, Result, Tensor};

// ANCHOR: exercise_scatter
/// Exercise 1: DataParallel's scatter. Split `batch` along its first dimension into
/// chunks of `ceil(n / devices.len())` rows (`torch.chunk`: the last may be smaller,
/// and a short batch gives fewer chunks than devices), chunk `i` on `devices[i]`.
pub fn scatter(batch: &Tensor, devices: &[Device]) -> Result<Vec<Tensor>> {
    let _ = (batch, devices);
    todo!("narrow the batch into chunks and move chunk i to device i")
}
// ANCHOR_END: exercise_scatter

// ANCHOR: exercise_gather
/// Exercise 2: DataParallel's gather. The outputs, in order, concatenated along their
/// first dimension on `device`.
pub fn gather(outputs: &[Tensor], device: &Device) -> Result<Tensor> {
    let _ = (outputs, device);
    todo!("move every output to the device, then concatenate them")
}
// ANCHOR_END: exercise_gather

// ANCHOR: exercise_buckets
/// Exercise 3: DDP's buckets, for parameters of one dtype. `bytes[i]` is the size of
/// parameter `i`'s gradient, in registration order. Walk the parameters in *reverse*
/// order, adding each to the open bucket unless that would take the bucket past its cap
/// (`first_cap` for the first bucket, `cap` for every later one), in which case it
/// opens the next bucket; a parameter larger than the cap gets a bucket of its own.
/// Return each bucket's parameter indices, in bucket order.
pub fn buckets(bytes: &[usize], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let _ = (bytes, first_cap, cap);
    todo!("walk the parameters from the last to the first, opening a bucket when full")
}
// ANCHOR_END: exercise_buckets
