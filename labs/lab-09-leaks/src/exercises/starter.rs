//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-09 --features exercises`.

use labs_core::alloc::LiveBlock;
use labs_core::{Result, Tensor};

use super::Growth;
use crate::model::Mlp;

// ANCHOR: exercise_eval
/// Exercise 1: the mean loss of `model` over `batches`, in a pass whose peak memory
/// stays at one batch's activations, two layers at a time: nothing is saved for a
/// backward pass that will never run.
pub fn evaluate(model: &Mlp, batches: &[Tensor]) -> Result<f32> {
    let _ = (model, batches);
    todo!("the loop of 'An evaluation pass', with what turns recording off around it")
}
// ANCHOR_END: exercise_eval

// ANCHOR: exercise_log
/// Exercise 2: each batch's loss as a one-element device tensor for the log, keeping
/// neither the graph nor anything it saved: the list must hold one small block per
/// loss.
pub fn log_losses(model: &Mlp, batches: &[Tensor]) -> Result<Vec<Tensor>> {
    let _ = (model, batches);
    todo!("find the leak: what does a loss tensor keep, and what gives the same value without it?")
}
// ANCHOR_END: exercise_log

// ANCHOR: exercise_bytes
/// Exercise 3: the bytes a graph retains: walk every node reachable from `t.grad_fn()`
/// (through `Edge::Node` inputs, each node once) and add up the storages of the
/// tensors they saved, each storage once (`allocation().ptr()` names it,
/// `allocation().requested()` is its size). Released nodes (`saved` is `None`) add
/// nothing.
pub fn graph_bytes(t: &Tensor) -> u64 {
    let _ = t;
    todo!("a depth-first walk with a set of visited nodes and a set of storages")
}
// ANCHOR_END: exercise_bytes

// ANCHOR: exercise_growth
/// Exercise 4: a leak detector. `before` and `after` are the allocator's live blocks
/// (`Allocator::live_blocks`) at two points of a loop, taken with the memory history
/// recording backtraces. Attribute the change between them to the sites that made the
/// blocks: for each [`Site`](super::Site) (a block's origin and its category), the
/// blocks that are alive `after` and were not `before`, the blocks that were alive
/// `before` and are gone `after`, and the net bytes. Return one [`Growth`] per site
/// that has a new or a freed block, the largest net growth first, ties in the order
/// of `Site`. The net bytes of the whole report must equal the change of
/// `memory_allocated` between the two points.
pub fn attribute_growth(before: &[LiveBlock], after: &[LiveBlock]) -> Vec<Growth> {
    let _ = (before, after);
    todo!(
        "which field names one block across both lists, once the cache \
         has handed a freed block's address out again?"
    )
}
// ANCHOR_END: exercise_growth
