//! Saved-tensor hooks from two functions, as PyTorch's
//! `torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook)`. The mechanism
//! (the per-thread stack of installed hooks, the packed values on each node) is in
//! `tensor`, where ops record; the backward pass (`autograd/mod.rs`) unpacks.

use std::sync::Arc;

use crate::error::Result;
use crate::tensor::{push_saved_tensors_hooks, GradOp, Packed, SavedTensorsHooksGuard, Tensor};

pub use crate::tensor::{current_saved_tensors_hooks, PackedSaved, SavedTensorsHooks};

/// A hook pair made of two closures.
pub struct FnHooks<P, U> {
    pack: P,
    unpack: U,
}

impl<P, U> SavedTensorsHooks for FnHooks<P, U>
where
    P: Fn(&Tensor) -> Result<Packed> + Send + Sync,
    U: Fn(&Packed) -> Result<Tensor> + Send + Sync,
{
    fn pack(&self, tensor: &Tensor, _saved_by: &GradOp) -> Result<Packed> {
        (self.pack)(tensor)
    }
    fn unpack(&self, packed: &Packed) -> Result<Tensor> {
        (self.unpack)(packed)
    }
}

/// Installs `pack` and `unpack` until the returned guard drops: every tensor an op
/// saves meanwhile goes through `pack`, and backward gets it back through `unpack`.
/// Guards nest; the innermost pair wins.
pub fn saved_tensors_hooks<P, U>(pack: P, unpack: U) -> SavedTensorsHooksGuard
where
    P: Fn(&Tensor) -> Result<Packed> + Send + Sync + 'static,
    U: Fn(&Packed) -> Result<Tensor> + Send + Sync + 'static,
{
    push_saved_tensors_hooks(Arc::new(FnHooks { pack, unpack }))
}

/// Installs a hook pair of one's own (a type implementing [`SavedTensorsHooks`]).
pub fn install_saved_tensors_hooks(hooks: Arc<dyn SavedTensorsHooks>) -> SavedTensorsHooksGuard {
    push_saved_tensors_hooks(hooks)
}
