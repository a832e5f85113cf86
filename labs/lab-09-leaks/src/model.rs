//! The small model every experiment trains or evaluates: matrix products and ReLUs
//! down to one output per sample, its mean the loss. Made only of ops that record a
//! graph, so that what the graph saves is what a PyTorch MLP's would save: each
//! product's two operands and each ReLU's output.

use labs_core::tensor::no_grad;
use labs_core::{Device, Result, Tensor};

/// The sizes of a run: big enough on a GPU that megabytes show, small on the simulator.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
    /// Hidden-to-hidden layers after the first (each a product and a ReLU).
    pub depth: usize,
    pub iterations: usize,
}

impl Sizes {
    pub fn for_device(device: &Device, quick: bool) -> Sizes {
        if device.is_cuda() && !quick {
            Sizes {
                batch: 512,
                input: 1024,
                hidden: 2048,
                depth: 2,
                iterations: 6,
            }
        } else {
            Sizes {
                batch: 64,
                input: 256,
                hidden: 512,
                depth: 2,
                iterations: 6,
            }
        }
    }
}

/// The model's parameters: leaves that require a gradient.
pub struct Mlp {
    pub weights: Vec<Tensor>,
}

// ANCHOR: model
impl Mlp {
    pub fn new(device: &Device, s: Sizes, seed: u64) -> Result<Mlp> {
        let mut dims = vec![s.input, s.hidden];
        dims.extend(std::iter::repeat_n(s.hidden, s.depth));
        dims.push(1);
        let weights = dims
            .windows(2)
            .enumerate()
            .map(|(i, d)| {
                let w = Tensor::randn(&[d[0], d[1]], seed + i as u64, device)?;
                Ok(w.scale(1.0 / (d[0] as f32).sqrt())?.requires_grad_(true))
            })
            .collect::<Result<_>>()?;
        Ok(Mlp { weights })
    }

    /// The loss of one batch: `mean(relu(relu(x @ w0) @ w1) ... @ wN)`.
    pub fn loss(&self, x: &Tensor) -> Result<Tensor> {
        let (last, hidden) = self.weights.split_last().expect("at least one layer");
        let mut h = x.clone();
        for w in hidden {
            h = h.matmul(w)?.relu()?;
        }
        h.matmul(last)?.mean_all()
    }

    /// Plain SGD, under `no_grad`; the gradients are dropped afterwards
    /// (`zero_grad(set_to_none=True)`).
    pub fn sgd_step(&self, lr: f32) -> Result<()> {
        let _off = no_grad();
        for w in &self.weights {
            if let Some(g) = w.grad() {
                w.axpy_(-lr, &g)?;
            }
            w.clear_grad();
        }
        Ok(())
    }
}
// ANCHOR_END: model

/// Batch `i` of a run: a new input tensor each iteration, as a data loader gives.
pub fn batch(device: &Device, s: Sizes, i: usize) -> Result<Tensor> {
    Tensor::randn(&[s.batch, s.input], 1000 + i as u64, device)
}
