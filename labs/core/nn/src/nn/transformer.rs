//! `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer` with PyTorch's options
//! (`activation` relu or gelu, `norm_first`; `batch_first=True` inputs
//! `[batch, seq, d_model]`) and parameter names. Post-norm (the default) and pre-norm:
//!
//! ```text
//! encoder, post-norm: x = norm1(x + dropout1(self_attn(x, x, x, mask)))
//!                     x = norm2(x + dropout2(linear2(dropout(act(linear1(x))))))
//! encoder, pre-norm:  x = x + dropout1(self_attn(norm1(x), ..))
//!                     x = x + dropout2(ff(norm2(x)))
//! decoder, post-norm: x = norm1(x + dropout1(self_attn(x, x, x, tgt_mask)))
//!                     x = norm2(x + dropout2(multihead_attn(x, mem, mem, memory_mask)))
//!                     x = norm3(x + dropout3(ff(x)))
//! decoder, pre-norm:  the same blocks on norm1(x), norm2(x), norm3(x), added to x.
//! ```
//!
//! The attention blocks ask for no weights (`need_weights=False`, as PyTorch's layers
//! do), so they go through `scaled_dot_product_attention`.

use super::{join, AttentionMasks, Dropout, LayerNorm, Linear, Module, MultiheadAttention, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The feed-forward activation (`activation="relu"` or `"gelu"`, the exact GELU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    #[default]
    Relu,
    Gelu,
}

impl Activation {
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu("none"),
        }
    }
}

/// The sizes and options of a layer, PyTorch's constructor arguments (`d_model`,
/// `nhead`, `dim_feedforward`, `dropout`, `activation`, `layer_norm_eps`,
/// `norm_first`; `batch_first` is always true here).
#[derive(Debug, Clone, Copy)]
pub struct TransformerConfig {
    pub d_model: usize,
    pub nhead: usize,
    pub dim_feedforward: usize,
    pub dropout: f32,
    pub activation: Activation,
    pub layer_norm_eps: f32,
    pub norm_first: bool,
}

impl TransformerConfig {
    /// PyTorch's defaults besides the two sizes: `dim_feedforward=2048`,
    /// `dropout=0.1`, ReLU, `layer_norm_eps=1e-5`, post-norm.
    pub fn new(d_model: usize, nhead: usize) -> TransformerConfig {
        TransformerConfig {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
        }
    }
}

impl Default for TransformerConfig {
    /// `nn.Transformer`'s sizes: `d_model=512, nhead=8` and the defaults above.
    fn default() -> Self {
        TransformerConfig::new(512, 8)
    }
}

/// The feed-forward block both layers end with.
#[derive(Clone)]
struct FeedForward {
    linear1: Linear,
    dropout: Dropout,
    linear2: Linear,
    activation: Activation,
}

impl FeedForward {
    fn new(c: &TransformerConfig, rng: &mut Rng, device: &Device) -> Result<FeedForward> {
        Ok(FeedForward {
            linear1: Linear::new(c.d_model, c.dim_feedforward, true, rng, device)?,
            dropout: Dropout::new(c.dropout)?,
            linear2: Linear::new(c.dim_feedforward, c.d_model, true, rng, device)?,
            activation: c.activation,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.activation.apply(&self.linear1.forward(x)?)?;
        self.linear2.forward(&self.dropout.forward(&h)?)
    }

    fn train(&mut self, mode: bool) {
        self.linear1.train(mode);
        self.dropout.train(mode);
        self.linear2.train(mode);
    }
}

/// `x + dropout(block(norm(x)))` (pre-norm) or `norm(x + dropout(block(x)))`
/// (post-norm).
fn residual(
    x: &Tensor,
    norm: &LayerNorm,
    dropout: &Dropout,
    norm_first: bool,
    block: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if norm_first {
        x.add(&dropout.forward(&block(&norm.forward(x)?)?)?)
    } else {
        norm.forward(&x.add(&dropout.forward(&block(x)?)?)?)
    }
}

#[derive(Clone)]
pub struct TransformerEncoderLayer {
    pub config: TransformerConfig,
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
            config: c,
            self_attn: MultiheadAttention::new(c.d_model, c.nhead, c.dropout, rng, device)?,
            ff: FeedForward::new(&c, rng, device)?,
            norm1: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            norm2: LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)?,
            dropout1: Dropout::new(c.dropout)?,
            dropout2: Dropout::new(c.dropout)?,
            training: true,
        })
    }

    /// The layer over `src [batch, seq, d_model]` with an optional `src_mask`
    /// `[seq, seq]` (additive float or uint8).
    pub fn forward_masked(&self, src: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_with(src, AttentionMasks::attn(mask))
    }

    /// PyTorch's `forward(src, src_mask, src_key_padding_mask, is_causal)`, the masks
    /// gathered in `masks`.
    pub fn forward_with(&self, src: &Tensor, masks: AttentionMasks) -> Result<Tensor> {
        let nf = self.config.norm_first;
        let x = residual(src, &self.norm1, &self.dropout1, nf, |h| {
            Ok(self.self_attn.forward_qkv(h, h, h, masks, false)?.0)
        })?;
        residual(&x, &self.norm2, &self.dropout2, nf, |h| self.ff.forward(h))
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

/// The masks of a decoder call (`tgt_mask`, `memory_mask`, the two key-padding masks,
/// `tgt_is_causal`, `memory_is_causal`), as [`AttentionMasks`] of its two attentions.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecoderMasks<'a> {
    /// Self-attention over the target.
    pub tgt: AttentionMasks<'a>,
    /// Cross-attention over the memory.
    pub memory: AttentionMasks<'a>,
}

#[derive(Clone)]
pub struct TransformerDecoderLayer {
    pub config: TransformerConfig,
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
            config: c,
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
    /// d_model]`, with optional `tgt_mask [tgt_len, tgt_len]` and `memory_mask
    /// [tgt_len, src_len]`.
    pub fn forward_decoder(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_mask: Option<&Tensor>,
        memory_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let masks = DecoderMasks {
            tgt: AttentionMasks::attn(tgt_mask),
            memory: AttentionMasks::attn(memory_mask),
        };
        self.forward_with(tgt, memory, masks)
    }

    /// PyTorch's `forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
    /// memory_key_padding_mask, tgt_is_causal, memory_is_causal)`.
    pub fn forward_with(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: DecoderMasks,
    ) -> Result<Tensor> {
        let nf = self.config.norm_first;
        let [d1, d2, d3] = &self.dropouts;
        let x = residual(tgt, &self.norm1, d1, nf, |h| {
            Ok(self.self_attn.forward_qkv(h, h, h, masks.tgt, false)?.0)
        })?;
        let x = residual(&x, &self.norm2, d2, nf, |h| {
            Ok(self
                .multihead_attn
                .forward_qkv(h, memory, memory, masks.memory, false)?
                .0)
        })?;
        residual(&x, &self.norm3, d3, nf, |h| self.ff.forward(h))
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
