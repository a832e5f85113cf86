//! A training-like loop for the demo: the allocation pattern of an MLP trained with
//! Adam (weights kept, activations saved in the forward pass and freed in reverse by the
//! backward pass, a gradient per weight, optimizer moments made at the first step),
//! with elementwise kernels standing in for the matrix products. Memory is what it
//! shows, not learning.

use labs_core::alloc::Allocator;
use labs_core::{DType, Device, Result, Tensor};

/// The model's size: `layers` weights of `width` x `width` f32, a batch of `batch` rows.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub layers: usize,
    pub width: usize,
    pub batch: usize,
}

impl Model {
    /// 4 layers of 2048 x 2048 (16 MiB each), a batch of 1024 (8 MiB activations).
    pub const DEMO: Model = Model {
        layers: 4,
        width: 2048,
        batch: 1024,
    };
    /// A quarter of the width, for quick runs.
    pub const QUICK: Model = Model {
        layers: 4,
        width: 512,
        batch: 256,
    };
}

/// Where the loop is, for the demo's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Weights,
    Forward,
    Backward,
    OptimizerStep,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Weights => "weights made",
            Phase::Forward => "after forward",
            Phase::Backward => "after backward",
            Phase::OptimizerStep => "after optimizer step",
        }
    }
}

/// The allocator's figures at one point of the loop.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub step: usize,
    pub phase: Phase,
    pub allocated: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
}

pub struct Trainer {
    model: Model,
    device: Device,
    weights: Vec<Tensor>,
    /// Adam's two moments per weight, made at the first step as PyTorch's optimizers
    /// make theirs: the jump in memory_allocated after step 1.
    moments: Vec<(Tensor, Tensor)>,
    step: usize,
}

impl Trainer {
    // Not inlined, so that backtraces name it (release binaries keep names, not lines).
    #[inline(never)]
    pub fn new(model: Model, device: &Device) -> Result<Trainer> {
        let weights = (0..model.layers)
            .map(|i| Tensor::randn(&[model.width, model.width], i as u64, device))
            .collect::<Result<_>>()?;
        Ok(Trainer {
            model,
            device: device.clone(),
            weights,
            moments: Vec::new(),
            step: 0,
        })
    }

    pub fn reading(&self, allocator: &Allocator, phase: Phase) -> Reading {
        Reading {
            step: self.step,
            phase,
            allocated: allocator.memory_allocated(),
            reserved: allocator.memory_reserved(),
            peak_allocated: allocator.max_memory_allocated(),
        }
    }

    // ANCHOR: train_step
    /// One step; `observe` is called after each phase. Returns the loss tensor (a
    /// value per row), which the caller may keep, or drop.
    #[inline(never)]
    pub fn step(&mut self, mut observe: impl FnMut(&Trainer, Phase)) -> Result<Tensor> {
        self.step += 1;
        let m = self.model;
        // Forward: each layer's output is saved for the backward pass.
        let mut saved = vec![Tensor::randn(
            &[m.batch, m.width],
            100 + self.step as u64,
            &self.device,
        )?];
        for _ in &self.weights {
            let h = saved.last().unwrap();
            let out = h.mul(h)?.scale(0.5)?;
            saved.push(out);
        }
        // The per-row loss: small, and the tensor a loop is tempted to keep.
        let loss = Tensor::randn(&[m.batch], 200 + self.step as u64, &self.device)?;
        observe(self, Phase::Forward);
        // Backward: from the last layer down, each saved activation is freed as soon as
        // its gradients are made (what autograd does with the graph).
        let mut grad = Tensor::full(&[m.batch, m.width], 1.0f32, &self.device)?;
        let mut grads = Vec::with_capacity(m.layers);
        for _ in 0..m.layers {
            let act = saved.pop().unwrap();
            grad = grad.mul(&act)?;
            let g = Tensor::zeros(&[m.width, m.width], DType::F32, &self.device)?;
            grads.push(g);
        }
        drop(saved);
        drop(grad);
        observe(self, Phase::Backward);
        // Adam: the moments exist from the first step on.
        if self.moments.is_empty() {
            for _ in 0..m.layers {
                let z = || Tensor::zeros(&[m.width, m.width], DType::F32, &self.device);
                self.moments.push((z()?, z()?));
            }
        }
        for ((w, (m1, m2)), g) in self
            .weights
            .iter()
            .zip(&self.moments)
            .zip(grads.iter().rev())
        {
            m1.axpy_(0.1, g)?;
            let g2 = g.mul(g)?;
            m2.axpy_(0.001, &g2)?;
            w.axpy_(-1e-3, m1)?;
        }
        drop(grads);
        observe(self, Phase::OptimizerStep);
        Ok(loss)
    }
    // ANCHOR_END: train_step

    pub fn steps_done(&self) -> usize {
        self.step
    }
}
