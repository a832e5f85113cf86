//! Reference solutions of the exercises (see `starter.rs` for the statements).

use anyhow::Result;
use labs_core::alloc::round_size;

use crate::train::model::Batch;
use crate::train::{OptimizerKind, Trainer};

// ANCHOR: solution_accumulate
/// Exercise 1: gradient accumulation.
pub fn accumulate(trainer: &mut Trainer, batches: &[Batch]) -> Result<Option<f64>> {
    let k = batches.len();
    let mut total = Some(0.0);
    for batch in batches {
        let loss = trainer.micro_batch(batch, k)?;
        total = total.zip(loss).map(|(a, b)| a + b);
    }
    Ok(total)
}
// ANCHOR_END: solution_accumulate

// ANCHOR: solution_state
/// Exercise 2: the optimizer's state in bytes.
pub fn optimizer_state_bytes(
    optimizer: OptimizerKind,
    param_numels: &[usize],
    steps_done: usize,
) -> u64 {
    let tensors_per_param = match optimizer {
        _ if steps_done == 0 => 0,
        OptimizerKind::Adam | OptimizerKind::Adamw => 2,
        OptimizerKind::Sgd => 0,
    };
    param_numels
        .iter()
        .map(|&n| tensors_per_param * round_size(4 * n as u64, 0))
        .sum()
}
// ANCHOR_END: solution_state
