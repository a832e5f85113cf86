//! Reference solutions to the exercises in `starter.rs`.

use labs_core::oom_report::Suggestion;
use labs_core::optim::Optimizer;
use labs_core::snapshot::{BlockState, Snapshot};
use labs_core::{Device, Result};

use super::Accounting;
use crate::model::{train_run, MlpSpec, Trainer};

pub fn step_or_halve(trainer: &mut Trainer, mut batch: usize) -> Result<usize> {
    let device = trainer.model_device();
    let alloc = device.allocator()?;
    loop {
        match trainer.step(batch) {
            Ok(()) => return Ok(batch),
            Err(e) if e.is_out_of_memory() && batch > 1 => {
                trainer.optimizer.zero_grad(true)?;
                alloc.empty_cache()?;
                batch /= 2;
            }
            Err(e) => return Err(e),
        }
    }
}

pub fn largest_fitting(max: usize, mut fits: impl FnMut(usize) -> bool) -> usize {
    let (mut good, mut batch) = (0, 1.min(max));
    let bad = loop {
        if batch == 0 {
            return 0;
        }
        if !fits(batch) {
            break batch;
        }
        good = batch;
        if batch == max {
            return good;
        }
        batch = (batch * 2).min(max);
    };
    let mut bad = bad;
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

pub fn fits_on(capacity: u64, spec: MlpSpec, batch: usize, steps: usize) -> Result<bool> {
    let dry = Device::new_dry(capacity);
    match train_run(&dry, spec, batch, steps) {
        Ok(()) => Ok(true),
        Err(e) if e.is_out_of_memory() => Ok(false),
        Err(e) => Err(e),
    }
}

pub fn account(snapshot: &Snapshot) -> Accounting {
    let mut a = Accounting::default();
    // A snapshot shows an expandable segment as one segment per run of mapped pages, so
    // the segments' sizes are what the driver gave, and a free range split by unmapped
    // pages is two pieces.
    for segment in &snapshot.segments {
        a.reserved += segment.total_size;
        for block in &segment.blocks {
            match block.state {
                BlockState::ActiveAllocated => {
                    a.allocated += block.size;
                    if block.category.as_deref() == Some("activation") {
                        a.activations += block.size;
                    }
                }
                BlockState::Inactive => {
                    a.free_pieces += 1;
                    a.largest_free = a.largest_free.max(block.size);
                }
                // Freed, but another stream may still use it: neither allocated nor a
                // piece a request can take. It is reserved, and so counts as cached.
                BlockState::ActivePendingFree => {}
            }
        }
    }
    a
}

pub fn diagnose(figures: &Accounting, requested: u64, capacity: u64, fraction: f64) -> Suggestion {
    if requested > capacity {
        Suggestion::RequestExceedsDevice
    } else if figures.cached() >= requested && figures.largest_free < requested {
        Suggestion::ExpandableSegments
    } else if fraction < 1.0 && figures.allocated + requested <= capacity {
        Suggestion::RaiseMemoryFraction
    } else if figures.activations > 0 && figures.activations * 2 >= figures.allocated {
        Suggestion::CheckpointOrSmallerBatch
    } else {
        Suggestion::FreeOrSmallerBatch
    }
}
