//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-04 --features exercises`.

use labs_core::{Device, Result, Tensor};

// ANCHOR: exercise_scatter
/// Exercise 1: DataParallel's scatter. Split `batch` along its first dimension as
/// `torch.chunk(batch, len(devices))` does, and put chunk `i` on `devices[i]`.
pub fn scatter(batch: &Tensor, devices: &[Device]) -> Result<Vec<Tensor>> {
    let _ = (batch, devices);
    todo!(
        "torch.chunk's documentation: how many rows a chunk has, \
         and how many chunks a short batch gives"
    )
}
// ANCHOR_END: exercise_scatter

// ANCHOR: exercise_gather
/// Exercise 2: DataParallel's gather. The outputs, in order, concatenated along their
/// first dimension on `device`.
pub fn gather(outputs: &[Tensor], device: &Device) -> Result<Tensor> {
    let _ = (outputs, device);
    todo!(
        "which Tensor function joins tensors along a dimension, \
         and what does it ask of their devices?"
    )
}
// ANCHOR_END: exercise_gather

// ANCHOR: exercise_buckets
/// Exercise 3: DDP's buckets, for parameters of one dtype. `bytes[i]` is the size of
/// parameter `i`'s gradient, in registration order. Return the buckets in the order
/// backward fills them, each as its parameters' indices. Every bucket holds parameters
/// that follow each other in the order their gradients arrive, and is closed when the
/// next one would take it past its cap (`first_cap` for the first bucket, `cap` for the
/// others); a parameter larger than the cap has a bucket of its own.
pub fn buckets(bytes: &[usize], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let _ = (bytes, first_cap, cap);
    todo!("'Buckets, reverse order, and overlap' works out a model's buckets by hand")
}
// ANCHOR_END: exercise_buckets
