//! The small training loop `poll` runs while NVML is sampled: an `nn::Mlp` trained with
//! Adam on one random batch and a mean-squared-error loss, the shape of the PyTorch
//! program the chapter polls (four square layers, a batch of inputs).

use labs_core::nn::{Mlp, Module, Rng, Sequential};
use labs_core::optim::{Adam, Optimizer};
use labs_core::{Device, Result, Tensor};

/// The model's sizes: `layers` layers of `width` x `width`, a batch of `batch` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub width: usize,
    pub layers: usize,
    pub batch: usize,
}

impl Spec {
    /// The chapter's PyTorch program's sizes on a GPU; smaller on the simulated GPU,
    /// whose kernels run on the CPU.
    pub fn for_device(device: &Device) -> Spec {
        if device.is_cuda() {
            Spec {
                width: 2048,
                layers: 4,
                batch: 1024,
            }
        } else {
            Spec {
                width: 256,
                layers: 4,
                batch: 128,
            }
        }
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Backward,
    OptimizerStep,
}

pub struct Trainer {
    model: Sequential,
    optimizer: Adam,
    x: Tensor,
    y: Tensor,
}

impl Trainer {
    pub fn new(device: &Device, spec: Spec) -> Result<Trainer> {
        let sizes = vec![spec.width; spec.layers + 1];
        let model = Mlp::new(&sizes, &mut Rng::seeded(0), device)?;
        let optimizer = Adam::new(model.parameters(), 1e-3);
        Ok(Trainer {
            model,
            optimizer,
            x: Tensor::randn(&[spec.batch, spec.width], 1, device)?,
            y: Tensor::randn(&[spec.batch, spec.width], 2, device)?,
        })
    }

    // ANCHOR: poll_step
    /// One step; `observe` is called after each phase, where the PyTorch program reads
    /// `memory_allocated()`.
    pub fn step(&mut self, mut observe: impl FnMut(Phase)) -> Result<()> {
        let loss = self.model.forward(&self.x)?.mse_loss(&self.y)?;
        observe(Phase::Forward);
        loss.backward()?;
        drop(loss);
        observe(Phase::Backward);
        self.optimizer.step()?;
        self.optimizer.zero_grad(true)?;
        observe(Phase::OptimizerStep);
        Ok(())
    }
    // ANCHOR_END: poll_step
}
