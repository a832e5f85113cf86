//! Activation modules: stateless, no parameters (`nn.ReLU`, `nn.Tanh`, `nn.Sigmoid`,
//! `nn.GELU()` with the exact error-function form).

use super::Module;
use crate::error::Result;
use crate::tensor::Tensor;

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, $op:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            training: bool,
        }

        impl Default for $name {
            fn default() -> Self {
                $name { training: true }
            }
        }

        impl $name {
            pub fn new() -> Self {
                Self::default()
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                $op(x)
            }
            fn visit_parameters(&self, _: &str, _: &mut dyn FnMut(String, &Tensor)) {}
            fn train(&mut self, mode: bool) {
                self.training = mode;
            }
            fn training(&self) -> bool {
                self.training
            }
        }
    };
}

activation!(
    /// `max(x, 0)` (`nn.ReLU`).
    Relu,
    Tensor::relu
);
activation!(
    /// `tanh(x)` (`nn.Tanh`).
    Tanh,
    Tensor::tanh
);
activation!(
    /// `1 / (1 + e^-x)` (`nn.Sigmoid`).
    Sigmoid,
    Tensor::sigmoid
);
activation!(
    /// `x Φ(x)` (`nn.GELU()`, `approximate="none"`).
    Gelu,
    |x: &Tensor| x.gelu("none")
);
