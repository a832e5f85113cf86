//! The model of a run and its data: either model built from a [`TrainConfig`], a
//! micro-batch of random data made for it, and one forward pass with its loss.

use anyhow::{Context, Result};
use labs_core::alloc::Category;
use labs_core::nn::{
    Gpt2, Gpt2Config, LayerCheckpoint, Module, Rng, Transformer, TransformerConfig,
};
use labs_core::{Device, Tensor};

use super::config::{CheckpointMode, ModelKind, TrainConfig};

/// The model trained.
pub enum TrainModel {
    Transformer(Transformer),
    Gpt2(Gpt2),
}

/// One micro-batch.
#[derive(Clone)]
pub enum Batch {
    /// `src`, `tgt` and the regression target, each `[batch, seq, d_model]`.
    Seq2Seq {
        src: Tensor,
        tgt: Tensor,
        target: Tensor,
    },
    /// Token ids `[batch, seq]` and the next tokens `[batch, seq]` (int64).
    Tokens { idx: Tensor, targets: Tensor },
}

/// A seed for micro-batch `micro` of step `step`, distinct for every pair (SplitMix64
/// of the three).
fn batch_seed(seed: u64, step: usize, micro: usize) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((step as u64) << 20)
        .wrapping_add(micro as u64)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Batch {
    /// Copies `other`'s data into this batch's tensors (a captured step's inputs take
    /// each step's data so): both made for the same model and sizes.
    pub fn copy_from(&self, other: &Batch) -> Result<()> {
        match (self, other) {
            (
                Batch::Seq2Seq { src, tgt, target },
                Batch::Seq2Seq {
                    src: s,
                    tgt: t,
                    target: g,
                },
            ) => {
                src.copy_(s)?;
                tgt.copy_(t)?;
                target.copy_(g)?;
            }
            (Batch::Tokens { idx, targets }, Batch::Tokens { idx: i, targets: t }) => {
                idx.copy_(i)?;
                targets.copy_(t)?;
            }
            _ => anyhow::bail!("a batch made for the other model"),
        }
        Ok(())
    }

    /// Micro-batch `micro` of step `step`: fresh random data, on `device`, counted as
    /// the model's input.
    pub fn random(c: &TrainConfig, step: usize, micro: usize, device: &Device) -> Result<Batch> {
        let _input = Category::Input.scope();
        let seed = batch_seed(c.seed, step, micro);
        Ok(match c.model {
            ModelKind::Transformer => {
                let shape = [c.batch, c.seq, c.d_model];
                Batch::Seq2Seq {
                    src: Tensor::randn(&shape, seed, device)?,
                    tgt: Tensor::randn(&shape, seed.wrapping_add(1), device)?,
                    target: Tensor::randn(&shape, seed.wrapping_add(2), device)?,
                }
            }
            ModelKind::Gpt2 => {
                let mut rng = Rng::seeded(seed);
                let (t, vocab) = (c.seq, c.vocab as u64);
                let mut idx = Vec::with_capacity(c.batch * t);
                let mut targets = Vec::with_capacity(c.batch * t);
                for _ in 0..c.batch {
                    let row: Vec<i64> = (0..=t).map(|_| (rng.next_u64() % vocab) as i64).collect();
                    idx.extend_from_slice(&row[..t]);
                    targets.extend_from_slice(&row[1..]);
                }
                Batch::Tokens {
                    idx: Tensor::from_slice(&idx, &[c.batch, t], device)?,
                    targets: Tensor::from_slice(&targets, &[c.batch, t], device)?,
                }
            }
        })
    }

    /// The micro-batches joined along the batch dimension: one batch of the same data.
    pub fn cat(batches: &[Batch]) -> Result<Batch> {
        let join = |pick: &dyn Fn(&Batch) -> Option<&Tensor>| -> Result<Tensor> {
            let parts = batches
                .iter()
                .map(|b| pick(b).context("micro-batches of different models"))
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&parts, 0)?)
        };
        Ok(match batches.first().context("no micro-batch to join")? {
            Batch::Seq2Seq { .. } => Batch::Seq2Seq {
                src: join(&|b| match b {
                    Batch::Seq2Seq { src, .. } => Some(src),
                    _ => None,
                })?,
                tgt: join(&|b| match b {
                    Batch::Seq2Seq { tgt, .. } => Some(tgt),
                    _ => None,
                })?,
                target: join(&|b| match b {
                    Batch::Seq2Seq { target, .. } => Some(target),
                    _ => None,
                })?,
            },
            Batch::Tokens { .. } => Batch::Tokens {
                idx: join(&|b| match b {
                    Batch::Tokens { idx, .. } => Some(idx),
                    _ => None,
                })?,
                targets: join(&|b| match b {
                    Batch::Tokens { targets, .. } => Some(targets),
                    _ => None,
                })?,
            },
        })
    }
}

impl TrainModel {
    /// The model of `c` on `device`, initialised from `c.seed`, in training mode, each
    /// layer run as `c.checkpoint` says.
    pub fn new(c: &TrainConfig, device: &Device) -> Result<TrainModel> {
        let mut rng = Rng::seeded(c.seed);
        // ANCHOR: checkpoint_choice
        let mode = match c.checkpoint {
            CheckpointMode::None => LayerCheckpoint::Off,
            CheckpointMode::Layers => LayerCheckpoint::Full,
            CheckpointMode::Selective => LayerCheckpoint::selective_matmul_and_attention(),
        };
        // ANCHOR_END: checkpoint_choice
        Ok(match c.model {
            ModelKind::Transformer => {
                let layer = TransformerConfig {
                    dim_feedforward: c.ffn,
                    dropout: c.dropout,
                    ..TransformerConfig::new(c.d_model, c.nhead)
                };
                let mut m = Transformer::new(layer, c.layers, c.layers, &mut rng, device)?;
                m.set_checkpoint(mode);
                TrainModel::Transformer(m)
            }
            ModelKind::Gpt2 => {
                let config = Gpt2Config {
                    vocab: c.padded_vocab(),
                    n_positions: c.gpt2_positions(),
                    d_model: c.d_model,
                    n_layer: c.layers,
                    n_head: c.nhead,
                    dropout: c.dropout,
                };
                let mut m = Gpt2::new(config, &mut rng, device)?;
                m.checkpoint = mode;
                m.fused_classifier = c.fused_classifier;
                TrainModel::Gpt2(m)
            }
        })
    }

    pub fn module(&self) -> &dyn Module {
        match self {
            TrainModel::Transformer(m) => m,
            TrainModel::Gpt2(m) => m,
        }
    }

    pub fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            TrainModel::Transformer(m) => m,
            TrainModel::Gpt2(m) => m,
        }
    }

    /// One forward pass and its loss: `mse_loss(model(src, tgt), target)` or GPT-2's
    /// next-token cross-entropy.
    pub fn loss(&self, batch: &Batch) -> Result<Tensor> {
        Ok(match (self, batch) {
            (TrainModel::Transformer(m), Batch::Seq2Seq { src, tgt, target }) => m
                .forward_seq2seq(src, tgt, None, None, None)?
                .mse_loss(target)?,
            (TrainModel::Gpt2(m), Batch::Tokens { idx, targets }) => m.loss(idx, targets)?,
            _ => anyhow::bail!("a batch made for the other model"),
        })
    }
}
