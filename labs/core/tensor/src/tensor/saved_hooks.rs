//! Saved-tensor hooks (PyTorch's `torch.autograd.graph.saved_tensors_hooks`): while a
//! guard from [`push_saved_tensors_hooks`] lives, every tensor an op saves for backward
//! is handed to the hooks' `pack` as the op records its node, and the node keeps only
//! what `pack` returned; the backward pass hands that back to `unpack` when the node's
//! derivative needs the tensor. Activation offload (`autograd::offload`) and
//! activation checkpointing (`autograd::checkpoint`) are both such a pair.
//!
//! The stack of installed hooks is per thread, as PyTorch's; the innermost wins. It
//! lives here rather than in `autograd` because recording happens here, as ops run.
//!
//! A packed tensor is not marked as an activation: where it lives is the hooks'
//! business (an offload hook that keeps a small tensor on the device marks it itself),
//! so the allocator's categories keep saying what is on the device.

use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use super::{GradOp, Tensor};
use crate::error::Result;

/// What a pack hook returned for one saved tensor: anything the matching unpack hook
/// understands (an index, a host copy, the tensor itself).
pub type Packed = Box<dyn Any + Send + Sync>;

/// A pack/unpack pair. `Send + Sync` because the nodes holding the packed values (and
/// the hooks, to unpack them) may be dropped or differentiated on another thread.
pub trait SavedTensorsHooks: Send + Sync {
    /// Called once for each tensor an op saves while the hooks are installed, right
    /// after the op's kernels are enqueued. `tensor` still carries its graph (its
    /// `grad_fn` says which op produced it); `saved_by` is the op saving it.
    fn pack(&self, tensor: &Tensor, saved_by: &GradOp) -> Result<Packed>;

    /// [`pack`](Self::pack) for a saved tensor that is one of `saved_by`'s inputs and
    /// has no graph (made where nothing needed a gradient: a copy of a batch, a mask
    /// built from it). Autograd cannot name the op that made it, and `saved_by` did
    /// not; hooks that decide by the producing op (a selective checkpoint's policy)
    /// must not take it for `saved_by`'s. The default: `pack`.
    fn pack_untracked_input(&self, tensor: &Tensor, saved_by: &GradOp) -> Result<Packed> {
        self.pack(tensor, saved_by)
    }

    /// Called with each recorded op's output while the hooks are installed, before the
    /// op's saved tensors are packed; returns the output the op gives. A selective
    /// checkpoint keeps the outputs of the ops its policy saves here, and hands them
    /// back to the same ops in its recomputation (PyTorch's selective checkpointing
    /// caches them the same way, from a dispatch mode). The default: `out` itself.
    fn output(&self, _op: &GradOp, out: Tensor) -> Tensor {
        out
    }

    /// The output the next recorded op will be handed by [`output`](Self::output), if
    /// the hooks already hold it and it is `op`'s: an op may then skip its kernels
    /// (a selective checkpoint's recomputation of a product it kept). The default:
    /// none.
    fn replayed_output(&self, _op: &GradOp) -> Option<Tensor> {
        None
    }

    /// The tensor again, when backward reaches the node (each time, for a graph
    /// retained across passes).
    fn unpack(&self, packed: &Packed) -> Result<Tensor>;

    /// Backward will soon reach the node holding `packed`: a hook that moved the tensor
    /// away may start bringing it back now. Returns whether the tensor is on its way
    /// back (a copy started now or before); backward looks no further ahead until it
    /// reaches a node that one was for. The default does nothing and says no.
    fn prefetch(&self, _packed: &Packed) -> Result<bool> {
        Ok(false)
    }

    /// The device tensor `packed` keeps alive, if it keeps one (a small tensor an
    /// offload left on the device, a tensor a selective checkpoint kept): what
    /// `autograd::retained_graph` counts. The default: none.
    fn resident(&self, _packed: &Packed) -> Option<Tensor> {
        None
    }
}

/// A node's saved tensors as its hooks packed them, with the hooks that unpack them;
/// `None` once a backward pass released them.
pub struct PackedSaved {
    pub packs: Mutex<Option<Packs>>,
}

/// Packed tensors and their hooks, released together: hooks may hold what unpacking
/// needs (a checkpointed region's inputs, a pool of host buffers), and a node that
/// outlives its backward (the graph lives until the pass ends) must not keep that
/// alive.
pub struct Packs {
    pub hooks: Arc<dyn SavedTensorsHooks>,
    /// In the order the op saved them. A pack that failed is kept as its error and
    /// reported by backward, since recording itself cannot fail.
    pub items: Vec<Result<Packed>>,
}

thread_local! {
    static HOOKS: RefCell<Vec<Arc<dyn SavedTensorsHooks>>> = const { RefCell::new(Vec::new()) };
}

/// The innermost installed hooks of this thread, if any.
pub fn current_saved_tensors_hooks() -> Option<Arc<dyn SavedTensorsHooks>> {
    HOOKS.with(|h| h.borrow().last().cloned())
}

/// Installs `hooks` for this thread until the guard drops. Guards nest (the innermost
/// wins) and must be dropped in reverse order, as scopes are.
pub fn push_saved_tensors_hooks(hooks: Arc<dyn SavedTensorsHooks>) -> SavedTensorsHooksGuard {
    let depth = HOOKS.with(|h| {
        let mut h = h.borrow_mut();
        h.push(hooks);
        h.len()
    });
    SavedTensorsHooksGuard { depth }
}

/// Removes its hooks when dropped.
#[must_use = "the hooks apply only while the guard is alive"]
pub struct SavedTensorsHooksGuard {
    depth: usize,
}

impl Drop for SavedTensorsHooksGuard {
    fn drop(&mut self) {
        HOOKS.with(|h| {
            let mut h = h.borrow_mut();
            debug_assert_eq!(
                h.len(),
                self.depth,
                "saved-tensor hook guards dropped out of order"
            );
            h.truncate(self.depth - 1);
        });
    }
}

/// Packs `saved` (the tensors `op` on `inputs` saves, with their graph) with `hooks`.
pub(super) fn pack_all(
    hooks: Arc<dyn SavedTensorsHooks>,
    saved: &[Tensor],
    op: &GradOp,
    inputs: &[&Tensor],
) -> PackedSaved {
    // An input without a graph was made before the op and outside autograd. The op's
    // own products (its output, a mask, a norm's statistics) have no graph yet
    // either, but never share an input's memory.
    let untracked = |t: &Tensor| {
        t.grad_fn().is_none() && !t.requires_grad() && inputs.iter().any(|i| i.shares_storage(t))
    };
    let items = (saved.iter())
        .map(|t| match untracked(t) {
            true => hooks.pack_untracked_input(t, op),
            false => hooks.pack(t, op),
        })
        .collect();
    PackedSaved {
        packs: Mutex::new(Some(Packs { hooks, items })),
    }
}
