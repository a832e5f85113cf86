//! What a graph keeps alive: the nodes reachable from a tensor and the tensors they
//! saved for backward. A tensor that still has a `grad_fn` keeps that whole graph, and
//! with it every saved activation, until the tensor goes away or a backward pass
//! releases the saved tensors: the device memory a loss kept in a list (or summed into
//! a running total) costs.

use std::collections::HashSet;
use std::sync::Arc;

use crate::tensor::{Edge, Node, Tensor};

/// The size of the graph behind a tensor, as [`retained_graph`] measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetainedGraph {
    /// Nodes reachable from the tensor's `grad_fn` (host memory, a few hundred bytes
    /// each).
    pub nodes: usize,
    /// Nodes whose saved tensors a backward pass has already released.
    pub released_nodes: usize,
    /// Distinct storages the nodes' saved tensors use.
    pub saved_storages: usize,
    /// Bytes of those storages, each counted once, whole (a saved view keeps its
    /// entire block) and as requested from the allocator (before its rounding).
    pub saved_bytes: u64,
}

// ANCHOR: retained_graph
/// Walks the graph behind `t` (every node reachable from its `grad_fn`) and sums the
/// storages its nodes saved, each storage once however many nodes or views share it.
/// A leaf or a tensor without a graph retains nothing.
pub fn retained_graph(t: &Tensor) -> RetainedGraph {
    retained_by([t])
}

/// [`retained_graph`] of several tensors together (a list of logged losses): a node or
/// a storage they share is counted once.
pub fn retained_by<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> RetainedGraph {
    let mut out = RetainedGraph::default();
    let mut seen: HashSet<*const Node> = HashSet::new();
    let mut storages: HashSet<u64> = HashSet::new();
    let mut stack: Vec<Arc<Node>> = Vec::new();
    for root in tensors.into_iter().filter_map(Tensor::grad_fn) {
        if seen.insert(Arc::as_ptr(&root)) {
            stack.push(root);
        }
    }
    while let Some(node) = stack.pop() {
        out.nodes += 1;
        match node.saved.lock().unwrap().as_ref() {
            None => out.released_nodes += 1,
            Some(saved) => {
                // Tensors saved through hooks count where the hooks kept them on the
                // device; an offloaded or a to-be-recomputed tensor costs no device
                // memory.
                let resident: Vec<Tensor> = node.packed.as_ref().map_or_else(Vec::new, |p| {
                    let packs = p.packs.lock().unwrap();
                    (packs.iter())
                        .flat_map(|p| p.items.iter().flatten().map(|i| (&p.hooks, i)))
                        .filter_map(|(hooks, item)| hooks.resident(item))
                        .collect()
                });
                for s in saved.iter().chain(&resident) {
                    let block = s.allocation();
                    if storages.insert(block.ptr()) {
                        out.saved_bytes += block.requested();
                    }
                }
            }
        }
        for edge in &node.inputs {
            if let Some(Edge::Node(next)) = edge {
                if seen.insert(Arc::as_ptr(next)) {
                    stack.push(next.clone());
                }
            }
        }
    }
    out.saved_storages = storages.len();
    out
}
// ANCHOR_END: retained_graph
