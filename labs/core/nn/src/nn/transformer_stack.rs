//! `nn.TransformerEncoder`, `nn.TransformerDecoder` (N copies of a layer, then an
//! optional final norm) and `nn.Transformer` (an encoder and a decoder, each ending
//! with a LayerNorm), with PyTorch's parameter names: `layers.0.self_attn.in_proj_weight`,
//! `norm.weight`; `encoder.layers.5.linear2.bias`, `decoder.norm.bias`.
//!
//! As in PyTorch, a stack's layers start as copies of one layer (`copy.deepcopy`), and
//! `nn.Transformer` then re-draws every matrix Xavier-uniform (`_reset_parameters`),
//! so its layers differ.

use super::layer_checkpoint::{run_layer, OwnedMasks};
use super::layer_hooks::{hooked, Hooks, Unit};
use super::{
    join, AttentionMasks, DecoderMasks, LayerCheckpoint, LayerNorm, Module, Rng, TransformerConfig,
    TransformerDecoderLayer, TransformerEncoderLayer,
};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{Category, Tensor};

/// `n` copies of `first` (made by `make`, values copied from `first`).
fn clones<L: Module>(first: L, n: usize, make: impl Fn() -> Result<L>) -> Result<Vec<L>> {
    if n == 0 {
        return Err(Error::InvalidArgument(
            "a transformer stack needs at least one layer".into(),
        ));
    }
    let state = first.state_dict();
    let mut layers = vec![first];
    for _ in 1..n {
        let mut layer = make()?;
        layer.load_state_dict(&state)?;
        layer.train(layers[0].training());
        layers.push(layer);
    }
    Ok(layers)
}

/// A final `LayerNorm(d_model, eps)` of a layer's config.
fn final_norm(c: &TransformerConfig, device: &Device) -> Result<LayerNorm> {
    LayerNorm::new(&[c.d_model], c.layer_norm_eps, device)
}

pub struct TransformerEncoder {
    pub layers: Vec<TransformerEncoderLayer>,
    pub norm: Option<LayerNorm>,
    /// How each layer runs: directly, or in an activation checkpoint.
    pub checkpoint: LayerCheckpoint,
    training: bool,
    /// Called around each layer, as layer `first + i` (set by the [`Transformer`]).
    hooks: Hooks,
    first: usize,
}

impl TransformerEncoder {
    /// `nn.TransformerEncoder(encoder_layer, num_layers, norm)`: `num_layers` copies
    /// of `layer`, then `norm` if given.
    pub fn new(
        layer: TransformerEncoderLayer,
        num_layers: usize,
        norm: Option<LayerNorm>,
        device: &Device,
    ) -> Result<TransformerEncoder> {
        let c = layer.config;
        // The copies' initial draws are overwritten: any seed serves.
        let layers = clones(layer, num_layers, || {
            TransformerEncoderLayer::new(c, &mut Rng::seeded(0), device)
        })?;
        Ok(TransformerEncoder {
            layers,
            norm,
            checkpoint: LayerCheckpoint::Off,
            training: true,
            hooks: None,
            first: 0,
        })
    }

    /// `forward(src, mask, src_key_padding_mask, is_causal)`.
    pub fn forward_with(&self, src: &Tensor, masks: AttentionMasks) -> Result<Tensor> {
        let mut x = src.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = hooked(&self.hooks, Unit::Layer(self.first + i), || {
                if self.checkpoint.is_off() {
                    layer.forward_with(&x, masks)
                } else {
                    let (layer, masks) = (layer.clone(), OwnedMasks::new(masks));
                    run_layer(&self.checkpoint, &[x.clone()], move |xs| {
                        layer.forward_with(&xs[0], masks.borrow())
                    })
                }
            })?;
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

impl Module for TransformerEncoder {
    fn forward(&self, src: &Tensor) -> Result<Tensor> {
        self.forward_with(src, AttentionMasks::default())
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        let layers = join(prefix, "layers");
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_parameters(&join(&layers, &i.to_string()), f);
        }
        if let Some(n) = &self.norm {
            n.visit_parameters(&join(prefix, "norm"), f);
        }
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.layers.iter_mut().for_each(|l| l.train(mode));
        if let Some(n) = &mut self.norm {
            n.train(mode);
        }
    }

    fn training(&self) -> bool {
        self.training
    }
}

pub struct TransformerDecoder {
    pub layers: Vec<TransformerDecoderLayer>,
    pub norm: Option<LayerNorm>,
    /// How each layer runs: directly, or in an activation checkpoint (the memory is
    /// an input of each region, so its gradient flows back to the encoder).
    pub checkpoint: LayerCheckpoint,
    training: bool,
    /// Called around each layer, as layer `first + i` (set by the [`Transformer`]).
    hooks: Hooks,
    first: usize,
}

impl TransformerDecoder {
    /// `nn.TransformerDecoder(decoder_layer, num_layers, norm)`.
    pub fn new(
        layer: TransformerDecoderLayer,
        num_layers: usize,
        norm: Option<LayerNorm>,
        device: &Device,
    ) -> Result<TransformerDecoder> {
        let c = layer.config;
        let layers = clones(layer, num_layers, || {
            TransformerDecoderLayer::new(c, &mut Rng::seeded(0), device)
        })?;
        Ok(TransformerDecoder {
            layers,
            norm,
            checkpoint: LayerCheckpoint::Off,
            training: true,
            hooks: None,
            first: 0,
        })
    }

    /// `forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
    /// memory_key_padding_mask, tgt_is_causal, memory_is_causal)`.
    pub fn forward_with(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: DecoderMasks,
    ) -> Result<Tensor> {
        let mut x = tgt.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = hooked(&self.hooks, Unit::Layer(self.first + i), || {
                if self.checkpoint.is_off() {
                    layer.forward_with(&x, memory, masks)
                } else {
                    let layer = layer.clone();
                    let (tgt, mem) = (OwnedMasks::new(masks.tgt), OwnedMasks::new(masks.memory));
                    run_layer(&self.checkpoint, &[x.clone(), memory.clone()], move |xs| {
                        let masks = DecoderMasks {
                            tgt: tgt.borrow(),
                            memory: mem.borrow(),
                        };
                        layer.forward_with(&xs[0], &xs[1], masks)
                    })
                }
            })?;
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

impl Module for TransformerDecoder {
    /// A decoder needs the encoder's memory: use [`TransformerDecoder::forward_with`].
    fn forward(&self, _: &Tensor) -> Result<Tensor> {
        Err(Error::InvalidArgument(
            "TransformerDecoder needs tgt and memory: call forward_with".into(),
        ))
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        let layers = join(prefix, "layers");
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_parameters(&join(&layers, &i.to_string()), f);
        }
        if let Some(n) = &self.norm {
            n.visit_parameters(&join(prefix, "norm"), f);
        }
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.layers.iter_mut().for_each(|l| l.train(mode));
        if let Some(n) = &mut self.norm {
            n.train(mode);
        }
    }

    fn training(&self) -> bool {
        self.training
    }
}

/// `nn.Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers,
/// dim_feedforward, dropout, activation, layer_norm_eps, batch_first=True,
/// norm_first)`: parameters `encoder.*` then `decoder.*`.
pub struct Transformer {
    pub encoder: TransformerEncoder,
    pub decoder: TransformerDecoder,
    training: bool,
}

impl Transformer {
    /// PyTorch's defaults are `Transformer::new(TransformerConfig::default(), 6, 6, ..)`
    /// (`d_model=512, nhead=8, dim_feedforward=2048, dropout=0.1`).
    pub fn new(
        c: TransformerConfig,
        num_encoder_layers: usize,
        num_decoder_layers: usize,
        rng: &mut Rng,
        device: &Device,
    ) -> Result<Transformer> {
        let encoder = TransformerEncoder::new(
            TransformerEncoderLayer::new(c, rng, device)?,
            num_encoder_layers,
            Some(final_norm(&c, device)?),
            device,
        )?;
        let decoder = TransformerDecoder::new(
            TransformerDecoderLayer::new(c, rng, device)?,
            num_decoder_layers,
            Some(final_norm(&c, device)?),
            device,
        )?;
        let model = Transformer {
            encoder,
            decoder,
            training: true,
        };
        model.reset_parameters(rng)?;
        Ok(model)
    }

    /// `_reset_parameters`: every parameter of more than one dimension re-drawn
    /// `xavier_uniform_` (bound `sqrt(6 / (fan_in + fan_out))`), in parameter order.
    fn reset_parameters(&self, rng: &mut Rng) -> Result<()> {
        let _parameters = Category::Parameter.scope();
        let mut state = Vec::new();
        for (name, p) in self.named_parameters() {
            let t = match p.shape() {
                &[fan_out, fan_in] => {
                    let bound = (6.0 / (fan_in + fan_out).max(1) as f32).sqrt();
                    Tensor::from_slice(&rng.uniform(p.numel(), bound), p.shape(), p.device())?
                }
                _ => p.detach(),
            };
            state.push((name, t));
        }
        self.load_state_dict(&state)
    }

    /// `forward(src, tgt, src_mask, tgt_mask, memory_mask)`: `src [batch, src_len,
    /// d_model]`, `tgt [batch, tgt_len, d_model]`, the masks additive float or uint8
    /// (`[src_len, src_len]`, `[tgt_len, tgt_len]`, `[tgt_len, src_len]`).
    pub fn forward_seq2seq(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        src_mask: Option<&Tensor>,
        tgt_mask: Option<&Tensor>,
        memory_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.forward_with(
            src,
            tgt,
            AttentionMasks::attn(src_mask),
            DecoderMasks {
                tgt: AttentionMasks::attn(tgt_mask),
                memory: AttentionMasks::attn(memory_mask),
            },
        )
    }

    /// The forward with every mask PyTorch's takes (key-padding masks and causal
    /// flags too): `src_masks` for the encoder, `masks` for the decoder (the memory
    /// key-padding mask is `masks.memory.key_padding_mask`).
    pub fn forward_with(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        src_masks: AttentionMasks,
        masks: DecoderMasks,
    ) -> Result<Tensor> {
        if src.shape().len() != 3 || tgt.shape().len() != 3 || src.shape()[0] != tgt.shape()[0] {
            return Err(Error::InvalidArgument(format!(
                "Transformer: src {:?} and tgt {:?} must be [batch, seq, d_model] with the \
                 same batch",
                src.shape(),
                tgt.shape()
            )));
        }
        hooked(&self.encoder.hooks, Unit::Root, || {
            let memory = self.encoder.forward_with(src, src_masks)?;
            self.decoder.forward_with(tgt, &memory, masks)
        })
    }

    /// Runs every encoder and decoder layer as `mode` says.
    pub fn set_checkpoint(&mut self, mode: LayerCheckpoint) {
        self.encoder.checkpoint = mode.clone();
        self.decoder.checkpoint = mode;
    }
}

impl Module for Transformer {
    /// A transformer needs a source and a target: use [`Transformer::forward_seq2seq`].
    fn forward(&self, _: &Tensor) -> Result<Tensor> {
        Err(Error::InvalidArgument(
            "Transformer needs src and tgt: call forward_seq2seq".into(),
        ))
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.encoder.visit_parameters(&join(prefix, "encoder"), f);
        self.decoder.visit_parameters(&join(prefix, "decoder"), f);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.encoder.train(mode);
        self.decoder.train(mode);
    }

    fn training(&self) -> bool {
        self.training
    }

    /// The encoder's layers, then the decoder's.
    fn layer_prefixes(&self) -> Vec<String> {
        let encoder = (0..self.encoder.layers.len()).map(|i| format!("encoder.layers.{i}"));
        let decoder = (0..self.decoder.layers.len()).map(|i| format!("decoder.layers.{i}"));
        encoder.chain(decoder).collect()
    }

    /// The root's hooks are called through the encoder's.
    fn set_layer_hooks(&mut self, hooks: Hooks) -> Result<()> {
        self.decoder.first = self.encoder.layers.len();
        self.decoder.hooks = hooks.clone();
        self.encoder.hooks = hooks;
        Ok(())
    }
}
