//! `nn.MultiheadAttention` with PyTorch's layout: one `in_proj_weight [3E, E]` and
//! `in_proj_bias [3E]` holding the query, key and value projections one above the
//! other, and `out_proj` (a Linear `E -> E`). Inputs are `[batch, seq, E]`
//! (`batch_first=True`). Each of the `H` heads attends with
//! `softmax(q kᵀ / sqrt(E / H) + mask)`, dropout on those weights in training, then the
//! heads' outputs are joined and projected.

use super::{join, Linear, Module, Rng};
use crate::alloc::Category;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

pub struct MultiheadAttention {
    pub embed_dim: usize,
    pub num_heads: usize,
    /// Dropout on the attention weights (training only).
    pub dropout: f32,
    /// `[3 * embed_dim, embed_dim]`: the query, key and value projections' weights.
    pub in_proj_weight: Tensor,
    /// `[3 * embed_dim]`.
    pub in_proj_bias: Tensor,
    pub out_proj: Linear,
    training: bool,
}

/// An additive causal mask `[len, len]`: 0 on and below the diagonal, -inf above
/// (`nn.Transformer.generate_square_subsequent_mask`).
pub fn causal_mask(len: usize, device: &Device) -> Result<Tensor> {
    let mut m = vec![0.0f32; len * len];
    for i in 0..len {
        for j in i + 1..len {
            m[i * len + j] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_slice(&m, &[len, len], device)
}

impl MultiheadAttention {
    /// PyTorch's initialisation: `in_proj_weight` Xavier-uniform, biases zero,
    /// `out_proj.weight` as a Linear's; float32 on `device`.
    pub fn new(
        embed_dim: usize,
        num_heads: usize,
        dropout: f32,
        rng: &mut Rng,
        device: &Device,
    ) -> Result<MultiheadAttention> {
        let _parameters = Category::Parameter.scope();
        let e = embed_dim;
        let bound = (6.0 / (e + 3 * e).max(1) as f32).sqrt();
        let in_proj_weight =
            Tensor::from_slice(&rng.uniform(3 * e * e, bound), &[3 * e, e], device)?;
        let in_proj_bias = Tensor::zeros(&[3 * e], DType::F32, device)?;
        let linear = Linear::new(e, e, true, rng, device)?;
        let out_bias = Tensor::zeros(&[e], DType::F32, device)?;
        let out_proj = Linear::from_parameters(linear.weight.detach(), Some(out_bias))?;
        MultiheadAttention::from_parameters(
            num_heads,
            dropout,
            in_proj_weight,
            in_proj_bias,
            out_proj,
        )
    }

    /// Over given parameters (`in_proj_weight [3E, E]`, `in_proj_bias [3E]`, an
    /// `out_proj` Linear `E -> E`).
    pub fn from_parameters(
        num_heads: usize,
        dropout: f32,
        in_proj_weight: Tensor,
        in_proj_bias: Tensor,
        out_proj: Linear,
    ) -> Result<MultiheadAttention> {
        let e = out_proj.in_features();
        if num_heads == 0 || (e / num_heads) * num_heads != e {
            return Err(Error::InvalidArgument(format!(
                "MultiheadAttention: embed_dim {e} must be divisible by num_heads {num_heads}"
            )));
        }
        if in_proj_weight.shape() != [3 * e, e] || in_proj_bias.shape() != [3 * e] {
            return Err(Error::Shape {
                op: "MultiheadAttention (in_proj_weight vs [3E, E])",
                a: in_proj_weight.shape().to_vec(),
                b: vec![3 * e, e],
            });
        }
        in_proj_weight.set_category(Category::Parameter)?;
        in_proj_bias.set_category(Category::Parameter)?;
        Ok(MultiheadAttention {
            embed_dim: e,
            num_heads,
            dropout,
            in_proj_weight: in_proj_weight.detach().requires_grad_(true),
            in_proj_bias: in_proj_bias.detach().requires_grad_(true),
            out_proj,
            training: true,
        })
    }

    /// `x Wᵢᵀ + bᵢ` for the `i`-th block (0 query, 1 key, 2 value) of the input
    /// projection. The block is picked with `index_select`, whose gradient flows back
    /// into the shared `in_proj_weight`.
    fn project(&self, x: &Tensor, i: usize) -> Result<Tensor> {
        let e = self.embed_dim;
        let rows: Vec<i64> = (i * e..(i + 1) * e).map(|r| r as i64).collect();
        let rows = Tensor::from_slice(&rows, &[e], x.device())?;
        let w = self.in_proj_weight.index_select(0, &rows)?;
        let b = self.in_proj_bias.index_select(0, &rows)?;
        x.matmul(&w.transpose(0, 1)?)?.add(&b)
    }

    /// `[B, L, E]` -> `[B, H, L, D]`.
    fn heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let d = self.embed_dim / self.num_heads;
        x.reshape(&[b, l, self.num_heads, d])?.transpose(1, 2)
    }

    /// Attention of `query [B, L, E]` over `key`, `value [B, S, E]` with an optional
    /// additive float mask `[L, S]` (`-inf` hides a position): the output
    /// `[B, L, E]` (PyTorch's `attn_output` with `need_weights=False`).
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let e = self.embed_dim;
        for (what, t) in [("query", query), ("key", key), ("value", value)] {
            if t.shape().len() != 3 || t.shape()[2] != e {
                return Err(Error::InvalidArgument(format!(
                    "MultiheadAttention: {what} must be [batch, seq, {e}], got {:?}",
                    t.shape()
                )));
            }
        }
        let (b, l) = (query.shape()[0], query.shape()[1]);
        let d = e / self.num_heads;
        let q = self.heads(&self.project(query, 0)?)?;
        let k = self.heads(&self.project(key, 1)?)?;
        let v = self.heads(&self.project(value, 2)?)?;
        let mut scores = q
            .matmul(&k.transpose(2, 3)?)?
            .scale(1.0 / (d as f32).sqrt())?;
        if let Some(mask) = attn_mask {
            scores = scores.add(mask)?;
        }
        let weights = scores.softmax(3)?.dropout(self.dropout, self.training)?;
        let out = weights.matmul(&v)?.transpose(1, 2)?.reshape(&[b, l, e])?;
        self.out_proj.forward(&out)
    }
}

impl Module for MultiheadAttention {
    /// Self-attention: `attend(x, x, x, None)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None)
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join(prefix, "in_proj_weight"), &self.in_proj_weight);
        f(join(prefix, "in_proj_bias"), &self.in_proj_bias);
        self.out_proj.visit_parameters(&join(prefix, "out_proj"), f);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.out_proj.train(mode);
    }

    fn training(&self) -> bool {
        self.training
    }
}
