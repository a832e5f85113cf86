//! `nn.LayerNorm` with an elementwise affine: `weight` ones and `bias` zeros at first,
//! each of `normalized_shape`.

use super::{join, Module};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{Category, DType, Tensor};

#[derive(Clone)]
pub struct LayerNorm {
    pub normalized_shape: Vec<usize>,
    pub eps: f32,
    pub weight: Tensor,
    pub bias: Tensor,
    training: bool,
}

impl LayerNorm {
    /// `LayerNorm(normalized_shape, eps)` in float32 on `device`.
    pub fn new(normalized_shape: &[usize], eps: f32, device: &Device) -> Result<LayerNorm> {
        let _parameters = Category::Parameter.scope();
        let weight = Tensor::full(normalized_shape, 1.0f32, device)?;
        let bias = Tensor::zeros(normalized_shape, DType::F32, device)?;
        LayerNorm::from_parameters(weight, bias, eps)
    }

    /// Over given `weight` and `bias` (their shape is the normalized shape).
    pub fn from_parameters(weight: Tensor, bias: Tensor, eps: f32) -> Result<LayerNorm> {
        if weight.shape() != bias.shape() {
            return Err(Error::Shape {
                op: "LayerNorm (weight vs bias)",
                a: weight.shape().to_vec(),
                b: bias.shape().to_vec(),
            });
        }
        weight.set_category(Category::Parameter)?;
        bias.set_category(Category::Parameter)?;
        Ok(LayerNorm {
            normalized_shape: weight.shape().to_vec(),
            eps,
            weight: weight.detach().requires_grad_(true),
            bias: bias.detach().requires_grad_(true),
            training: true,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(
            &self.normalized_shape,
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
        )
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join(prefix, "weight"), &self.weight);
        f(join(prefix, "bias"), &self.bias);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
    }

    fn training(&self) -> bool {
        self.training
    }
}
