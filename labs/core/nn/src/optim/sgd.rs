//! `torch.optim.SGD`: with weight decay `d = g + wd * p`; with momentum the buffer is
//! `d` at its first step and `momentum * buf + (1 - dampening) * d` after; Nesterov
//! steps along `d + momentum * buf`, plain momentum along `buf`; then `p -= lr * d`.

use super::{gradient_of, state_like, Optimizer};
use crate::error::{Error, Result};
use crate::tensor::fused::{sgd_step, SgdHyper};
use crate::tensor::{no_grad, Tensor};

pub struct Sgd {
    params: Vec<Tensor>,
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    /// `momentum_buffer` per parameter, made at its first step (only with momentum).
    buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// `SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)`; set
    /// the public fields for the rest (before the first step).
    pub fn new(params: Vec<Tensor>, lr: f64) -> Sgd {
        let buffers = vec![None; params.len()];
        Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers,
        }
    }

    /// With momentum (builder style).
    pub fn momentum(mut self, momentum: f64) -> Sgd {
        self.momentum = momentum;
        self
    }

    /// The momentum buffer of parameter `i`, once it has had a step with momentum.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.buffers.get(i)?.as_ref()
    }
}

impl Optimizer for Sgd {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn step(&mut self) -> Result<()> {
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::InvalidArgument(
                "SGD: Nesterov momentum requires a momentum and zero dampening".into(),
            ));
        }
        let _off = no_grad();
        for (p, buffer) in self.params.iter().zip(&mut self.buffers) {
            let Some(g) = gradient_of(p, "sgd_step")? else {
                continue;
            };
            let first = self.momentum != 0.0 && buffer.is_none();
            if first {
                *buffer = Some(state_like(p)?);
            }
            let hyper = SgdHyper {
                lr: self.lr as f32,
                momentum: self.momentum as f32,
                dampening: self.dampening as f32,
                weight_decay: self.weight_decay as f32,
                nesterov: self.nesterov,
                first,
            };
            sgd_step(p, &g, buffer.as_ref(), &hyper)?;
        }
        Ok(())
    }
}
