//! Reference solutions to the exercises in `starter.rs`.

use labs_core::optim::Optimizer;
use labs_core::{Device, Result};

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
