//! Lab 13: CUDA graphs and memory pools. A graph records a region of work once and
//! replays it as one launch; what the region allocates comes from a private pool of
//! the caching allocator that lives as long as the graph and its outputs. Each module
//! is one experiment:
//!
//! - [`launches`]: the host's time for a chain of small kernels, launched one by one
//!   and replayed as a graph;
//! - [`pools`]: the memory a graph keeps (its pool against the region's eager peak),
//!   and what sharing one pool between two graphs saves;
//! - [`rules`]: what a capture forbids, and the error each call gives;
//! - [`scoped`]: a scoped pool (`torch.cuda.MemPool`) keeping a region's memory apart.

pub mod exercises;
pub mod launches;
pub mod pools;
pub mod rules;
pub mod scoped;

use labs_core::{Result, Tensor};

/// The region the experiments capture: `depth` dependent elementwise ops on `x`, each
/// making a new tensor of its size (`y = 0.5 * y + 1`, repeated), so that the region
/// allocates `depth` temporaries and returns the last.
pub fn chain(x: &Tensor, depth: usize) -> Result<Tensor> {
    let mut y = x.mul_scalar(0.5)?.add_scalar(1.0)?;
    for _ in 1..depth {
        y = y.mul_scalar(0.5)?.add_scalar(1.0)?;
    }
    Ok(y)
}
