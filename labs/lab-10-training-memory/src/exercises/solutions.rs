//! Reference solutions of the exercises (see `starter.rs` for the statements).

use anyhow::Result;
use labs_core::alloc::round_size;

use labs_train::model::Batch;
use labs_train::{OptimizerKind, TrainConfig, Trainer};

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

// ANCHOR: solution_largest_batch
/// Exercise 3: the largest batch that fits, by bisection over dry runs.
pub fn largest_batch(
    config: &TrainConfig,
    capacity: u64,
    max_batch: usize,
) -> Result<Option<usize>> {
    let fits = |batch: usize| -> Result<bool> {
        let c = TrainConfig {
            batch,
            ..config.clone()
        };
        let report = labs_train::run(&c, &labs_core::Device::new_dry(capacity))?;
        Ok(report.oom.is_none())
    };
    if max_batch == 0 || !fits(1)? {
        return Ok(None);
    }
    // fits(lo) and, unless lo == max_batch, !fits(hi).
    let (mut lo, mut hi) = (1, max_batch + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
}
// ANCHOR_END: solution_largest_batch

// ANCHOR: solution_attention_saving
/// Exercise 4: O(seq²) probabilities against O(seq) log-sum-exps; the scaled copy of
/// the query the math path keeps against the output the fused kernel keeps (one
/// activation each: they cancel).
pub fn fused_attention_saving(batch: usize, heads: usize, seq: usize, d_model: usize) -> u64 {
    let rows = (batch * heads * seq) as u64;
    let probabilities = round_size(4 * rows * seq as u64, 0);
    let log_sum_exp = round_size(4 * rows, 0);
    let scaled_query = round_size((4 * batch * seq * d_model) as u64, 0);
    // At batch 1 the permuted output is already dense: `out_proj` reads it in place.
    let fused_output = if batch > 1 { scaled_query } else { 0 };
    probabilities - log_sum_exp + scaled_query - fused_output
}
// ANCHOR_END: solution_attention_saving
