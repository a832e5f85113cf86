//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-10 --features exercises`.

use anyhow::Result;

use labs_core::Tensor;
use labs_train::model::Batch;
use labs_train::{OptimizerKind, TrainConfig, Trainer};

// ANCHOR: exercise_accumulate
/// Exercise 1: gradient accumulation. Run forward and backward on each micro-batch so
/// that the parameters' `.grad` end up those of one batch made of all of them
/// (`Trainer::micro_batch(batch, divisor)` divides the loss by `divisor` before
/// backward; gradients add up in `.grad`). Return the mean loss over the micro-batches
/// (`None` when `micro_batch` returns `None`, on the dry-run device). Do not step the
/// optimizer.
pub fn accumulate(trainer: &mut Trainer, batches: &[Batch]) -> Result<Option<f64>> {
    let _ = (trainer, batches);
    todo!("one micro_batch per batch, each loss divided by the number of batches")
}
// ANCHOR_END: exercise_accumulate

// ANCHOR: exercise_state
/// Exercise 2: the bytes an optimizer's state holds after `steps_done` steps, for
/// float32 parameters of `param_numels` elements each (SGD without momentum, Adam and
/// AdamW with their float32 moments). Each state tensor is one allocation, rounded as
/// the allocator rounds (`labs_core::alloc::round_size(bytes, 0)`). Mind when the
/// state is created.
pub fn optimizer_state_bytes(
    optimizer: OptimizerKind,
    param_numels: &[usize],
    steps_done: usize,
) -> u64 {
    let _ = (optimizer, param_numels, steps_done);
    todo!("what each optimizer keeps per parameter, and from which step")
}
// ANCHOR_END: exercise_state

// ANCHOR: exercise_largest_batch
/// Exercise 3: the largest micro-batch, from 1 to `max_batch`, with which a run of
/// `config` fits a GPU of `capacity` bytes, or `None` when not even a batch of 1 fits.
/// Ask the dry run, which allocates as the GPU would without running a kernel:
/// `labs_train::run(&config, &labs_core::Device::new_dry(capacity))` returns a report
/// whose `oom` is `Some` when the run did not fit. A larger batch never needs less
/// memory, so a bisection takes a handful of dry runs. Then compare `config` with and
/// without `checkpoint: CheckpointMode::Layers`.
pub fn largest_batch(
    config: &TrainConfig,
    capacity: u64,
    max_batch: usize,
) -> Result<Option<usize>> {
    let _ = (config, capacity, max_batch);
    todo!("bisect on the batch, each candidate tried on a fresh dry device")
}
// ANCHOR_END: exercise_largest_batch

// ANCHOR: exercise_attention_saving
/// Exercise 4: the activation bytes one float32 self-attention call over `[batch, seq,
/// d_model]` with `heads` heads saves less when the fused kernel serves it than on the
/// math path (`--attention naive`), in an encoder layer without dropout, each tensor
/// one allocation rounded as the allocator rounds
/// (`labs_core::alloc::round_size(bytes, 0)`). Find out which saved tensors differ
/// between the two paths, and how large each is, before writing the sum.
pub fn fused_attention_saving(batch: usize, heads: usize, seq: usize, d_model: usize) -> u64 {
    let _ = (batch, heads, seq, d_model);
    todo!("the math path's saved tensors less the fused kernel's")
}
// ANCHOR_END: exercise_attention_saving

// ANCHOR: exercise_checkpoint
/// A region of the forward pass: a function of its inputs, kept for the recomputation.
pub type Region = std::sync::Arc<dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync>;

/// Exercise 5: activation checkpointing, built as PyTorch builds
/// `checkpoint(fn, *inputs, use_reentrant=False)`: run `region(inputs)` so that the
/// tensors its ops save for backward are not kept, and make them again from `inputs`
/// the first time backward asks for one. The gradients must be those of the region
/// run plainly, dropout included, and the peak no higher than the library's
/// `labs_core::autograd::checkpoint`. The tools: saved-tensor hooks
/// (`labs_core::autograd::saved_tensors_hooks(pack, unpack)`: while its guard lives,
/// every tensor an op saves goes through `pack`, and backward hands what `pack`
/// returned to `unpack`); the device's generator (`Device::rng_state`,
/// `Device::set_rng_state`); and `labs_core::tensor::enable_grad`.
pub fn checkpointed(region: Region, inputs: &[Tensor]) -> Result<Tensor> {
    let _ = (region, inputs);
    todo!("pack a position, unpack by running the region again")
}
// ANCHOR_END: exercise_checkpoint
