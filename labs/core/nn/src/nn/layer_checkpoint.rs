//! Running each layer of a stack inside an activation checkpoint: what PyTorch users
//! write by hand around each block (`x = checkpoint(layer, x, use_reentrant=False)`,
//! as Hugging Face's `gradient_checkpointing_enable()` does for its models), here a
//! setting of the stacks ([`TransformerEncoder`](super::TransformerEncoder),
//! [`TransformerDecoder`](super::TransformerDecoder), [`Gpt2`](super::Gpt2)).
//!
//! The region's recomputation runs in backward, where the forward's thread-local
//! settings may no longer hold. As PyTorch's checkpoint restores the autocast state
//! of the forward for the recomputation, the region here re-enters the forward's
//! autocast dtype (or none) and attention backend, so it recomputes exactly the ops,
//! dtypes and saved tensors of the forward.

use std::sync::Arc;

use super::attention::{sdpa_backend, sdpa_kernel};
use super::AttentionMasks;
use crate::autograd::{checkpoint_with, save_matmul_and_attention, CheckpointOptions, PolicyFn};
use crate::error::Result;
use crate::tensor::{autocast, autocast_disabled, autocast_dtype, Tensor};

/// How a stack runs each of its layers.
#[derive(Clone, Default)]
pub enum LayerCheckpoint {
    /// Directly: every layer's saved activations live until backward.
    #[default]
    Off,
    /// Each layer in a checkpoint: only its inputs are kept, and backward recomputes
    /// the rest (dropout draws the same masks: the generators are replayed).
    Full,
    /// Each layer in a selective checkpoint: what the policy saves is kept from the
    /// forward, the rest recomputed (`create_selective_checkpoint_contexts`).
    Selective(PolicyFn),
}

impl LayerCheckpoint {
    /// The common selective policy: matmul and attention outputs kept, the cheap ops
    /// (elementwise, norms, softmax, dropout) recomputed.
    pub fn selective_matmul_and_attention() -> LayerCheckpoint {
        LayerCheckpoint::Selective(Arc::new(save_matmul_and_attention))
    }

    pub fn is_off(&self) -> bool {
        matches!(self, LayerCheckpoint::Off)
    }

    /// A short name: `none`, `layers` or `selective`.
    pub fn name(&self) -> &'static str {
        match self {
            LayerCheckpoint::Off => "none",
            LayerCheckpoint::Full => "layers",
            LayerCheckpoint::Selective(_) => "selective",
        }
    }
}

impl std::fmt::Debug for LayerCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `layer(inputs)` as `mode` says. `layer` is kept for the recomputation, hence
/// `'static`: it captures a clone of the layer (which shares the parameters and their
/// `.grad`).
pub(crate) fn run_layer<F>(mode: &LayerCheckpoint, inputs: &[Tensor], layer: F) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let policy = match mode {
        LayerCheckpoint::Off => return layer(inputs),
        LayerCheckpoint::Full => None,
        LayerCheckpoint::Selective(p) => Some(p.clone()),
    };
    let (dtype, backend) = (autocast_dtype(), sdpa_backend());
    let region = move |xs: &[Tensor]| -> Result<Tensor> {
        let _autocast = match dtype {
            Some(d) => autocast(d)?,
            None => autocast_disabled(),
        };
        let _backend = sdpa_kernel(backend);
        layer(xs)
    };
    checkpoint_with(region, inputs, CheckpointOptions { policy })
}

/// [`AttentionMasks`] that own their tensors, for a region kept until backward.
#[derive(Clone, Default)]
pub(crate) struct OwnedMasks {
    attn_mask: Option<Tensor>,
    key_padding_mask: Option<Tensor>,
    is_causal: bool,
}

impl OwnedMasks {
    pub(crate) fn new(masks: AttentionMasks) -> OwnedMasks {
        OwnedMasks {
            attn_mask: masks.attn_mask.cloned(),
            key_padding_mask: masks.key_padding_mask.cloned(),
            is_causal: masks.is_causal,
        }
    }

    pub(crate) fn borrow(&self) -> AttentionMasks<'_> {
        AttentionMasks {
            attn_mask: self.attn_mask.as_ref(),
            key_padding_mask: self.key_padding_mask.as_ref(),
            is_causal: self.is_causal,
        }
    }
}
