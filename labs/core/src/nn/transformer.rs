//! `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer` as PyTorch builds them
//! by default (post-norm, `norm_first=False`; ReLU; `batch_first=True` inputs
//! `[batch, seq, d_model]`), with PyTorch's parameter names:
//!
//! ```text
//! encoder: x = norm1(x + dropout1(self_attn(x, x, x, mask)))
//!          x = norm2(x + dropout2(linear2(dropout(relu(linear1(x))))))
//! decoder: x = norm1(x + dropout1(self_attn(x, x, x, tgt_mask)))
//!          x = norm2(x + dropout2(multihead_attn(x, mem, mem, memory_mask)))
//!          x = norm3(x + dropout3(linear2(dropout(relu(linear1(x))))))
//! ```

use super::{join, Dropout, LayerNorm, Linear, Module, MultiheadAttention, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The sizes of a layer (`d_model`, `nhead`, `dim_feedforward`, `dropout`,
/// `layer_norm_eps`), PyTorch's constructor arguments.
#[derive(Debug, Clone, Copy)]
pub struct TransformerConfig {
    pub d_model: usize,
    pub nhead: usize,
    pub dim_feedforward: usize,
    pub dropout: f32,
    pub layer_norm_eps: f32,
}

impl TransformerConfig {
    /// PyTorch's defaults besides the two sizes: `dim_feedforward=2048`,
    /// `dropout=0.1`, `layer_norm_eps=1e-5`.
    pub fn new(d_model: usize, nhead: usize) -> TransformerConfig {
        TransformerConfig {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            layer_norm_eps: 1e-5,
        }
    }
}

/// The feed-forward block both layers end with.
struct FeedForward {
    linear1: Linear,
    dropout: Dropout,
    linear2: Linear,
}

impl FeedForward {
    fn new(c: &TransformerConfig, rng: &mut Rng, device: &Device) -> Result<FeedForward> {
        Ok(FeedForward {
            linear1: Linear::new(c.d_model, c.dim_feedforward, true, rng, device)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::new(c.dim_feedforward, c.d_model, true, rng, device)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.dropout.forward(&self.linear1.forward(x)?.relu()?)?;
        self.linear2.forward(&h)
    }

    fn train(&mut self, mode: bool) {
        self.linear1.train(mode);
        self.dropout.train(mode);
        self.linear2.train(mode);
    }
}

pub struct TransformerEncoderLayer {
    pub self_attn: MultiheadAttention,
    ff: FeedForward,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    dropout1: Dropout,
    dropout2: Dropout,
    training: bool,
}

impl TransformerEncoderLayer {
    pub fn new(c: TransformerConfig, rng: &mut Rng, device: &Device) -> Result<Self> {
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::new(c.d_model, c.nhead, c.dropout, rng, device)?,
            ff: FeedForward::new(&c, rng, device)?,
            norm1: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            norm2: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            training: true,
        })
    }

    /// The layer over `src [batch, seq, d_model]` with an optional additive mask
    /// `[seq, seq]`.
    pub fn forward_masked(&self, src: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let sa = self.self_attn.attend(src, src, src, mask)?;
        let x = self
            .norm1
            .forward(&src.add(&self.dropout1.forward(&sa)?)?)?;
        let ff = self.ff.forward(&x)?;
        self.norm2.forward(&x.add(&self.dropout2.forward(&ff)?)?)
    }
}

impl Module for TransformerEncoderLayer {
    fn forward(&self, src: &Tensor) -> Result<Tensor> {
        self.forward_masked(src, None)
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        // PyTorch's registration order: self_attn, linear1, linear2, norm1, norm2.
        self.self_attn
            .visit_parameters(&join(prefix, "self_attn"), f);
        self.ff
            .linear1
            .visit_parameters(&join(prefix, "linear1"), f);
        self.ff
            .linear2
            .visit_parameters(&join(prefix, "linear2"), f);
        self.norm1.visit_parameters(&join(prefix, "norm1"), f);
        self.norm2.visit_parameters(&join(prefix, "norm2"), f);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.self_attn.train(mode);
        self.ff.train(mode);
        self.norm1.train(mode);
        self.norm2.train(mode);
        self.dropout1.train(mode);
        self.dropout2.train(mode);
    }

    fn training(&self) -> bool {
        self.training
    }
}

pub struct TransformerDecoderLayer {
    pub self_attn: MultiheadAttention,
    pub multihead_attn: MultiheadAttention,
    ff: FeedForward,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub norm3: LayerNorm,
    dropouts: [Dropout; 3],
    training: bool,
}

impl TransformerDecoderLayer {
    pub fn new(c: TransformerConfig, rng: &mut Rng, device: &Device) -> Result<Self> {
        Ok(TransformerDecoderLayer {
            self_attn: MultiheadAttention::new(c.d_model, c.nhead, c.dropout, rng, device)?,
            multihead_attn: MultiheadAttention::new(c.d_model, c.nhead, c.dropout, rng, device)?,
            ff: FeedForward::new(&c, rng, device)?,
            norm1: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            norm2: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            norm3: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            dropouts: [
                Dropout::new(c.dropout)?,
                Dropout::new(c.dropout)?,
                Dropout::new(c.dropout)?,
            ],
            training: true,
        })
    }

    /// The layer over `tgt [batch, tgt_len, d_model]` and `memory [batch, src_len,
    /// d_model]`, with optional additive masks `tgt_mask [tgt_len, tgt_len]` and
    /// `memory_mask [tgt_len, src_len]`.
    pub fn forward_decoder(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_mask: Option<&Tensor>,
        memory_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let [d1, d2, d3] = &self.dropouts;
        let sa = self.self_attn.attend(tgt, tgt, tgt, tgt_mask)?;
        let x = self.norm1.forward(&tgt.add(&d1.forward(&sa)?)?)?;
        let ca = self
            .multihead_attn
            .attend(&x, memory, memory, memory_mask)?;
        let x = self.norm2.forward(&x.add(&d2.forward(&ca)?)?)?;
        let ff = self.ff.forward(&x)?;
        self.norm3.forward(&x.add(&d3.forward(&ff)?)?)
    }
}

impl Module for TransformerDecoderLayer {
    /// A decoder layer needs the encoder's memory: use
    /// [`TransformerDecoderLayer::forward_decoder`].
    fn forward(&self, _: &Tensor) -> Result<Tensor> {
        Err(Error::InvalidArgument(
            "TransformerDecoderLayer needs tgt and memory: call forward_decoder".into(),
        ))
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        // PyTorch's registration order: self_attn, multihead_attn, linear1, linear2,
        // norm1, norm2, norm3.
        self.self_attn
            .visit_parameters(&join(prefix, "self_attn"), f);
        self.multihead_attn
            .visit_parameters(&join(prefix, "multihead_attn"), f);
        self.ff
            .linear1
            .visit_parameters(&join(prefix, "linear1"), f);
        self.ff
            .linear2
            .visit_parameters(&join(prefix, "linear2"), f);
        self.norm1.visit_parameters(&join(prefix, "norm1"), f);
        self.norm2.visit_parameters(&join(prefix, "norm2"), f);
        self.norm3.visit_parameters(&join(prefix, "norm3"), f);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.self_attn.train(mode);
        self.multihead_attn.train(mode);
        self.ff.train(mode);
        for n in [&mut self.norm1, &mut self.norm2, &mut self.norm3] {
            n.train(mode);
        }
        for d in &mut self.dropouts {
            d.train(mode);
        }
    }

    fn training(&self) -> bool {
        self.training
    }
}
