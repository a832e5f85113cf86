//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-09 --features exercises`.

use labs_core::{Result, Tensor};

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
