//! The training step the experiments run out of memory with: an `nn::Mlp` trained
//! with Adam on random data and a mean-squared-error loss, as a PyTorch user's
//! smallest real training loop.

use labs_core::nn::{Mlp, Module, Rng, Sequential};
use labs_core::optim::{Adam, Optimizer};
use labs_core::{Device, Result, Tensor};

/// The model's sizes: `input`, then `layers` hidden layers of `hidden`, then `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpSpec {
    pub input: usize,
    pub hidden: usize,
    pub layers: usize,
    pub output: usize,
}

impl MlpSpec {
    /// Big enough on a GPU that megabytes show; small on the simulated GPU, whose
    /// kernels run on the CPU.
    pub fn for_device(device: &Device) -> MlpSpec {
        if device.is_cuda() {
            MlpSpec {
                input: 1024,
                hidden: 1024,
                layers: 4,
                output: 16,
            }
        } else {
            MlpSpec {
                input: 256,
                hidden: 256,
                layers: 3,
                output: 16,
            }
        }
    }

    /// `Mlp::new`'s sizes.
    pub fn sizes(&self) -> Vec<usize> {
        let mut s = vec![self.input];
        s.extend(std::iter::repeat_n(self.hidden, self.layers));
        s.push(self.output);
        s
    }

    /// Parameters, each a float32.
    pub fn parameters(&self) -> u64 {
        self.sizes()
            .windows(2)
            .map(|w| (w[0] * w[1] + w[1]) as u64)
            .sum()
    }
}

/// A model and its optimizer: what a training loop keeps between steps.
pub struct Trainer {
    pub model: Sequential,
    pub optimizer: Adam,
    pub spec: MlpSpec,
    steps: u64,
}

// ANCHOR: train_step
impl Trainer {
    pub fn new(device: &Device, spec: MlpSpec) -> Result<Trainer> {
        let model = Mlp::new(&spec.sizes(), &mut Rng::seeded(0), device)?;
        let optimizer = Adam::new(model.parameters(), 1e-3);
        Ok(Trainer {
            model,
            optimizer,
            spec,
            steps: 0,
        })
    }

    /// One step on a random batch of `batch` samples: forward, loss, backward, update.
    /// On error every tensor the step made is dropped on the way out, but gradients
    /// already accumulated stay on the parameters: see `recovery`.
    pub fn step(&mut self, batch: usize) -> Result<()> {
        let device = self.model_device();
        self.steps += 1;
        let x = Tensor::randn(&[batch, self.spec.input], self.steps, &device)?;
        let y = Tensor::randn(&[batch, self.spec.output], 1 << 32 | self.steps, &device)?;
        let loss = self.model.forward(&x)?.mse_loss(&y)?;
        loss.backward()?;
        self.optimizer.step()?;
        self.optimizer.zero_grad(true)
    }
}
// ANCHOR_END: train_step

impl Trainer {
    /// The device the model lives on.
    pub fn model_device(&self) -> labs_core::Device {
        self.model.parameters()[0].device().clone()
    }

    /// The parameters the optimizer updates.
    pub fn optimizer_params(&self) -> &[Tensor] {
        self.optimizer.params()
    }
}

/// A whole run: a fresh model and optimizer, `steps` steps of `batch` samples, all of
/// it dropped on return. The unit the batch-size finder tries.
pub fn train_run(device: &Device, spec: MlpSpec, batch: usize, steps: usize) -> Result<()> {
    let mut t = Trainer::new(device, spec)?;
    for _ in 0..steps {
        t.step(batch)?;
    }
    Ok(())
}
