//! Neural-network modules over tensors and autograd, named and laid out as PyTorch's
//! `torch.nn`: a [`Module`] has a `forward`, parameters with PyTorch's dotted names
//! (`0.weight`, `fc1.bias`), a training flag, and a state dict that saves to and loads
//! from safetensors files. Parameters are leaf tensors that require grad; a clone of one
//! (as `parameters()` returns, and an optimizer keeps) shares its storage and `.grad`,
//! and the allocator counts its memory as `Category::Parameter`.
//!
//! The modules: [`Linear`], [`Embedding`], [`LayerNorm`], [`Dropout`], the activations,
//! [`Sequential`] and [`Mlp`], [`MultiheadAttention`], [`TransformerEncoderLayer`] and
//! [`TransformerDecoderLayer`], their stacks [`TransformerEncoder`] and
//! [`TransformerDecoder`], the encoder-decoder [`Transformer`], and the decoder-only
//! [`Gpt2`]; every attention goes through [`attention::scaled_dot_product_attention`].
//! Initial values come from a seeded host [`Rng`] with PyTorch's distributions and
//! bounds (not its bits), so the same seed gives the same model on every device.

mod activation;
pub mod attention;
mod dropout;
mod embedding;
mod gpt2;
mod init;
mod layer_checkpoint;
mod layer_hooks;
mod linear;
mod multihead_attention;
mod norm;
mod sequential;
mod state;
mod transformer;
mod transformer_stack;

pub use activation::{Gelu, Relu, Sigmoid, Tanh};
pub use attention::{
    causal_mask, reset_sdpa_calls, scaled_dot_product_attention, sdpa_backend, sdpa_calls,
    sdpa_kernel, SdpaBackend, SdpaCalls, SdpaGuard,
};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use gpt2::{Gpt2, Gpt2Config};
pub use init::Rng;
pub use layer_checkpoint::LayerCheckpoint;
pub use layer_hooks::{parameters_by_unit, Hooks, LayerHooks, Unit};
pub use linear::Linear;
pub use multihead_attention::{AttentionMasks, MhaLayout, MultiheadAttention};
pub use norm::LayerNorm;
pub use sequential::{Mlp, Sequential};
pub use state::{load, load_limited, save};
pub use transformer::{
    Activation, DecoderMasks, TransformerConfig, TransformerDecoderLayer, TransformerEncoderLayer,
};
pub use transformer_stack::{Transformer, TransformerDecoder, TransformerEncoder};

use crate::error::Result;
use crate::tensor::Tensor;

/// A layer or a model: PyTorch's `nn.Module`.
pub trait Module {
    /// The module applied to `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Calls `f` with every parameter and its dotted name below `prefix`, in PyTorch's
    /// order: the module's own parameters in registration order, then each child's
    /// (its name, then a dot, then the child's names).
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor));

    /// Sets training mode on this module and every child (`module.train(mode)`).
    fn train(&mut self, mode: bool);

    /// Whether the module is in training mode (`module.training`).
    fn training(&self) -> bool;

    /// `train(false)`.
    fn eval(&mut self) {
        self.train(false)
    }

    /// Every parameter with its dotted name (`named_parameters()`); clones that share
    /// storage and `.grad` with the module's.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_parameters("", &mut |name, t| out.push((name, t.clone())));
        out
    }

    /// Every parameter (`parameters()`), in `named_parameters` order.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// Drops every parameter's `.grad` (PyTorch's `zero_grad()`, whose default is
    /// `set_to_none=True`): the memory goes back to the allocator's cache.
    fn zero_grad(&self) {
        self.visit_parameters("", &mut |_, t| t.clear_grad());
    }

    /// The number of parameter elements (`sum(p.numel() for p in m.parameters())`).
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit_parameters("", &mut |_, t| n += t.numel());
        n
    }

    /// The parameters by name, detached (`state_dict()`: they share storage with the
    /// module, as PyTorch's do; copy them to keep a snapshot).
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_parameters("", &mut |name, t| out.push((name, t.detach())));
        out
    }

    /// Copies `state` into the parameters, in place (so that an optimizer holding them
    /// sees the new values), as `load_state_dict(state, strict=True)`: every key must be
    /// a parameter and every parameter must have a key, with the same shape and dtype;
    /// the error names the key. Nothing is copied unless everything matches.
    fn load_state_dict(&self, state: &[(String, Tensor)]) -> Result<()> {
        state::load_into(&self.named_parameters(), state)
    }

    /// The prefixes (in [`Module::named_parameters`]' names) of the layers this module
    /// runs one after another and calls [`LayerHooks`] around, in forward order: none
    /// for a module that hands no layers out.
    fn layer_prefixes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Calls `hooks` around each layer of [`Module::layer_prefixes`] and around the
    /// whole forward pass from now on (`None`: no more). An error for a module that
    /// hands no layers out.
    fn set_layer_hooks(&mut self, hooks: Hooks) -> Result<()> {
        let _ = hooks;
        Err(crate::error::Error::InvalidArgument(
            "set_layer_hooks: this module runs no stack of layers to hook".into(),
        ))
    }
}

/// `prefix.name`, or `name` at the top.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}
