//! Hooks run once a backward pass has finished accumulating a leaf's gradient
//! (PyTorch's `Tensor.register_post_accumulate_grad_hook`). Data-parallel training
//! hangs on them: a parameter whose gradient is complete can join its bucket's
//! all-reduce while backward goes on with the layers below it, and an optimizer can
//! step a parameter as soon as its gradient is ready.
//!
//! "Finished" means every contribution of this pass has arrived: a leaf used twice (a
//! tied weight) gets two gradients, summed into `.grad`, and its hooks run once, after
//! the second, as PyTorch's engine sums the two before its `AccumulateGrad` node runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::error::{Error, Result};
use crate::tensor::{Edge, GradCell, GradSlot, Node, Tensor};

/// Removes its hook when [`remove`](Self::remove)d (PyTorch's `RemovableHandle`);
/// dropping it keeps the hook.
pub struct HookHandle {
    cell: Weak<GradCell>,
    id: u64,
}

impl HookHandle {
    pub fn remove(self) {
        if let Some(cell) = self.cell.upgrade() {
            cell.hooks.lock().unwrap().retain(|(id, _)| *id != self.id);
        }
    }
}

impl Tensor {
    /// Runs `hook` with this leaf's accumulated `.grad` after each backward pass that
    /// reaches it, once its gradient for the pass is complete. Leaves only, as in
    /// PyTorch.
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        let Some(cell) = self.grad_slot() else {
            return Err(Error::InvalidArgument(
                "register_post_accumulate_grad_hook: only leaf tensors that require grad \
                 have an accumulated gradient"
                    .into(),
            ));
        };
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        cell.hooks.lock().unwrap().push((id, Arc::new(hook)));
        Ok(HookHandle {
            cell: Arc::downgrade(&cell),
            id,
        })
    }
}

impl Tensor {
    /// Runs `hook` with this tensor's gradient each time a backward pass computes it,
    /// before the op that made the tensor passes it on (PyTorch's `Tensor.register_hook`
    /// on a non-leaf, observing: the hook cannot replace the gradient). What it is for:
    /// knowing that backward has reached a point of the forward pass, as FSDP gathers a
    /// layer's parameters once its output's gradient exists. A leaf's gradient has
    /// [`Tensor::register_post_accumulate_grad_hook`].
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let Some(node) = self.grad_fn() else {
            return Err(Error::InvalidArgument(
                "register_hook: only a tensor an op recorded (with a grad_fn) has one here; \
                 on a leaf use register_post_accumulate_grad_hook"
                    .into(),
            ));
        };
        node.hooks.lock().unwrap().push(Arc::new(hook));
        Ok(())
    }
}

/// Runs the hooks on `node`'s output gradient, `grad`.
pub(super) fn run_tensor_hooks(node: &Node, grad: &Tensor) -> Result<()> {
    let hooks = node.hooks.lock().unwrap().clone();
    for hook in hooks {
        hook(grad)?;
    }
    Ok(())
}

/// How many gradients each hooked leaf will receive from the nodes of one pass.
pub(super) fn expected_contributions(order: &[Arc<Node>]) -> HashMap<*const GradCell, usize> {
    let mut counts = HashMap::new();
    for node in order {
        for edge in node.inputs.iter().flatten() {
            if let Edge::Leaf(slot) = edge {
                if !slot.hooks.lock().unwrap().is_empty() {
                    *counts.entry(Arc::as_ptr(slot)).or_insert(0) += 1;
                }
            }
        }
    }
    counts
}

/// Runs `slot`'s hooks with its gradient now.
pub(super) fn run_hooks(slot: &GradSlot) -> Result<()> {
    // Cloned out of the lock: a hook may register or remove hooks.
    let hooks: Vec<_> = slot
        .hooks
        .lock()
        .unwrap()
        .iter()
        .map(|(_, h)| h.clone())
        .collect();
    if hooks.is_empty() {
        return Ok(());
    }
    let Some(grad) = slot.lock().unwrap().clone() else {
        return Ok(());
    };
    for hook in hooks {
        hook(&grad)?;
    }
    Ok(())
}
