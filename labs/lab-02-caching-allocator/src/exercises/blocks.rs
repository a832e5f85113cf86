//! The two small types the exercises trade in, shared by the starter code and the
//! solutions.

// ANCHOR: free_block
/// A free block: `size` bytes at `addr`. The fields are in this order so that the
/// derived ordering sorts by size first, then by address: the order in which
/// the allocator's free set is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FreeBlock {
    pub size: u64,
    pub addr: u64,
}

/// What becomes of a free block that serves a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Bytes of the block handed out. It starts at the free block's address.
    pub handed_out: u64,
    /// The rest, kept as a free block of its own; `None` when it stays attached to
    /// the block handed out (or when nothing is left).
    pub remainder: Option<FreeBlock>,
}
// ANCHOR_END: free_block
