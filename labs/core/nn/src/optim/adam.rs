//! `torch.optim.Adam` and `AdamW` (non-amsgrad), one fused kernel per parameter:
//!
//! ```text
//! t += 1
//! g = g + wd * p                       (Adam's L2 penalty)   | p = p * (1 - lr * wd)   (AdamW)
//! m = m + (1 - beta1) * (g - m)
//! v = beta2 * v + (1 - beta2) * g^2
//! p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//!
//! The bias corrections and the step size are computed in float64 on the host, as
//! PyTorch computes them in Python, and handed to the kernel as float32. With
//! `capturable` (PyTorch's `capturable=True`), the step count is a float32 tensor on
//! the device, incremented there, and the kernel computes them from it in float32:
//! nothing of the step is left on the host, so a CUDA graph that captured it replays
//! each step with that step's count.

use super::{gradient_of, state_like, Optimizer};
use crate::error::Result;
use crate::tensor::fused::{adam_step, adam_step_capturable, AdamHyper};
use crate::tensor::{no_grad, Tensor};

/// A parameter's state: `step`, `exp_avg`, `exp_avg_sq` (float32).
pub struct AdamState {
    /// Steps taken, counted on the host (a capturable optimizer counts on the device
    /// too, in `device_step`, and this count is what the host saw launched).
    pub step: u64,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    /// A capturable optimizer's step count, a float32 scalar on the parameter's device.
    pub device_step: Option<Tensor>,
}

/// `torch.optim.Adam(params, lr, betas, eps, weight_decay)`.
pub struct Adam {
    params: Vec<Tensor>,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// The L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Decoupled weight decay (AdamW) instead of the L2 penalty.
    decoupled: bool,
    /// PyTorch's `capturable=True`: the step count on the device (see the module's note).
    pub capturable: bool,
    state: Vec<Option<AdamState>>,
    /// A float32 one per device, what a capturable step adds to each count.
    ones: Vec<Tensor>,
}

/// `torch.optim.AdamW`: Adam whose weight decay shrinks the parameter directly,
/// `p *= 1 - lr * wd`, instead of adding `wd * p` to the gradient. Its default weight
/// decay is 0.01.
pub struct AdamW;

impl AdamW {
    /// `AdamW(params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(params: Vec<Tensor>, lr: f64) -> Adam {
        let mut a = Adam::new(params, lr);
        a.decoupled = true;
        a.weight_decay = 0.01;
        a
    }
}

impl Adam {
    /// `Adam(params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)`.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Adam {
        let state = params.iter().map(|_| None).collect();
        Adam {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            capturable: false,
            state,
            ones: Vec::new(),
        }
    }

    /// Whether this is AdamW.
    pub fn is_decoupled(&self) -> bool {
        self.decoupled
    }

    /// Parameter `i`'s state, once it has had a step.
    pub fn state(&self, i: usize) -> Option<&AdamState> {
        self.state.get(i)?.as_ref()
    }
}

impl Optimizer for Adam {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        let (beta1, beta2) = self.betas;
        for (p, state) in self.params.iter().zip(&mut self.state) {
            let Some(g) = gradient_of(p, "adam_step")? else {
                continue;
            };
            if state.is_none() {
                *state = Some(AdamState {
                    step: 0,
                    exp_avg: state_like(p)?,
                    exp_avg_sq: state_like(p)?,
                    device_step: None,
                });
            }
            let s = state.as_mut().expect("made above");
            if self.capturable && s.device_step.is_none() {
                s.device_step = Some(step_count(p, s.step)?);
            }
            s.step += 1;
            let t = s.step as i32;
            let bias_correction1 = 1.0 - beta1.powi(t);
            let bias_correction2 = 1.0 - beta2.powi(t);
            let (weight_decay, param_decay) = if self.decoupled {
                (0.0, 1.0 - self.lr * self.weight_decay)
            } else {
                (self.weight_decay, 1.0)
            };
            let hyper = AdamHyper {
                one_minus_beta1: (1.0 - beta1) as f32,
                beta2: beta2 as f32,
                one_minus_beta2: (1.0 - beta2) as f32,
                step_size: (self.lr / bias_correction1) as f32,
                bias_correction2_sqrt: bias_correction2.sqrt() as f32,
                eps: self.eps as f32,
                weight_decay: weight_decay as f32,
                param_decay: param_decay as f32,
                lr: self.lr as f32,
            };
            match &s.device_step {
                Some(t) if self.capturable => {
                    t.axpy_(1.0, one_on(&mut self.ones, p)?)?;
                    adam_step_capturable(p, &g, &s.exp_avg, &s.exp_avg_sq, t, &hyper)?;
                }
                _ => adam_step(p, &g, &s.exp_avg, &s.exp_avg_sq, &hyper)?,
            }
        }
        Ok(())
    }
}

/// A step count on `p`'s device holding `steps`, counted as optimizer state.
fn step_count(p: &Tensor, steps: u64) -> Result<Tensor> {
    let _state = crate::tensor::Category::OptimizerState.scope();
    Tensor::full(&[1], steps as f32, p.device())
}

/// The float32 one kept for `p`'s device, made on first use.
fn one_on<'a>(ones: &'a mut Vec<Tensor>, p: &Tensor) -> Result<&'a Tensor> {
    let at = match ones.iter().position(|o| o.device().id() == p.device().id()) {
        Some(i) => i,
        None => {
            let _state = crate::tensor::Category::OptimizerState.scope();
            ones.push(Tensor::full(&[1], 1.0f32, p.device())?);
            ones.len() - 1
        }
    };
    Ok(&ones[at])
}
