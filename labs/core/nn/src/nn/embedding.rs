//! `nn.Embedding`: a `[num_embeddings, embedding_dim]` table whose rows int64 indices
//! pick, initialised from N(0, 1) as PyTorch's.

use super::{join, Module, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{Category, Tensor};

pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
    training: bool,
}

impl Embedding {
    /// A table drawn from N(0, 1) by `rng`, in float32 on `device`.
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        rng: &mut Rng,
        device: &Device,
    ) -> Result<Embedding> {
        let _parameters = Category::Parameter.scope();
        let shape = [num_embeddings, embedding_dim];
        let weight = super::init::parameter(&shape, device, |n| rng.normal(n))?;
        Embedding::from_weight(weight)
    }

    /// A table over a given `[num_embeddings, embedding_dim]` weight.
    pub fn from_weight(weight: Tensor) -> Result<Embedding> {
        if weight.shape().len() != 2 {
            return Err(Error::InvalidArgument(format!(
                "Embedding: weight must be [num_embeddings, embedding_dim], got {:?}",
                weight.shape()
            )));
        }
        weight.set_category(Category::Parameter)?;
        Ok(Embedding {
            weight: weight.detach().requires_grad_(true),
            training: true,
        })
    }
}

impl Module for Embedding {
    /// The rows named by int64 `indices`, shaped `[*indices.shape, embedding_dim]`.
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        Tensor::embedding(indices, &self.weight)
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join(prefix, "weight"), &self.weight);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
    }

    fn training(&self) -> bool {
        self.training
    }
}
