//! Reference solutions of the exercises (see `starter.rs` for the statements).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use labs_core::alloc::round_size;
use labs_core::autograd::saved_tensors_hooks;
use labs_core::tensor::{enable_grad, Packed};
use labs_core::Tensor;

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

// ANCHOR: solution_checkpoint
/// A region of the forward pass: a function of its inputs, kept for the recomputation.
pub type Region = Arc<dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync>;

/// Exercise 5: a checkpointed region from saved-tensor hooks. In forward, `pack`
/// keeps a position; the first `unpack` runs the region again from its inputs, with
/// the generator put back where the forward found it and recording on, under hooks
/// that keep what it saves by position; each `unpack` then takes its tensor out, so
/// that backward frees it once used.
pub fn checkpointed(region: Region, inputs: &[Tensor]) -> Result<Tensor> {
    let device = inputs
        .first()
        .ok_or_else(|| anyhow::anyhow!("checkpointed: a region needs an input"))?
        .device()
        .clone();
    let rng = device.rng_state();
    let kept: Vec<(Tensor, bool)> = (inputs.iter())
        .map(|t| (t.detach(), t.requires_grad()))
        .collect();
    let saved = Arc::new(AtomicUsize::new(0));
    let recomputed: Arc<Mutex<Option<HashMap<usize, Tensor>>>> = Arc::new(Mutex::new(None));
    let pack = {
        let saved = saved.clone();
        move |_: &Tensor| -> labs_core::Result<Packed> {
            Ok(Box::new(saved.fetch_add(1, Ordering::SeqCst)))
        }
    };
    let again = region.clone();
    let unpack = move |packed: &Packed| -> labs_core::Result<Tensor> {
        let position = *packed
            .downcast_ref::<usize>()
            .expect("a position this pack made");
        if recomputed.lock().unwrap().is_none() {
            let made = Arc::new(Mutex::new(HashMap::new()));
            let next = Arc::new(AtomicUsize::new(0));
            let now = device.rng_state();
            device.set_rng_state(rng);
            let result = {
                let _recording = enable_grad();
                let (made, next) = (made.clone(), next.clone());
                let _hooks = saved_tensors_hooks(
                    move |t: &Tensor| -> labs_core::Result<Packed> {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        made.lock().unwrap().insert(i, t.detach());
                        Ok(Box::new(()))
                    },
                    |_: &Packed| -> labs_core::Result<Tensor> {
                        Err(labs_core::Error::InvalidArgument(
                            "the recomputation is not differentiated".into(),
                        ))
                    },
                );
                let xs: Vec<Tensor> = (kept.iter())
                    .map(|(t, grad)| t.detach().requires_grad_(*grad))
                    .collect();
                again(&xs)
            };
            device.set_rng_state(now);
            drop(result.map_err(|e| labs_core::Error::InvalidArgument(format!("{e:#}")))?);
            let made = std::mem::take(&mut *made.lock().unwrap());
            *recomputed.lock().unwrap() = Some(made);
        }
        let mut recomputed = recomputed.lock().unwrap();
        (recomputed.as_mut().and_then(|m| m.remove(&position))).ok_or_else(|| {
            labs_core::Error::InvalidArgument(format!(
                "checkpointed: the recomputation saved no tensor {position}"
            ))
        })
    };
    let _hooks = saved_tensors_hooks(pack, unpack);
    region(inputs)
}
// ANCHOR_END: solution_checkpoint
