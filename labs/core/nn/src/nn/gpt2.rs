//! A GPT-2-style decoder-only language model, laid out and named as nanoGPT's `GPT`
//! (which loads OpenAI's GPT-2 weights): token and position embeddings, `n_layer`
//! pre-norm blocks, a final LayerNorm, and an LM head tied to the token embedding
//! (the same tensor, so it is counted and updated once).
//!
//! ```text
//! x = drop(wte(idx) + wpe(0..T))
//! each block: x = x + attn(ln_1(x))   causal self-attention, one fused c_attn [3E, E]
//!             x = x + mlp(ln_2(x))    c_fc E -> 4E, GELU (tanh form), c_proj 4E -> E
//! logits = ln_f(x) wteᵀ
//! ```
//!
//! [`Gpt2::loss`] computes the head and its cross-entropy either as written (the
//! logits of every position, then `cross_entropy`) or, with
//! [`Gpt2::fused_classifier`] set, as one `linear_cross_entropy` over chunks of
//! positions, which never holds the whole logits.
//!
//! Parameters (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, ...,
//! `transformer.ln_f.bias`) use `nn.Linear`'s `[out, in]` layout; GPT-2 small
//! (`Gpt2Config::gpt2()`) has 124,439,808 of them. Initial values as GPT-2's: weights
//! N(0, 0.02), the residual projections (`c_proj`) N(0, 0.02 / sqrt(2 n_layer)), biases
//! zero, LayerNorms one and zero.

use super::attention::scaled_dot_product_attention;
use super::layer_checkpoint::run_layer;
use super::layer_hooks::{hooked, Hooks, Unit};
use super::multihead_attention::packed_heads;
use super::{join, Dropout, Embedding, LayerCheckpoint, LayerNorm, Linear, Module, Rng};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{Category, Tensor, IGNORE_INDEX};

/// The sizes of a GPT-2 model (nanoGPT's `GPTConfig`, biases on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpt2Config {
    pub vocab: usize,
    /// The longest sequence (the position table's rows).
    pub n_positions: usize,
    pub d_model: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Embedding, attention and residual dropout.
    pub dropout: f32,
}

impl Gpt2Config {
    /// GPT-2 small: vocabulary 50257, 1024 positions, d_model 768, 12 layers, 12 heads.
    pub fn gpt2() -> Gpt2Config {
        Gpt2Config {
            vocab: 50257,
            n_positions: 1024,
            d_model: 768,
            n_layer: 12,
            n_head: 12,
            dropout: 0.0,
        }
    }

    /// The parameter count from the shapes alone (the head is tied, so not counted):
    /// `V E + P E + n_layer (12 E² + 13 E) + 2 E`.
    pub fn num_parameters(&self) -> usize {
        self.checked_num_parameters()
            .expect("Gpt2Config: a parameter count that overflows usize")
    }

    /// [`Gpt2Config::num_parameters`], or `None` where it overflows.
    pub fn checked_num_parameters(&self) -> Option<usize> {
        let e = self.d_model;
        let square = e.checked_mul(e)?;
        // ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj: 12 E² + 13 E.
        let per_block = square.checked_mul(12)?.checked_add(e.checked_mul(13)?)?;
        let tables = self.vocab.checked_add(self.n_positions)?.checked_mul(e)?;
        tables
            .checked_add(self.n_layer.checked_mul(per_block)?)?
            .checked_add(e.checked_mul(2)?)
    }
}

/// A `Linear(in, out)` with weights N(0, std) and a zero bias.
fn normal_linear(
    inp: usize,
    out: usize,
    std: f32,
    rng: &mut Rng,
    device: &Device,
) -> Result<Linear> {
    let _parameters = Category::Parameter.scope();
    let weight = super::init::parameter(&[out, inp], device, |n| {
        rng.normal(n).into_iter().map(|v| v * std).collect()
    })?;
    let bias = Tensor::zeros(&[out], crate::tensor::DType::F32, device)?;
    Linear::from_parameters(weight, Some(bias))
}

/// Causal self-attention with the query, key and value projections in one `c_attn`.
#[derive(Clone)]
struct CausalSelfAttention {
    c_attn: Linear,
    c_proj: Linear,
    n_head: usize,
    dropout: f32,
    resid_dropout: Dropout,
    training: bool,
}

impl CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, e) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        // One product for query, key and value ([B, T, 3E]), split into heads by views.
        let qkv = self.c_attn.forward(x)?;
        let [q, k, v] = packed_heads(&qkv, self.n_head)?;
        let y = scaled_dot_product_attention(&q, &k, &v, None, true, self.dropout, self.training)?;
        let y = y.transpose(1, 2)?.reshape(&[b, t, e])?;
        self.resid_dropout.forward(&self.c_proj.forward(&y)?)
    }
}

#[derive(Clone)]
struct Block {
    ln_1: LayerNorm,
    attn: CausalSelfAttention,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
    mlp_dropout: Dropout,
}

impl Block {
    fn new(c: &Gpt2Config, rng: &mut Rng, device: &Device) -> Result<Block> {
        let e = c.d_model;
        let proj_std = 0.02 / ((2 * c.n_layer) as f32).sqrt();
        Ok(Block {
            ln_1: LayerNorm::new(&[e], 1e-5, device)?,
            attn: CausalSelfAttention {
                c_attn: normal_linear(e, 3 * e, 0.02, rng, device)?,
                c_proj: normal_linear(e, e, proj_std, rng, device)?,
                n_head: c.n_head,
                dropout: c.dropout,
                resid_dropout: Dropout::new(c.dropout)?,
                training: true,
            },
            ln_2: LayerNorm::new(&[e], 1e-5, device)?,
            c_fc: normal_linear(e, 4 * e, 0.02, rng, device)?,
            mlp_proj: normal_linear(4 * e, e, proj_std, rng, device)?,
            mlp_dropout: Dropout::new(c.dropout)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        let h = self.c_fc.forward(&self.ln_2.forward(&x)?)?.gelu("tanh")?;
        x.add(&self.mlp_dropout.forward(&self.mlp_proj.forward(&h)?)?)
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.ln_1.visit_parameters(&join(prefix, "ln_1"), f);
        self.attn
            .c_attn
            .visit_parameters(&join(prefix, "attn.c_attn"), f);
        self.attn
            .c_proj
            .visit_parameters(&join(prefix, "attn.c_proj"), f);
        self.ln_2.visit_parameters(&join(prefix, "ln_2"), f);
        self.c_fc.visit_parameters(&join(prefix, "mlp.c_fc"), f);
        self.mlp_proj
            .visit_parameters(&join(prefix, "mlp.c_proj"), f);
    }

    fn train(&mut self, mode: bool) {
        self.attn.training = mode;
        self.attn.resid_dropout.train(mode);
        self.mlp_dropout.train(mode);
    }
}

/// A GPT-2 language model; [`Module::forward`] maps int64 token ids `[B, T]` to logits
/// `[B, T, vocab]`.
pub struct Gpt2 {
    pub config: Gpt2Config,
    wte: Embedding,
    wpe: Embedding,
    drop: Dropout,
    h: Vec<Block>,
    ln_f: LayerNorm,
    /// How each block runs: directly, or in an activation checkpoint.
    pub checkpoint: LayerCheckpoint,
    /// `Some(rows)`: [`Gpt2::loss`] computes the head and its loss as one
    /// `linear_cross_entropy` over chunks of that many positions; `None` (the default):
    /// the logits, then `cross_entropy`.
    pub fused_classifier: Option<usize>,
    training: bool,
    /// Called around each block and the whole forward pass (`set_layer_hooks`).
    hooks: Hooks,
}

impl Gpt2 {
    pub fn new(config: Gpt2Config, rng: &mut Rng, device: &Device) -> Result<Gpt2> {
        let c = config;
        if c.checked_num_parameters().is_none() {
            return Err(Error::InvalidArgument(format!(
                "Gpt2: the parameters of vocabulary {}, {} positions, d_model {} and {} \
                 layers overflow",
                c.vocab, c.n_positions, c.d_model, c.n_layer
            )));
        }
        if c.n_head == 0 || !c.d_model.is_multiple_of(c.n_head) {
            return Err(Error::InvalidArgument(format!(
                "Gpt2: d_model {} must be divisible by n_head {}",
                c.d_model, c.n_head
            )));
        }
        let table = |rows: usize, rng: &mut Rng| -> Result<Embedding> {
            let _parameters = Category::Parameter.scope();
            Embedding::from_weight(super::init::parameter(&[rows, c.d_model], device, |n| {
                rng.normal(n).into_iter().map(|v| v * 0.02).collect()
            })?)
        };
        let wte = table(c.vocab, rng)?;
        let wpe = table(c.n_positions, rng)?;
        let h = (0..c.n_layer)
            .map(|_| Block::new(&c, rng, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt2 {
            config: c,
            wte,
            wpe,
            drop: Dropout::new(c.dropout)?,
            h,
            ln_f: LayerNorm::new(&[c.d_model], 1e-5, device)?,
            checkpoint: LayerCheckpoint::Off,
            fused_classifier: None,
            training: true,
            hooks: None,
        })
    }

    /// The LM head's weight, which is the token embedding's (`lm_head.weight is
    /// wte.weight`).
    pub fn lm_head_weight(&self) -> &Tensor {
        &self.wte.weight
    }

    /// The mean cross-entropy of the next-token predictions: `logits(idx)` against
    /// `targets` (int64 `[B, T]`, `IGNORE_INDEX` (-100) skipping a position), as
    /// nanoGPT's `forward(idx, targets)`.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        if targets.shape() != idx.shape() {
            return Err(Error::Shape {
                op: "Gpt2::loss (targets against idx)",
                a: targets.shape().to_vec(),
                b: idx.shape().to_vec(),
            });
        }
        let n = idx.numel();
        let targets = targets.reshape(&[n])?;
        // ANCHOR: loss
        let Some(chunk_rows) = self.fused_classifier else {
            return self
                .forward(idx)?
                .reshape(&[n, self.config.vocab])?
                .cross_entropy(&targets, IGNORE_INDEX);
        };
        // The head inside the forward pass's hooks, as the logits are.
        self.run(idx, |x| {
            x.reshape(&[n, self.config.d_model])?.linear_cross_entropy(
                &self.wte.weight,
                None,
                &targets,
                IGNORE_INDEX,
                chunk_rows,
            )
        })
        // ANCHOR_END: loss
    }

    /// The blocks over `idx` and the final LayerNorm, then `head` of the result, all
    /// inside the hooks around the whole forward pass.
    fn run(&self, idx: &Tensor, head: impl FnOnce(Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let [_, t] = idx.shape() else {
            return Err(Error::InvalidArgument(format!(
                "Gpt2: idx must be int64 token ids [batch, seq], got {:?}",
                idx.shape()
            )));
        };
        let t = *t;
        if t > self.config.n_positions {
            return Err(Error::InvalidArgument(format!(
                "Gpt2: cannot forward a sequence of length {t}, the block size is only {}",
                self.config.n_positions
            )));
        }
        hooked(&self.hooks, Unit::Root, || {
            let pos = Tensor::arange(0, t, idx.device())?;
            let mut x = self
                .drop
                .forward(&self.wte.forward(idx)?.add(&self.wpe.forward(&pos)?)?)?;
            for (i, block) in self.h.iter().enumerate() {
                x = hooked(&self.hooks, Unit::Layer(i), || {
                    if self.checkpoint.is_off() {
                        block.forward(&x)
                    } else {
                        let block = block.clone();
                        run_layer(&self.checkpoint, &[x.clone()], move |xs| {
                            block.forward(&xs[0])
                        })
                    }
                })?;
            }
            head(self.ln_f.forward(&x)?)
        })
    }
}

impl Module for Gpt2 {
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.run(idx, |x| x.matmul(&self.wte.weight.transpose(0, 1)?))
    }

    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        let p = join(prefix, "transformer");
        self.wte.visit_parameters(&join(&p, "wte"), f);
        self.wpe.visit_parameters(&join(&p, "wpe"), f);
        let h = join(&p, "h");
        for (i, block) in self.h.iter().enumerate() {
            block.visit_parameters(&join(&h, &i.to_string()), f);
        }
        self.ln_f.visit_parameters(&join(&p, "ln_f"), f);
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.drop.train(mode);
        for b in &mut self.h {
            b.train(mode);
        }
    }

    fn training(&self) -> bool {
        self.training
    }

    fn layer_prefixes(&self) -> Vec<String> {
        (0..self.h.len())
            .map(|i| format!("transformer.h.{i}"))
            .collect()
    }

    fn set_layer_hooks(&mut self, hooks: Hooks) -> Result<()> {
        self.hooks = hooks;
        Ok(())
    }
}
