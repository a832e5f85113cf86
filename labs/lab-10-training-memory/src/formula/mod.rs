//! The activation memory of a step as a formula (Korthikanti et al.'s terms in `s`
//! sequence, `b` batch, `h` hidden, `a` heads, written out for the labs' two models),
//! set beside what the dry run's allocator counts.
//!
//! Each term is one tensor autograd keeps from the forward pass to the backward pass,
//! in one layer (or outside the layers: embeddings, final norms, the loss), as the
//! models of `labs-train` build them: which ops save what, in which dtype, with
//! dropout or not, on the fused or the math attention path, with every layer
//! checkpointed or not. A term is `count` allocations of `coef` bytes per unit of its
//! [`Unit`] (`4·s·b·h` is `coef` 4 of [`Unit::Sbh`]); its exact bytes on a device are
//! each allocation rounded as the allocator rounds, so the formula's sum and the dry
//! run's `activation` category after the forward pass agree to the byte
//! ([`Comparison::unexplained`] is 0 for every configuration the tests try).

mod compare;

pub use compare::*;

use std::fmt::Write as _;

use anyhow::{bail, Result};
use labs_core::alloc::round_size;
use labs_core::nn::{sdpa_kernel, SdpaBackend};
use labs_core::tensor::autocast;
use labs_train::model::Batch;
use labs_train::{AmpMode, AttentionMode, CheckpointMode, ModelKind, TrainConfig};

const MIB: f64 = (1u64 << 20) as f64;

/// What a term's coefficient multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unit {
    /// `s·b·h`: one value per position and hidden unit.
    Sbh,
    /// `s·b·f`: one per position and feed-forward unit (`f` = 4h in GPT-2).
    Sbf,
    /// `a·s²·b`: one per head, query and key (attention's scores).
    Ass,
    /// `a·s·b`: one per head and query row.
    Asb,
    /// `s·b`: one per position.
    Sb,
    /// `s`: one per position of a sequence.
    S,
    /// `s·b·V`: one per position and vocabulary entry (the logits).
    Sbv,
    /// `h²`: a weight.
    Hh,
    /// `V·h`: the embedding table.
    Vh,
    /// One.
    One,
}

impl Unit {
    /// The unit's symbol, as the chapter writes it.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Sbh => "s·b·h",
            Unit::Sbf => "s·b·f",
            Unit::Ass => "a·s²·b",
            Unit::Asb => "a·s·b",
            Unit::Sb => "s·b",
            Unit::S => "s",
            Unit::Sbv => "s·b·V",
            Unit::Hh => "h²",
            Unit::Vh => "V·h",
            Unit::One => "1",
        }
    }

    /// The unit's value for `c`.
    pub fn value(self, c: &TrainConfig) -> u64 {
        let (s, b, h, a) = (
            c.seq as u64,
            c.batch as u64,
            c.d_model as u64,
            c.nhead as u64,
        );
        match self {
            Unit::Sbh => s * b * h,
            Unit::Sbf => s * b * c.ffn as u64,
            Unit::Ass => a * s * s * b,
            Unit::Asb => a * s * b,
            Unit::Sb => s * b,
            Unit::S => s,
            Unit::Sbv => s * b * c.vocab as u64,
            Unit::Hh => h * h,
            Unit::Vh => c.vocab as u64 * h,
            Unit::One => 1,
        }
    }
}

/// One saved tensor of the formula: `count` allocations of `coef` bytes per unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// Which layer it belongs to (`encoder`, `decoder`, `block`) or `outside`.
    pub part: &'static str,
    pub name: &'static str,
    /// Bytes per unit: the element's size times the elements per unit.
    pub coef: u64,
    pub unit: Unit,
    /// Allocations; negative for a tensor counted elsewhere (a layer input that is the
    /// batch itself, counted as `input`).
    pub count: i64,
}

impl Term {
    /// The bytes of one allocation.
    pub fn each(&self, c: &TrainConfig) -> u64 {
        self.coef * self.unit.value(c)
    }

    /// The formula's bytes: `count · coef · unit`.
    pub fn bytes(&self, c: &TrainConfig) -> i64 {
        self.count * self.each(c) as i64
    }

    /// The bytes on the device: each allocation rounded as the allocator rounds.
    pub fn rounded(&self, c: &TrainConfig) -> i64 {
        self.count * round_size(self.each(c), 0) as i64
    }
}

/// The activation formula of one configuration.
#[derive(Debug, Clone)]
pub struct Formula {
    /// The saved tensors of one layer (the Transformer's: one encoder and one decoder
    /// layer, as `--layers` counts each).
    pub per_layer: Vec<Term>,
    /// `L`: how many times `per_layer` is kept.
    pub layers: usize,
    /// Saved tensors outside the layers: embeddings, final norms, the loss.
    pub outside: Vec<Term>,
}

/// The terms `c`'s forward pass keeps, or why the formula does not cover it.
pub fn formula(c: &TrainConfig) -> Result<Formula> {
    if c.checkpoint == CheckpointMode::Selective {
        bail!("formula: --checkpoint selective keeps what a policy says; the formula covers none and layers");
    }
    if c.offload {
        bail!("formula: --offload moves saved tensors to the host; the formula counts those on the device without it");
    }
    let e = bytes_per_element(c.amp);
    let t = Terms {
        e,
        dropout: c.dropout > 0.0,
        fused: c.attention == AttentionMode::Fused,
        half: c.amp != AmpMode::None,
    };
    let checkpointed = c.checkpoint == CheckpointMode::Layers;
    Ok(match c.model {
        ModelKind::Gpt2 => Formula {
            per_layer: if checkpointed {
                vec![term(
                    "block",
                    "block input (the residual stream, float32)",
                    4,
                    Unit::Sbh,
                )]
            } else {
                t.gpt2_block()
            },
            layers: c.layers,
            outside: t.gpt2_outside(),
        },
        ModelKind::Transformer => {
            let (per_layer, mut outside) = if checkpointed {
                (
                    vec![
                        term("encoder", "layer input (float32)", 4, Unit::Sbh),
                        term("decoder", "layer input (float32)", 4, Unit::Sbh),
                    ],
                    vec![
                        Term {
                            count: -2,
                            ..term(
                                "outside",
                                "the first layers' inputs: the batch, counted as input",
                                4,
                                Unit::Sbh,
                            )
                        },
                        term(
                            "outside",
                            "memory (the encoder's output), an input of every decoder checkpoint",
                            4,
                            Unit::Sbh,
                        ),
                    ],
                )
            } else {
                let mut layer = t.encoder_layer();
                layer.extend(t.decoder_layer());
                (layer, Vec::new())
            };
            outside.extend(t.transformer_outside());
            Formula {
                per_layer,
                layers: c.layers,
                outside,
            }
        }
    })
}

/// `e`: the bytes of most saved values, 4 in float32 and 2 under autocast.
pub fn bytes_per_element(amp: AmpMode) -> u64 {
    match amp {
        AmpMode::None => 4,
        AmpMode::Bf16 | AmpMode::F16 => 2,
    }
}

fn term(part: &'static str, name: &'static str, coef: u64, unit: Unit) -> Term {
    Term {
        part,
        name,
        coef,
        unit,
        count: 1,
    }
}

/// The choices the terms depend on.
struct Terms {
    e: u64,
    dropout: bool,
    fused: bool,
    half: bool,
}

impl Terms {
    // ANCHOR: attention_core
    /// Attention's own saved tensors besides q, k and v: on the fused path its output
    /// and one log-sum-exp per query row; on the math path the scaled query, the
    /// softmax (float32 under autocast too), and with dropout its mask and the dropped
    /// weights (the product reads the softmax's own output when neither dropout nor a
    /// cast comes between).
    fn attention_core(&self, part: &'static str, out: &mut Vec<Term>) {
        let e = self.e;
        if self.fused {
            out.push(term(
                part,
                "attention output, kept by the fused kernel",
                e,
                Unit::Sbh,
            ));
            out.push(term(
                part,
                "log-sum-exp of each query row (float32)",
                4,
                Unit::Asb,
            ));
            return;
        }
        out.push(term(part, "query scaled by 1/sqrt(h/a)", e, Unit::Sbh));
        out.push(term(part, "softmax output (float32)", 4, Unit::Ass));
        if self.dropout {
            out.push(term(part, "attention dropout mask", 1, Unit::Ass));
        }
        if self.dropout || e != 4 {
            out.push(term(
                part,
                "attention weights as the product with v reads them",
                e,
                Unit::Ass,
            ));
        }
    }
    // ANCHOR_END: attention_core

    fn mask(&self, part: &'static str, name: &'static str, unit: Unit, out: &mut Vec<Term>) {
        if self.dropout {
            out.push(term(part, name, 1, unit));
        }
    }

    fn norm(part: &'static str, input: &'static str, stats: &'static str, out: &mut Vec<Term>) {
        out.push(term(part, input, 4, Unit::Sbh));
        out.push(Term {
            count: 2,
            ..term(part, stats, 4, Unit::Sb)
        });
    }

    /// `nn.MultiheadAttention` self-attention as PyTorch lays it out (batch first), its
    /// residual dropout and post-norm.
    fn self_attention(
        &self,
        part: &'static str,
        norm: &'static str,
        stats: &'static str,
        mask: &'static str,
        out: &mut Vec<Term>,
    ) {
        let e = self.e;
        out.push(term(
            part,
            "input folded into a dense copy for in_proj",
            e,
            Unit::Sbh,
        ));
        out.push(term(
            part,
            "q, k, v: in_proj's output made contiguous",
            3 * e,
            Unit::Sbh,
        ));
        self.attention_core(part, out);
        out.push(term(
            part,
            "heads joined into a dense copy for out_proj",
            e,
            Unit::Sbh,
        ));
        self.mask(part, mask, Unit::Sbh, out);
        Terms::norm(part, norm, stats, out);
    }

    /// The feed-forward block, its residual dropout and post-norm.
    fn feed_forward(
        &self,
        part: &'static str,
        norm: &'static str,
        stats: &'static str,
        mask: &'static str,
        out: &mut Vec<Term>,
    ) {
        let e = self.e;
        out.push(term(
            part,
            "linear1 input (the norm's output)",
            e,
            Unit::Sbh,
        ));
        out.push(term(part, "ReLU output", e, Unit::Sbf));
        if self.dropout {
            out.push(term(part, "feed-forward dropout mask", 1, Unit::Sbf));
            out.push(term(
                part,
                "linear2 input (the dropout's output)",
                e,
                Unit::Sbf,
            ));
        }
        self.mask(part, mask, Unit::Sbh, out);
        Terms::norm(part, norm, stats, out);
    }

    fn encoder_layer(&self) -> Vec<Term> {
        let mut out = Vec::new();
        let p = "encoder";
        self.self_attention(
            p,
            "norm1 input (float32)",
            "norm1 mean and 1/std",
            "dropout1 mask",
            &mut out,
        );
        self.feed_forward(
            p,
            "norm2 input (float32)",
            "norm2 mean and 1/std",
            "dropout2 mask",
            &mut out,
        );
        out
    }

    fn decoder_layer(&self) -> Vec<Term> {
        let (e, p) = (self.e, "decoder");
        let mut out = Vec::new();
        self.self_attention(
            p,
            "norm1 input (float32)",
            "norm1 mean and 1/std",
            "dropout1 mask",
            &mut out,
        );
        out.push(term(
            p,
            "cross-attention: query input folded into a copy",
            e,
            Unit::Sbh,
        ));
        out.push(term(
            p,
            "cross-attention: memory folded into a copy for the key/value projection",
            e,
            Unit::Sbh,
        ));
        if self.half {
            // Slices of in_proj_weight are not leaves: autocast does not cache their casts.
            out.push(term(
                p,
                "cross-attention: query weight cast to half",
                2,
                Unit::Hh,
            ));
            out.push(term(
                p,
                "cross-attention: key/value weight cast to half",
                4,
                Unit::Hh,
            ));
        }
        if self.fused {
            out.push(term(
                p,
                "cross-attention: query made contiguous",
                e,
                Unit::Sbh,
            ));
        }
        out.push(term(
            p,
            "cross-attention: key, value (packed)",
            2 * e,
            Unit::Sbh,
        ));
        self.attention_core(p, &mut out);
        out.push(term(
            p,
            "cross-attention: heads joined into a copy for out_proj",
            e,
            Unit::Sbh,
        ));
        self.mask(p, "dropout2 mask", Unit::Sbh, &mut out);
        Terms::norm(p, "norm2 input (float32)", "norm2 mean and 1/std", &mut out);
        self.feed_forward(
            p,
            "norm3 input (float32)",
            "norm3 mean and 1/std",
            "dropout3 mask",
            &mut out,
        );
        out
    }

    fn transformer_outside(&self) -> Vec<Term> {
        let mut out = Vec::new();
        let p = "outside";
        Terms::norm(
            p,
            "encoder's final norm input",
            "encoder's final norm mean and 1/std",
            &mut out,
        );
        Terms::norm(
            p,
            "decoder's final norm input",
            "decoder's final norm mean and 1/std",
            &mut out,
        );
        out.push(term(
            p,
            "MSE loss input (the model's output, float32)",
            4,
            Unit::Sbh,
        ));
        out
    }

    // ANCHOR: gpt2_block
    /// A pre-norm GPT-2 block: LayerNorm, causal self-attention, residual; LayerNorm,
    /// MLP (4h, GELU), residual. The residual stream stays float32 under autocast.
    fn gpt2_block(&self) -> Vec<Term> {
        let (e, p) = (self.e, "block");
        let mut out = Vec::new();
        Terms::norm(
            p,
            "ln_1 input: the residual stream (float32)",
            "ln_1 mean and 1/std",
            &mut out,
        );
        out.push(term(p, "c_attn input (ln_1's output)", e, Unit::Sbh));
        out.push(term(p, "q, k, v: c_attn's output", 3 * e, Unit::Sbh));
        self.attention_core(p, &mut out);
        if !self.fused {
            out.push(term(p, "heads joined into a copy for c_proj", e, Unit::Sbh));
        }
        self.mask(p, "dropout mask after the attention", Unit::Sbh, &mut out);
        Terms::norm(p, "ln_2 input (float32)", "ln_2 mean and 1/std", &mut out);
        out.push(term(p, "c_fc input (ln_2's output)", e, Unit::Sbh));
        out.push(term(
            p,
            "GELU input (c_fc's output, 4h wide)",
            4 * e,
            Unit::Sbh,
        ));
        out.push(term(
            p,
            "MLP c_proj input (GELU's output, 4h wide)",
            4 * e,
            Unit::Sbh,
        ));
        self.mask(p, "dropout mask after the MLP", Unit::Sbh, &mut out);
        out
    }
    // ANCHOR_END: gpt2_block

    fn gpt2_outside(&self) -> Vec<Term> {
        let (e, p) = (self.e, "outside");
        // The token ids are the batch (counted as input); the positions are made here.
        let mut out = vec![term(
            p,
            "position ids (int64), kept by the position embedding",
            8,
            Unit::S,
        )];
        self.mask(p, "embedding dropout mask", Unit::Sbh, &mut out);
        Terms::norm(p, "ln_f input (float32)", "ln_f mean and 1/std", &mut out);
        out.push(term(p, "LM head input (ln_f's output)", e, Unit::Sbh));
        if self.half {
            out.push(term(
                p,
                "LM head weight: the embedding transposed, cast to half (a view: not cached)",
                2,
                Unit::Vh,
            ));
        }
        out.push(term(
            p,
            "log-softmax of the logits (float32), kept by the loss",
            4,
            Unit::Sbv,
        ));
        out.push(term(p, "the loss's total weight (one float)", 4, Unit::One));
        out
    }
}

impl Formula {
    /// The per-layer terms collected by unit: `64·s·b·h + 16·s·b + 4·a·s·b`.
    pub fn per_layer_text(&self) -> String {
        collect(&self.per_layer)
    }

    /// One layer's bytes by the formula (unrounded).
    pub fn per_layer_bytes(&self, c: &TrainConfig) -> i64 {
        self.per_layer.iter().map(|t| t.bytes(c)).sum()
    }

    /// `L` layers' bytes: the formula the chapter applies.
    pub fn layers_bytes(&self, c: &TrainConfig) -> i64 {
        self.layers as i64 * self.per_layer_bytes(c)
    }

    /// The layers' and the outside terms' bytes, each allocation rounded: what the
    /// allocator counts as activations after the forward pass.
    pub fn rounded_bytes(&self, c: &TrainConfig) -> i64 {
        let layer: i64 = self.per_layer.iter().map(|t| t.rounded(c)).sum();
        let outside: i64 = self.outside.iter().map(|t| t.rounded(c)).sum();
        self.layers as i64 * layer + outside
    }

    /// The outside terms' bytes, rounded.
    pub fn outside_bytes(&self, c: &TrainConfig) -> i64 {
        self.outside.iter().map(|t| t.rounded(c)).sum()
    }

    /// The largest outside term.
    pub fn largest_outside(&self, c: &TrainConfig) -> Option<&Term> {
        self.outside.iter().max_by_key(|t| t.rounded(c))
    }
}

/// Terms summed by unit, largest unit first: `109·s·b·h + 18·s·b·f + ...`.
fn collect(terms: &[Term]) -> String {
    let mut by_unit: Vec<(Unit, i64)> = Vec::new();
    for t in terms {
        let add = t.count * t.coef as i64;
        match by_unit.iter_mut().find(|(u, _)| *u == t.unit) {
            Some((_, sum)) => *sum += add,
            None => by_unit.push((t.unit, add)),
        }
    }
    by_unit.sort_by_key(|(u, _)| *u);
    let mut text = String::new();
    for (unit, coef) in by_unit.into_iter().filter(|(_, c)| *c != 0) {
        if !text.is_empty() {
            text.push_str(if coef < 0 { " - " } else { " + " });
        } else if coef < 0 {
            text.push('-');
        }
        let _ = write!(text, "{}·{}", coef.abs(), unit.symbol());
    }
    text
}
