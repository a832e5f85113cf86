//! Hooks around a model's layers: what PyTorch's FSDP registers on each module it
//! wraps (`fully_shard(block)`), as forward pre- and post-hooks. A model that runs a
//! stack of layers one after another (GPT-2's blocks, the Transformer's encoder and
//! decoder layers) names them ([`Module::layer_prefixes`]) and, once hooks are set
//! ([`Module::set_layer_hooks`]), calls them around each layer and around the whole
//! forward pass (the root: what is not in a layer, the embeddings, the final norms).
//!
//! The hooks run outside an activation checkpoint: a checkpointed layer's recomputation
//! in backward calls neither.

use std::sync::Arc;

use super::Module;
use crate::error::Result;
use crate::tensor::Tensor;

/// The part of a model a hook is called for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// The whole forward pass: its parameters are those in no layer.
    Root,
    /// Layer `i` of [`Module::layer_prefixes`].
    Layer(usize),
}

/// Called around a model's layers once set with [`Module::set_layer_hooks`].
pub trait LayerHooks: Send + Sync {
    /// `unit` is about to run its forward.
    fn before(&self, unit: Unit) -> Result<()>;
    /// `unit` ran its forward and made `output` (a layer's output is the next layer's
    /// input; the root's is the model's).
    fn after(&self, unit: Unit, output: &Tensor) -> Result<()>;
}

/// The hooks a model holds, if any.
pub type Hooks = Option<Arc<dyn LayerHooks>>;

/// `run()` as `unit`, between the hooks.
pub(crate) fn hooked(
    hooks: &Hooks,
    unit: Unit,
    run: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    if let Some(h) = hooks {
        h.before(unit)?;
    }
    let out = run()?;
    if let Some(h) = hooks {
        h.after(unit, &out)?;
    }
    Ok(out)
}

/// The parameters of `model` by unit: the root's first (those under no layer prefix),
/// then each layer's, each in `named_parameters` order.
pub fn parameters_by_unit(model: &dyn Module) -> Vec<(Unit, Vec<(String, Tensor)>)> {
    let prefixes = model.layer_prefixes();
    let mut units: Vec<(Unit, Vec<(String, Tensor)>)> = std::iter::once(Unit::Root)
        .chain((0..prefixes.len()).map(Unit::Layer))
        .map(|u| (u, Vec::new()))
        .collect();
    for (name, p) in model.named_parameters() {
        let layer = prefixes.iter().position(|pre| {
            name.strip_prefix(pre.as_str())
                .is_some_and(|r| r.starts_with('.'))
        });
        units[layer.map_or(0, |i| i + 1)].1.push((name, p));
    }
    units
}
