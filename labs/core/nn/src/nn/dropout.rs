//! `nn.Dropout`: zeroes elements with probability `p` in training mode (the others
//! scaled by `1 / (1 - p)`), the identity in eval mode.

use super::Module;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

#[derive(Debug, Clone)]
pub struct Dropout {
    pub p: f32,
    training: bool,
}

impl Dropout {
    pub fn new(p: f32) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::InvalidArgument(format!(
                "Dropout: probability has to be between 0 and 1, but got {p}"
            )));
        }
        Ok(Dropout { p, training: true })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.dropout(self.p, self.training)
    }

    fn visit_parameters(&self, _: &str, _: &mut dyn FnMut(String, &Tensor)) {}

    fn train(&mut self, mode: bool) {
        self.training = mode;
    }

    fn training(&self) -> bool {
        self.training
    }
}
