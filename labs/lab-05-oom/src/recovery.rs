//! Experiment 4: recovering from out-of-memory in a training loop. A model and Adam
//! under a memory budget; the loop tries a batch too large, catches the error, drops
//! what the failed step held (its tensors go with the step's scope; the gradients it
//! had already accumulated are cleared), empties the cache and retries with half the
//! batch, until a step succeeds. Memory after each failure is back at the baseline:
//! the model and its optimizer state.

use labs_core::format::bytes;
use labs_core::optim::Optimizer;
use labs_core::table::Table;
use labs_core::{Device, Result};

use crate::mib;
use crate::model::{MlpSpec, Trainer};

/// The memory a run may use above its baseline, and the first batch it tries.
pub fn budget(device: &Device) -> (u64, usize) {
    if device.is_cuda() {
        (256 << 20, 32768)
    } else {
        (32 << 20, 8192)
    }
}

#[derive(Debug, Clone)]
pub struct Attempt {
    pub batch: usize,
    pub ok: bool,
    /// `memory_allocated` and `memory_reserved` after the attempt (and, after a
    /// failure, after the clean-up).
    pub allocated: u64,
    pub reserved: u64,
}

#[derive(Debug, Clone)]
pub struct Recovery {
    /// The model and optimizer state, after one small step created the state.
    pub baseline: u64,
    pub limit: u64,
    pub attempts: Vec<Attempt>,
}

// ANCHOR: recover
/// One step of `batch`, halving it after each out-of-memory error until a step fits.
/// Returns the batch that ran, and each attempt.
pub fn step_with_recovery(trainer: &mut Trainer, mut batch: usize) -> Result<Vec<Attempt>> {
    let device = trainer.model_device();
    let alloc = device.allocator()?;
    let mut attempts = Vec::new();
    loop {
        let result = trainer.step(batch); // the step's tensors are dropped here, Ok or Err
        let ok = match result {
            Ok(()) => true,
            Err(e) if e.is_out_of_memory() && batch > 1 => {
                trainer.optimizer.zero_grad(true)?; // gradients the failed backward left
                alloc.empty_cache()?; // hand the failed step's cache back
                false
            }
            Err(e) => return Err(e),
        };
        attempts.push(Attempt {
            batch,
            ok,
            allocated: alloc.memory_allocated(),
            reserved: alloc.memory_reserved(),
        });
        if ok {
            return Ok(attempts);
        }
        batch /= 2;
    }
}
// ANCHOR_END: recover

/// The experiment on the device's own allocator, capped at the baseline plus the
/// budget for its duration.
pub fn run(device: &Device, spec: MlpSpec) -> Result<Recovery> {
    let (budget, first) = budget(device);
    let alloc = device.allocator()?;
    let mut trainer = Trainer::new(device, spec)?;
    trainer.step(8)?; // Adam's state exists from the first step on
    alloc.empty_cache()?;
    let baseline = alloc.memory_allocated();
    let limit = alloc.memory_reserved() + budget;
    let total = device.mem_info()?.total;
    alloc.set_memory_fraction(limit as f64 / total as f64)?;
    let attempts = step_with_recovery(&mut trainer, first);
    alloc.set_memory_fraction(1.0)?;
    Ok(Recovery {
        baseline,
        limit,
        attempts: attempts?,
    })
}

pub fn print(device: &Device, spec: MlpSpec, r: &Recovery) {
    println!("4. Recovering from out-of-memory in a training loop, on {device}");
    println!(
        "(an nn::Mlp {:?} with Adam; the device's allocator capped at {} with \
         set_memory_fraction: the baseline {} of model and optimizer state, plus a budget)\n",
        spec.sizes(),
        bytes(r.limit),
        bytes(r.baseline)
    );
    let mut t = Table::new(
        "Each attempt, and memory after it (after the clean-up when it failed)",
        &["batch", "step", "allocated MiB", "reserved MiB"],
    );
    for a in &r.attempts {
        t.row([
            a.batch.to_string(),
            if a.ok { "ran" } else { "out of memory" }.to_string(),
            mib(a.allocated),
            mib(a.reserved),
        ]);
    }
    println!("{t}");
    println!("Baseline (model and Adam state): {} MiB\n", mib(r.baseline));
}
