//! The backward pass: from a tensor back through the graph its ops recorded
//! (`tensor/graph.rs`), each node's derivative (`derivatives.rs`) turning the gradient
//! of its output into gradients of its inputs, accumulated into the leaves' `.grad`.
//!
//! As in PyTorch, a pass releases what the nodes saved as soon as each node is done,
//! unless asked to retain the graph; a second pass through a released graph is an
//! error that says so. Gradients are computed with recording off (no double backward).
//!
//! What a node saved may have gone through saved-tensor hooks (`saved_hooks.rs`): the
//! pass unpacks it when it reaches the node and asks the next node's hooks to start
//! bringing theirs back. Activation offload (`offload.rs`) and activation
//! checkpointing (`checkpoint.rs`) are such hooks.

mod checkpoint;
mod derivatives;
mod grad_hooks;
mod offload;
mod retained;
mod saved_hooks;
mod slices;

pub use checkpoint::{
    checkpoint, checkpoint_with, save_matmul_and_attention, CheckpointOptions, CheckpointPolicy,
    PolicyFn,
};
pub use grad_hooks::HookHandle;
pub use offload::{save_on_cpu, CopyTimes, OffloadHooks, OffloadOptions, OffloadStats};
pub use saved_hooks::{
    current_saved_tensors_hooks, install_saved_tensors_hooks, saved_tensors_hooks, FnHooks,
    PackedSaved, SavedTensorsHooks,
};

pub use retained::{retained_by, retained_graph, RetainedGraph};
mod derivatives_rows;

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use crate::alloc::Category;
use crate::error::{Error, Result};
use crate::tensor::{engine_autocast, no_grad, Edge, GradCell, GradOp, GradSlot, Node, Tensor};
use slices::{Contribution, PartBuffers};

impl Tensor {
    /// Gradients of this one-element tensor (a loss) with respect to every leaf it
    /// depends on, added to their `.grad` (PyTorch's `loss.backward()`); the graph's
    /// saved tensors are released on the way.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, false)
    }

    /// `backward` with an explicit output gradient (`None`: ones, for a one-element
    /// tensor only) and the choice to keep the graph for another pass
    /// (`retain_graph=True`).
    pub fn backward_with(&self, grad: Option<Tensor>, retain_graph: bool) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::InvalidArgument(
                "backward: the tensor does not require grad and has no grad_fn".into(),
            ));
        }
        let _off = no_grad();
        // Derivatives run in the dtypes the forward pass chose, as PyTorch's backward
        // does on its own threads: no region is open there (one around `backward` must
        // not recast the gradients), so a checkpoint's recomputation opens the
        // outermost one, whose casts are dropped when it ends.
        let _no_autocast = engine_autocast();
        let grad = match grad {
            Some(g) if g.shape() == self.shape() => g,
            Some(g) => {
                return Err(Error::Shape {
                    op: "backward (the gradient's shape)",
                    a: self.shape().to_vec(),
                    b: g.shape().to_vec(),
                })
            }
            None if self.numel() == 1 => ones_like(self)?,
            None => {
                return Err(Error::InvalidArgument(format!(
                    "backward: grad can be implicitly created only for a one-element tensor, \
                     not shape {:?}",
                    self.shape()
                )))
            }
        };
        let Some(root) = self.grad_fn() else {
            // A leaf: its gradient is the one given.
            let slot = self.grad_slot().expect("a leaf that requires grad");
            accumulate(
                &slot,
                Contribution::Whole(grad),
                &mut PartBuffers::default(),
            )?;
            return grad_hooks::run_hooks(&slot);
        };
        let order = topological_order(&root);
        let next_packed = next_packed_positions(&order);
        let mut ahead = Lookahead::default();
        // Hooked leaves, and how many gradients each still waits for in this pass.
        let mut waiting = grad_hooks::expected_contributions(&order);
        // Hooked leaves that got some of their gradients: a node that no gradient
        // reached leaves its share missing, and their hooks then run at the end.
        let mut partial: HashMap<*const GradCell, GradSlot> = HashMap::new();
        let mut pending: HashMap<*const Node, Tensor> = HashMap::new();
        // Gradients of several parts of one tensor, written into one buffer.
        let mut parts = PartBuffers::default();
        pending.insert(Arc::as_ptr(&root), grad);
        for (position, node) in order.iter().enumerate() {
            let Some(grad) = pending.remove(&Arc::as_ptr(node)) else {
                continue; // no gradient reached it (an input that needs none)
            };
            grad_hooks::run_tensor_hooks(node, &grad)?;
            let saved = saved_tensors(node, retain_graph)?;
            ahead.advance(&order, &next_packed, position)?;
            let grads = match node.op {
                // A part's gradient goes into its place in its input's gradient.
                GradOp::Narrow { dim, start, full } => vec![Contribution::Part {
                    grad,
                    dim,
                    start,
                    full,
                }],
                ref op => derivatives::input_grads(op, &grad, &saved)?
                    .into_iter()
                    .map(Contribution::Whole)
                    .collect(),
            };
            drop(saved);
            for (edge, g) in node.inputs.iter().zip(grads) {
                match edge {
                    None => {}
                    Some(Edge::Leaf(slot)) => {
                        accumulate(slot, g, &mut parts)?;
                        let key = Arc::as_ptr(slot);
                        if let Some(left) = waiting.get_mut(&key) {
                            *left -= 1;
                            if *left == 0 {
                                partial.remove(&key);
                                grad_hooks::run_hooks(slot)?;
                            } else {
                                partial.entry(key).or_insert_with(|| slot.clone());
                            }
                        }
                    }
                    Some(Edge::Node(next)) => {
                        let key = Arc::as_ptr(next);
                        let sum = parts.add(key as usize, pending.remove(&key), g, false)?;
                        pending.insert(key, sum);
                    }
                }
            }
        }
        for slot in partial.values() {
            grad_hooks::run_hooks(slot)?;
        }
        Ok(())
    }
}

/// The tensors `node` saved, unpacked by their hooks if hooks packed them; released
/// from the node unless the graph is retained. An error for a released node.
fn saved_tensors(node: &Node, retain_graph: bool) -> Result<Vec<Tensor>> {
    let released = || {
        Error::InvalidArgument(format!(
            "backward: trying to backward through the graph a second time \
             ({} released its saved tensors); pass retain_graph=true to the first pass",
            node.op.name()
        ))
    };
    let plain = {
        let mut slot = node.saved.lock().unwrap();
        if retain_graph {
            slot.clone()
        } else {
            slot.take()
        }
    };
    let plain = plain.ok_or_else(released)?;
    let Some(packed) = &node.packed else {
        return Ok(plain);
    };
    let mut slot = packed.packs.lock().unwrap();
    let packs = slot.as_ref().ok_or_else(released)?;
    let mut out = Vec::with_capacity(packs.items.len());
    for item in &packs.items {
        match item {
            Ok(p) => out.push(packs.hooks.unpack(p)?),
            Err(e) => {
                return Err(Error::InvalidArgument(format!(
                    "backward: a saved-tensor pack hook of {} failed during forward: {e}",
                    node.op.name()
                )))
            }
        }
    }
    if !retain_graph {
        slot.take();
    }
    Ok(out)
}

/// Which node's packed tensors are on their way back ahead of backward. While this one
/// computes, the next node whose hooks moved tensors away (an offload's) brings them
/// back: the first node after it that holds packed tensors is asked, then the next,
/// until one says a copy is under way, however many nodes whose tensors stayed (an
/// offload of a share of the saved bytes keeps most) lie between. One such node is
/// ahead at a time, so what comes back early is one node's tensors.
#[derive(Default)]
struct Lookahead {
    /// The position of the node whose tensors are coming back.
    coming: Option<usize>,
    /// The last position asked.
    asked: Option<usize>,
}

impl Lookahead {
    /// Backward is at `position`: once it has reached the node coming back (or none
    /// is), asks the nodes after the last asked.
    fn advance(
        &mut self,
        order: &[Arc<Node>],
        next_packed: &[Option<usize>],
        position: usize,
    ) -> Result<()> {
        if self.coming.is_some_and(|c| c > position) {
            return Ok(());
        }
        self.coming = None;
        let mut from = self
            .asked
            .map_or(position + 1, |a| (a + 1).max(position + 1));
        while let Some(next) = next_packed.get(from).copied().flatten() {
            self.asked = Some(next);
            if prefetch(&order[next])? {
                self.coming = Some(next);
                break;
            }
            from = next + 1;
        }
        Ok(())
    }
}

/// Asks `node`'s hooks to start bringing its packed tensors back; whether any are on
/// their way.
fn prefetch(node: &Node) -> Result<bool> {
    let mut coming = false;
    if let Some(packed) = &node.packed {
        if let Some(packs) = packed.packs.lock().unwrap().as_ref() {
            for p in packs.items.iter().flatten() {
                coming |= packs.hooks.prefetch(p)?;
            }
        }
    }
    Ok(coming)
}

/// For each position in `order`, the first position at or after it whose node holds
/// packed tensors.
fn next_packed_positions(order: &[Arc<Node>]) -> Vec<Option<usize>> {
    let mut out = vec![None; order.len()];
    let mut next = None;
    for (i, node) in order.iter().enumerate().rev() {
        if node.packed.is_some() {
            next = Some(i);
        }
        out[i] = next;
    }
    out
}

/// A tensor of ones of `t`'s shape, dtype and device (the implicit gradient of a
/// one-element loss, in the loss's dtype as PyTorch's).
fn ones_like(t: &Tensor) -> Result<Tensor> {
    use crate::tensor::DType;
    let (shape, device) = (t.shape(), t.device());
    match t.dtype() {
        DType::F16 => Tensor::full(shape, half::f16::ONE, device),
        DType::BF16 => Tensor::full(shape, half::bf16::ONE, device),
        _ => Tensor::full(shape, 1.0f32, device),
    }
}

/// Adds `g` into a leaf's `.grad` (a new dense tensor the first time, as PyTorch).
fn accumulate(slot: &GradSlot, g: Contribution, parts: &mut PartBuffers) -> Result<()> {
    let mut grad = slot.lock().unwrap();
    let key = Arc::as_ptr(slot) as usize;
    let sum = parts.add(key, grad.take(), g, true)?;
    sum.set_category(Category::Gradient)?;
    *grad = Some(sum);
    Ok(())
}

/// The nodes reachable from `root`, in the order backward runs them: PyTorch's
/// engine's order. A node is ready once every node that feeds it a gradient has run;
/// of the ready nodes, the one recorded last (highest [`Node::sequence_nr`]) runs
/// first. A depth-first order is as valid, but it can leave a branch (a decoder
/// layer's weights, fed by an input that needs no gradient) until the very end of the
/// pass, keeping what that branch saved alive all the way; PyTorch's releases it as
/// soon as the branch's gradients are complete.
fn topological_order(root: &Arc<Node>) -> Vec<Arc<Node>> {
    // How many edges from reachable nodes lead into each node.
    let mut dependencies: HashMap<*const Node, usize> = HashMap::new();
    let mut seen: HashSet<*const Node> = HashSet::from([Arc::as_ptr(root)]);
    let mut stack = vec![root.clone()];
    while let Some(node) = stack.pop() {
        for edge in &node.inputs {
            if let Some(Edge::Node(next)) = edge {
                *dependencies.entry(Arc::as_ptr(next)).or_default() += 1;
                if seen.insert(Arc::as_ptr(next)) {
                    stack.push(next.clone());
                }
            }
        }
    }
    let mut ready = BinaryHeap::from([ByRecency(root.clone())]);
    let mut order = Vec::with_capacity(seen.len());
    while let Some(ByRecency(node)) = ready.pop() {
        for edge in &node.inputs {
            if let Some(Edge::Node(next)) = edge {
                let left = dependencies
                    .get_mut(&Arc::as_ptr(next))
                    .expect("counted above");
                *left -= 1;
                if *left == 0 {
                    ready.push(ByRecency(next.clone()));
                }
            }
        }
        order.push(node);
    }
    order
}

/// A node ordered by when it was recorded, the latest greatest.
struct ByRecency(Arc<Node>);

impl PartialEq for ByRecency {
    fn eq(&self, other: &Self) -> bool {
        self.0.sequence_nr == other.0.sequence_nr
    }
}

impl Eq for ByRecency {}

impl PartialOrd for ByRecency {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByRecency {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.sequence_nr.cmp(&other.0.sequence_nr)
    }
}
