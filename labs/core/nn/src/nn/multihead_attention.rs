//! `nn.MultiheadAttention` with PyTorch's layout: one `in_proj_weight [3E, E]` and
//! `in_proj_bias [3E]` holding the query, key and value projections one above the
//! other, and `out_proj` (a Linear `E -> E`). Inputs are `[batch, seq, E]`
//! (`batch_first=True`). The heads attend through
//! [`scaled_dot_product_attention`](super::attention::scaled_dot_product_attention)
//! (or, when the weights are asked for, the same path returning them), then their
//! outputs are joined and projected.
//!
//! How the tensors move around the heads is a choice ([`MhaLayout`]). By default it is
//! PyTorch's `F.multi_head_attention_forward`, copy for copy, so that a training step
//! keeps what PyTorch's keeps: with `batch_first=True` the inputs are transposed to
//! `[seq, batch, E]` views, each projection folds its non-contiguous input into a
//! dense `[seq·batch, E]` copy that the product saves for backward, the packed
//! projection is made contiguous as `[3, seq, batch, E]` (a second copy, which the
//! attention saves), and the heads' output is permuted into a dense
//! `[seq, batch, E]` copy before `out_proj` (saved again). [`MhaLayout::Views`] makes
//! none of these copies: the heads are views of the projection's output and the
//! kernel writes its output where `out_proj` reads it.

use super::attention::{additive_mask, attention_with_weights, scaled_dot_product_attention};
use super::{join, Linear, Module, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{Category, DType, Tensor};

/// How [`MultiheadAttention`] lays out the tensors around the heads (see the module
/// doc): the values are the same either way, the memory is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MhaLayout {
    /// PyTorch's `multi_head_attention_forward` with `batch_first=True`, its copies
    /// included: four to six activations of `[batch, seq, E]` more a call than
    /// [`MhaLayout::Views`], each kept until backward.
    #[default]
    PyTorch,
    /// No copies: the heads are views of the projections, and the attention's output
    /// is already laid out as `out_proj` reads it.
    Views,
}

#[derive(Clone)]
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
    /// PyTorch's copies around the heads, or none.
    pub layout: MhaLayout,
    training: bool,
}

/// The masks of one attention call, as `nn.MultiheadAttention.forward` takes them.
///
/// * `attn_mask`: `[L, S]` or `[B * H, L, S]`; a float mask is added to the scores, a
///   uint8 mask hides the positions where it is 1 (PyTorch's bool mask, true = "not
///   allowed to attend").
/// * `key_padding_mask`: `[B, S]`; uint8 1 (or a float `-inf`) marks a padding key
///   that no query attends to.
/// * `is_causal`: with no `attn_mask`, applies the causal mask (query `i` sees keys
///   `0..=i`) without building it; with one, the mask given is used (PyTorch's hint).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionMasks<'a> {
    pub attn_mask: Option<&'a Tensor>,
    pub key_padding_mask: Option<&'a Tensor>,
    pub is_causal: bool,
}

impl<'a> AttentionMasks<'a> {
    /// Only an `attn_mask` (or none).
    pub fn attn(attn_mask: Option<&'a Tensor>) -> AttentionMasks<'a> {
        AttentionMasks {
            attn_mask,
            ..Default::default()
        }
    }
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
        let rows = e.checked_mul(3).ok_or_else(|| {
            Error::InvalidArgument(format!("MultiheadAttention: embed_dim {e} is too large"))
        })?;
        let bound = (6.0 / (e + rows).max(1) as f32).sqrt();
        let in_proj_weight = super::init::parameter(&[rows, e], device, |n| rng.uniform(n, bound))?;
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
            layout: MhaLayout::default(),
            training: true,
        })
    }

    /// Attention of `query [B, L, E]` over `key`, `value [B, S, E]` with an optional
    /// additive float (or uint8) mask `[L, S]`: the output `[B, L, E]` (PyTorch's
    /// `attn_output` with `need_weights=False`).
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        Ok(self
            .forward_qkv(query, key, value, AttentionMasks::attn(attn_mask), false)?
            .0)
    }

    /// PyTorch's `forward(query, key, value, key_padding_mask, need_weights, attn_mask,
    /// average_attn_weights=True, is_causal)`: the output `[B, L, E]` and, with
    /// `need_weights`, the attention weights averaged over the heads `[B, L, S]`.
    /// Without them the heads go through `scaled_dot_product_attention` (the path a
    /// fused kernel takes); with them, through the same naive path returning them.
    pub fn forward_qkv(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        masks: AttentionMasks,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
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
        let s = key.shape()[1];
        if key.shape()[..2] != value.shape()[..2] || key.shape()[0] != b {
            return Err(Error::InvalidArgument(format!(
                "MultiheadAttention: key {:?} and value {:?} must be [batch, seq, E] with \
                 query's batch {b}",
                key.shape(),
                value.shape()
            )));
        }
        let mask = self.merged_mask(&masks, b, l, s, query.dtype(), query.device())?;
        let causal = masks.is_causal && masks.attn_mask.is_none();
        let (q, k, v) = match self.layout {
            MhaLayout::PyTorch => self.project_as_pytorch(query, key, value)?,
            MhaLayout::Views => self.project_as_views(query, key, value)?,
        };
        let (out, weights) = if need_weights {
            let (o, w) = attention_with_weights(
                &q,
                &k,
                &v,
                mask.as_ref(),
                causal,
                self.dropout,
                self.training,
            )?;
            // `average_attn_weights=True`: the mean over the heads.
            (o, Some(w.mean_dims(&[1], false)?))
        } else {
            let o = scaled_dot_product_attention(
                &q,
                &k,
                &v,
                mask.as_ref(),
                causal,
                self.dropout,
                self.training,
            )?;
            (o, None)
        };
        let out = match self.layout {
            // `attn_output.permute(2, 0, 1, 3).contiguous().view(L * B, E)`, projected,
            // viewed as `[L, B, E]` and transposed back to batch first: a copy that
            // `out_proj` saves, and an output that is not contiguous.
            MhaLayout::PyTorch => {
                let joined = out
                    .permute(&[2, 0, 1, 3])?
                    .contiguous()?
                    .view(&[l * b, e])?;
                self.out_proj
                    .forward(&joined)?
                    .view(&[l, b, e])?
                    .transpose(0, 1)?
            }
            // The kernel's output is `[B, L, H, D]` in memory: joining the heads is a
            // view.
            MhaLayout::Views => self
                .out_proj
                .forward(&out.transpose(1, 2)?.reshape(&[b, l, e])?)?,
        };
        Ok((out, weights))
    }

    /// The heads `[B, H, L, D]` of the query, key and value, as PyTorch's
    /// `_in_projection_packed` makes them from batch-first inputs: the inputs as
    /// `[L, B, E]` views; for self-attention one product with the packed weight, for
    /// a shared key and value (a decoder's cross-attention) one for the query and one
    /// with the key's and value's rows, else three; each packed output made contiguous
    /// as `[n, L, B, E]` and cut into its parts.
    fn project_as_pytorch(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let e = self.embed_dim;
        let (w, bias) = (&self.in_proj_weight, &self.in_proj_bias);
        let rows = |from: usize, n: usize| -> Result<(Tensor, Tensor)> {
            Ok((
                w.narrow(0, from * e, n * e)?,
                bias.narrow(0, from * e, n * e)?,
            ))
        };
        let seq_first = |x: &Tensor| x.transpose(0, 1);
        let (q, k, v) = if same_tensor(query, key) && same_tensor(key, value) {
            let [q, k, v] = packed_parts::<3>(&fold_linear(&seq_first(query)?, w, bias)?)?;
            (q, k, v)
        } else if same_tensor(key, value) {
            let (wq, bq) = rows(0, 1)?;
            let (wkv, bkv) = rows(1, 2)?;
            let q = fold_linear(&seq_first(query)?, &wq, &bq)?;
            let [k, v] = packed_parts::<2>(&fold_linear(&seq_first(key)?, &wkv, &bkv)?)?;
            (q, k, v)
        } else {
            let part = |x: &Tensor, i| -> Result<Tensor> {
                let (wi, bi) = rows(i, 1)?;
                fold_linear(&seq_first(x)?, &wi, &bi)
            };
            (part(query, 0)?, part(key, 1)?, part(value, 2)?)
        };
        Ok((
            self.heads_of_seq_first(&q)?,
            self.heads_of_seq_first(&k)?,
            self.heads_of_seq_first(&v)?,
        ))
    }

    /// The heads as views of the projections' outputs, with no copy: for
    /// self-attention one product with the packed weight; otherwise one product per
    /// part, each with its rows of the packed weight.
    fn project_as_views(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        if same_tensor(query, key) && same_tensor(key, value) {
            let y = query.linear(&self.in_proj_weight, Some(&self.in_proj_bias))?;
            let [q, k, v] = packed_heads(&y, self.num_heads)?;
            return Ok((q, k, v));
        }
        let part = |x: &Tensor, i| -> Result<Tensor> {
            self.heads(&packed_projection(
                x,
                &self.in_proj_weight,
                &self.in_proj_bias,
                i,
            )?)
        };
        Ok((part(query, 0)?, part(key, 1)?, part(value, 2)?))
    }

    /// `[L, B, E]` -> `[B, H, L, D]`, a view: PyTorch's
    /// `x.view(L, B * H, D).transpose(0, 1)` read as `[B, H, L, D]`.
    fn heads_of_seq_first(&self, x: &Tensor) -> Result<Tensor> {
        let (l, b) = (x.shape()[0], x.shape()[1]);
        let d = self.embed_dim / self.num_heads;
        x.view(&[l, b, self.num_heads, d])?.permute(&[1, 2, 0, 3])
    }

    /// `[B, L, E]` -> `[B, H, L, D]`.
    fn heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let d = self.embed_dim / self.num_heads;
        x.reshape(&[b, l, self.num_heads, d])?.transpose(1, 2)
    }

    /// `attn_mask` and `key_padding_mask` as one additive float mask broadcasting to
    /// `[B, H, L, S]` (PyTorch merges them the same way), checked against the shapes.
    fn merged_mask(
        &self,
        masks: &AttentionMasks,
        b: usize,
        l: usize,
        s: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let h = self.num_heads;
        let attn = match masks.attn_mask {
            None => None,
            Some(m) => {
                check_device(m, device)?;
                let m4 = match m.shape() {
                    [ml, ms] if (*ml, *ms) == (l, s) => m.reshape(&[1, 1, l, s])?,
                    [n, ml, ms] if (*n, *ml, *ms) == (b * h, l, s) => m.reshape(&[b, h, l, s])?,
                    other => {
                        return Err(Error::InvalidArgument(format!(
                            "MultiheadAttention: attn_mask must be [{l}, {s}] or \
                             [{}, {l}, {s}] (batch * heads, L, S), got {other:?}",
                            b * h
                        )))
                    }
                };
                Some(additive_mask(&m4, 1, dtype)?)
            }
        };
        let padding = match masks.key_padding_mask {
            None => None,
            Some(m) => {
                check_device(m, device)?;
                if m.shape() != [b, s] {
                    return Err(Error::InvalidArgument(format!(
                        "MultiheadAttention: key_padding_mask must be [{b}, {s}] (batch, \
                         key length), got {:?}",
                        m.shape()
                    )));
                }
                Some(additive_mask(&m.reshape(&[b, 1, 1, s])?, 1, dtype)?)
            }
        };
        Ok(match (attn, padding) {
            (Some(a), Some(p)) => Some(a.add(&p)?),
            (a, p) => a.or(p),
        })
    }
}

/// Whether two arguments are one tensor (PyTorch's `query is key`): the same storage
/// seen the same way.
fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.is_same_view(b)
}

/// PyTorch's `linear` on a 3-D input: a contiguous one is viewed as 2-D; any other is
/// folded into a dense `[L·B, E]` copy first (`matmul` reshapes it), and that copy is
/// what the product saves. The output is viewed back as `[L, B, out]`.
fn fold_linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (l, n, e) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    x.reshape(&[l * n, e])?
        .linear(w, Some(b))?
        .view(&[l, n, w.shape()[0]])
}

/// The `N` parts of a packed projection `[L, B, N·E]`, as PyTorch's
/// `proj.unflatten(-1, (N, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()`
/// lays them out: one dense `[N, L, B, E]` copy, each part a `[L, B, E]` view of it.
fn packed_parts<const N: usize>(proj: &Tensor) -> Result<[Tensor; N]> {
    let (l, b, ne) = (proj.shape()[0], proj.shape()[1], proj.shape()[2]);
    let e = ne / N;
    let dense = proj
        .view(&[l, b, N, e])?
        .permute(&[2, 0, 1, 3])?
        .contiguous()?;
    let mut parts = Vec::with_capacity(N);
    for i in 0..N {
        parts.push(dense.narrow(0, i, 1)?.view(&[l, b, e])?);
    }
    Ok(parts
        .try_into()
        .unwrap_or_else(|_| unreachable!("{N} parts were pushed")))
}

fn check_device(mask: &Tensor, device: &Device) -> Result<()> {
    if mask.device().id() != device.id() {
        return Err(Error::DeviceMismatch {
            a: device.id(),
            b: mask.device().id(),
        });
    }
    Ok(())
}

/// `x Wᵢᵀ + bᵢ` for the `i`-th of the blocks of rows a packed projection stacks
/// (`[n E, E]` weight, `[n E]` bias: MultiheadAttention's query, key, value; GPT-2's
/// `c_attn`). The block is picked with `index_select`, whose gradient flows back into
/// the shared weight; the copy is of an `E x E` weight, not of the activations.
pub(crate) fn packed_projection(x: &Tensor, w: &Tensor, b: &Tensor, i: usize) -> Result<Tensor> {
    let e = w.shape()[1];
    x.linear(&w.narrow(0, i * e, e)?, Some(&b.narrow(0, i * e, e)?))
}

/// The three parts of `y [B, L, 3E]` (the output of a packed projection: query, key,
/// value) as `heads` heads `[B, H, L, D]` each: views of `y`, no copy (the fused
/// attention kernel reads them where they lie). The three are cut from one view, so
/// that backward writes their gradients into one buffer (see `autograd/slices.rs`).
pub(crate) fn packed_heads(y: &Tensor, heads: usize) -> Result<[Tensor; 3]> {
    let (b, l, e3) = (y.shape()[0], y.shape()[1], y.shape()[2]);
    let d = e3 / 3 / heads;
    let split = y.view(&[b, l, 3 * heads, d])?;
    let part = |i: usize| split.narrow(2, i * heads, heads)?.transpose(1, 2);
    Ok([part(0)?, part(1)?, part(2)?])
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
