//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-10 --features exercises`.

use anyhow::Result;

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
/// math path (`--attention naive`). The math path keeps the attention probabilities,
/// one `[batch, heads, seq, seq]` tensor, for the backward of softmax and of the product
/// with V; the fused kernel keeps instead each row's log-sum-exp, one `[batch, heads,
/// seq]` float32 tensor, and recomputes the probabilities in backward. Two more
/// differences, each a `[batch, seq, d_model]` float32 tensor: the math path keeps the
/// query scaled by `1/sqrt(head_dim)` for the product's backward; the fused kernel
/// keeps its output for its own backward, where the math path's output is dropped once
/// PyTorch's layout has copied it into the dense input of `out_proj` (which both keep;
/// at batch 1 the fused output is already laid out as that input, and is not copied).
/// Everything else saved is the same. Each tensor is one allocation, rounded as the
/// allocator rounds (`labs_core::alloc::round_size(bytes, 0)`).
pub fn fused_attention_saving(batch: usize, heads: usize, seq: usize, d_model: usize) -> u64 {
    let _ = (batch, heads, seq, d_model);
    todo!("the probabilities' bytes less the log-sum-exp's, plus the scaled query's")
}
// ANCHOR_END: exercise_attention_saving
