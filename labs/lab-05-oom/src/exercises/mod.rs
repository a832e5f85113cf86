//! Workshop exercises. The default build compiles the reference solutions, so CI
//! checks them; `--features exercises` swaps in the starter code, and the same tests
//! (`cargo test -p lab-05 --features exercises`) then grade the student's version.

#[cfg(feature = "exercises")]
mod starter;
#[cfg(feature = "exercises")]
pub use starter::*;

#[cfg(not(feature = "exercises"))]
mod solutions;
#[cfg(not(feature = "exercises"))]
pub use solutions::*;

// ANCHOR: accounting
/// The figures an out-of-memory report gives about the allocator's memory (exercise 4),
/// the same as [`labs_core::oom_report::OomReport`]'s fields of those names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Bytes in blocks handed out to the program (`memory_allocated`).
    pub allocated: u64,
    /// Bytes held from the driver (`memory_reserved`).
    pub reserved: u64,
    /// How many separate free pieces of the reserved memory a request could be served
    /// from, and the largest of them.
    pub free_pieces: u64,
    pub largest_free: u64,
    /// Bytes of activations saved for backward, among `allocated`.
    pub activations: u64,
}

impl Accounting {
    /// Reserved but unallocated: PyTorch's "reserved by PyTorch but unallocated".
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}
// ANCHOR_END: accounting
