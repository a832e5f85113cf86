//! The two types exercise 4 trades in, shared by the starter code and the solutions.

use labs_core::alloc::Category;

// ANCHOR: growth_types
/// What a group of blocks is attributed to: where they were made and what they hold.
/// The derived ordering (line, then op, then category) breaks ties in a report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Site {
    /// The program's line that called the op (`labs/lab-09-leaks/src/model.rs:69`):
    /// [`LiveBlock::origin`](labs_core::alloc::LiveBlock::origin)'s `at`, `None`
    /// when the memory history recorded no backtrace.
    pub at: Option<String>,
    /// The op that allocated the blocks (`Tensor::randn`), from the same origin.
    pub op: Option<String>,
    /// The blocks' category, as the allocator reports it with each block.
    pub category: Category,
}

/// How the memory of one site changed between two points of a loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Growth {
    pub site: Site,
    /// Blocks alive at the second point that were not alive at the first.
    pub new_blocks: usize,
    /// Blocks alive at the first point that are gone at the second.
    pub freed_blocks: usize,
    /// Bytes (rounded, as the allocator counts them) of the new blocks, less those of
    /// the freed ones.
    pub net_bytes: i64,
}
// ANCHOR_END: growth_types
