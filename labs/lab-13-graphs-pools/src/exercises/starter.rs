//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-13 --features exercises`.

use labs_core::device::Graph;
use labs_core::{Device, Result, Tensor};

// ANCHOR: exercise_graphed
/// Exercise 1: capture `crate::chain(x, depth)` as a graph and return the graph and
/// the tensor the region returns, so that each `graph.replay()` recomputes that tensor
/// from whatever `x` holds then. Nothing of the region may run during the capture.
pub fn graphed(device: &Device, x: &Tensor, depth: usize) -> Result<(Graph, Tensor)> {
    let _ = (device, x, depth);
    todo!("a new graph, and its capture of the region: 'Capturing a region'")
}
// ANCHOR_END: exercise_graphed

// ANCHOR: exercise_shared
/// Exercise 2: two graphs, the second running `crate::chain` on the first's output,
/// captured so that the second reuses the memory the first freed. Returns both graphs
/// and the second's output.
pub fn two_sharing(device: &Device, x: &Tensor, depth: usize) -> Result<(Graph, Graph, Tensor)> {
    let _ = (device, x, depth);
    todo!("one pool for both: 'Sharing a pool'")
}
// ANCHOR_END: exercise_shared
