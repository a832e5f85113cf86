//! The figures exercise 1 recounts, shared by the starter code and the solutions.

// ANCHOR: counters
/// Three of the allocator's current figures, in bytes, with PyTorch's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// `memory_allocated()`.
    pub allocated: u64,
    /// `memory_reserved()`.
    pub reserved: u64,
    /// `memory_stats()["active_bytes.all.current"]`.
    pub active: u64,
}
// ANCHOR_END: counters
