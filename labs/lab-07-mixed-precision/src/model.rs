//! What every experiment trains: an `nn::Mlp` (Linear, ReLU, ..., Linear) classifying
//! random inputs into the classes a fixed random "teacher" matrix assigns them, with
//! cross-entropy and Adam. The data is the same for every precision, so that their
//! loss curves can be compared.

use labs_core::nn::{Mlp, Module, Rng, Sequential};
use labs_core::optim::{Adam, GradScaler, Optimizer};
use labs_core::tensor::{autocast, no_grad};
use labs_core::{DType, Device, Result, Tensor};

/// The sizes of a run: large enough on a GPU that memory and time matter, small on the
/// simulator (which runs every kernel on the CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub batch: usize,
    pub width: usize,
    /// Hidden layers (each a Linear and a ReLU) before the output layer.
    pub hidden_layers: usize,
    pub classes: usize,
}

impl Sizes {
    /// The memory and time experiments: 4096 wide, batch 256 on a GPU.
    pub fn for_device(device: &Device, quick: bool) -> Sizes {
        if device.is_cuda() && !quick {
            Sizes {
                batch: 256,
                width: 4096,
                hidden_layers: 4,
                classes: 16,
            }
        } else {
            Sizes {
                batch: 32,
                width: 128,
                hidden_layers: 2,
                classes: 16,
            }
        }
    }
}

/// A step's precision: float32 throughout, or autocast to a half type (float16 with a
/// gradient scaler, as PyTorch's recipe says; bfloat16 without).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    F32,
    Bf16,
    F16,
}

impl Precision {
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "float32",
            Precision::Bf16 => "autocast bfloat16",
            Precision::F16 => "autocast float16 + GradScaler",
        }
    }

    /// The autocast dtype, if any.
    pub fn autocast_dtype(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }
}

/// The model (float32 parameters, the "master weights"), its optimizer and, for
/// float16, its scaler.
pub struct Trainer {
    pub model: Sequential,
    pub opt: Adam,
    pub scaler: Option<GradScaler>,
    pub precision: Precision,
}

impl Trainer {
    pub fn new(device: &Device, s: Sizes, precision: Precision, seed: u64) -> Result<Trainer> {
        let mut sizes = vec![s.width; s.hidden_layers + 1];
        sizes.push(s.classes);
        let model = Mlp::new(&sizes, &mut Rng::seeded(seed), device)?;
        let opt = Adam::new(model.parameters(), 1e-3);
        let scaler = (precision == Precision::F16).then(GradScaler::new);
        Ok(Trainer {
            model,
            opt,
            scaler,
            precision,
        })
    }

    /// The loss of one batch, the forward pass under autocast when the precision says.
    pub fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let _region = self.precision.autocast_dtype().map(autocast).transpose()?;
        self.model
            .forward(x)?
            .cross_entropy(y, labs_core::tensor::IGNORE_INDEX)
    }

    // ANCHOR: amp_step
    /// One training step; returns the loss. The forward pass (and the loss) run under
    /// autocast; `backward` and the optimizer step outside it, as in PyTorch's recipe.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<f32> {
        self.opt.zero_grad(true)?;
        let loss = self.loss(x, y)?;
        match &mut self.scaler {
            Some(scaler) => {
                scaler.scale(&loss)?.backward()?;
                scaler.step(&mut self.opt)?;
                scaler.update()?;
            }
            None => {
                loss.backward()?;
                self.opt.step()?;
            }
        }
        loss.item::<f32>()
    }
    // ANCHOR_END: amp_step
}

/// Batch `i` of the data set: standard-normal inputs `[batch, width]` and their int64
/// classes from a fixed teacher matrix (the same for every `i`).
pub fn batch(device: &Device, s: Sizes, i: usize) -> Result<(Tensor, Tensor)> {
    let _off = no_grad();
    let x = Tensor::randn(&[s.batch, s.width], 1000 + i as u64, device)?;
    let teacher = Tensor::randn(&[s.width, s.classes], 7, device)?;
    let y = x.matmul(&teacher)?.argmax(1, false)?;
    Ok((x, y))
}
