//! `nn.Sequential` (children named `0`, `1`, ..., each applied to the last's output) and
//! an MLP built as one: `Linear, ReLU, Linear, ReLU, ..., Linear`, so its parameters
//! are named as PyTorch names `nn.Sequential(nn.Linear(..), nn.ReLU(), ...)`'s:
//! `0.weight`, `0.bias`, `2.weight`, ...

use super::{join, Linear, Module, Relu, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Modules applied in order.
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: bool,
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential {
            layers: Vec::new(),
            training: true,
        }
    }

    /// Appends a module (it takes the next index as its name), in the current mode.
    pub fn push(mut self, mut layer: impl Module + 'static) -> Sequential {
        layer.train(self.training);
        self.layers.push(Box::new(layer));
        self
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The `i`-th module.
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|l| &**l)
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y)?;
        }
        Ok(y)
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_parameters(&join(prefix, &i.to_string()), f);
        }
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        for layer in &mut self.layers {
            layer.train(mode);
        }
    }

    fn training(&self) -> bool {
        self.training
    }
}

/// A multilayer perceptron: `Linear(sizes[0], sizes[1]), ReLU, ..., Linear(.., sizes[n])`
/// with biases, as a [`Sequential`] (parameters `0.weight`, `0.bias`, `2.weight`, ...).
pub struct Mlp;

impl Mlp {
    /// The layers for `sizes` (at least an input and an output size), initialised from
    /// `rng` in order.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(sizes: &[usize], rng: &mut Rng, device: &Device) -> Result<Sequential> {
        if sizes.len() < 2 {
            return Err(Error::InvalidArgument(format!(
                "Mlp: needs an input and an output size, got {sizes:?}"
            )));
        }
        let mut model = Sequential::new();
        for (i, pair) in sizes.windows(2).enumerate() {
            if i > 0 {
                model = model.push(Relu::new());
            }
            model = model.push(Linear::new(pair[0], pair[1], true, rng, device)?);
        }
        Ok(model)
    }
}
