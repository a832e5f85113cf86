//! `nn.Linear`: `y = x Wᵀ + b` with PyTorch's layout (`weight` is `[out, in]`) and
//! initialisation (`kaiming_uniform_(a=sqrt(5))`, which bounds the weight by
//! `1/sqrt(in)`, and the bias by the same).

use super::{join, Module, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{Category, Tensor};

#[derive(Clone)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Tensor>,
    training: bool,
}

impl Linear {
    /// A layer with PyTorch's initialisation drawn from `rng`, in float32 on `device`.
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        rng: &mut Rng,
        device: &Device,
    ) -> Result<Linear> {
        let _parameters = Category::Parameter.scope();
        let bound = if in_features == 0 {
            0.0
        } else {
            1.0 / (in_features as f32).sqrt()
        };
        let shape = [out_features, in_features];
        let weight = super::init::parameter(&shape, device, |n| rng.uniform(n, bound))?;
        let bias = bias
            .then(|| super::init::parameter(&[out_features], device, |n| rng.uniform(n, bound)))
            .transpose()?;
        Linear::from_parameters(weight, bias)
    }

    /// A layer over given tensors (`weight [out, in]`, `bias [out]`), made leaves that
    /// require grad and counted as parameters by the allocator.
    pub fn from_parameters(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let [out, _] = weight.shape() else {
            return Err(Error::InvalidArgument(format!(
                "Linear: weight must be [out_features, in_features], got {:?}",
                weight.shape()
            )));
        };
        if let Some(b) = &bias {
            if b.shape() != [*out] || b.dtype() != weight.dtype() {
                return Err(Error::Shape {
                    op: "Linear (bias against weight)",
                    a: b.shape().to_vec(),
                    b: weight.shape().to_vec(),
                });
            }
        }
        // The allocator counts them as parameters from now on (PyTorch's profiler
        // category), whoever made them.
        weight.set_category(Category::Parameter)?;
        if let Some(b) = &bias {
            b.set_category(Category::Parameter)?;
        }
        Ok(Linear {
            weight: weight.detach().requires_grad_(true),
            bias: bias.map(|b| b.detach().requires_grad_(true)),
            training: true,
        })
    }

    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rank = x.shape().len();
        if rank == 0 || x.shape()[rank - 1] != self.in_features() {
            return Err(Error::Shape {
                op: "Linear (input [.., in_features] against weight [out, in])",
                a: x.shape().to_vec(),
                b: self.weight.shape().to_vec(),
            });
        }
        // A 1-D input is one row, as in PyTorch.
        let rows = x.numel() / self.in_features().max(1);
        let x2 = if rank == 2 {
            x.clone()
        } else {
            x.reshape(&[rows, self.in_features()])?
        };
        let y = x2.linear(&self.weight, self.bias.as_ref())?;
        let mut out_shape = x.shape().to_vec();
        out_shape[rank - 1] = self.out_features();
        if rank == 2 {
            Ok(y)
        } else {
            y.reshape(&out_shape)
        }
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join(prefix, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(join(prefix, "bias"), b);
        }
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
    }

    fn training(&self) -> bool {
        self.training
    }
}
