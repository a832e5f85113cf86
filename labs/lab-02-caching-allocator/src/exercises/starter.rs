//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-02 --features exercises`.

use std::collections::BTreeSet;

use labs_core::alloc::Pool;

use super::{FreeBlock, Segment, Split};

// ANCHOR: exercise_round
/// Exercise 1a: the bytes a request of `size` bytes occupies, with PyTorch's default
/// rounding (no `roundup_power2_divisions`).
pub fn round_request(size: u64) -> u64 {
    let _ = size;
    todo!("the block size for this request (chapter 2, 'Rounding and the two pools')")
}

/// Exercise 1b: the size of the fixed segment taken from the driver when no free
/// block fits a request already rounded to `rounded` bytes.
pub fn new_segment_size(rounded: u64) -> u64 {
    let _ = rounded;
    todo!("the new segment's size, which depends on the request's size class")
}
// ANCHOR_END: exercise_round

// ANCHOR: exercise_best_fit
/// Exercise 2: the free block the allocator picks for a request of `rounded` bytes,
/// among the free blocks of one stream and pool; `None` when none is large enough
/// (the allocator then takes a new segment).
pub fn best_fit(free: &BTreeSet<FreeBlock>, rounded: u64) -> Option<FreeBlock> {
    let _ = (free, rounded);
    todo!("the best fit, ties broken as the free set's order breaks them; one search, no scan")
}
// ANCHOR_END: exercise_best_fit

// ANCHOR: exercise_split
/// Exercise 3: how `block`, found for a request of `rounded` bytes in `pool`, is
/// handed out on fixed segments: the block's front, with the rest kept as a free
/// block only when the pool's rule says it is worth keeping. `max_split_size` is the
/// knob of the same name (`None`: not set).
pub fn split(block: FreeBlock, rounded: u64, pool: Pool, max_split_size: Option<u64>) -> Split {
    let _ = (block, rounded, pool, max_split_size);
    todo!("split or not: each pool's rule for a remainder, and the max_split_size knob")
}
// ANCHOR_END: exercise_split

// ANCHOR: exercise_segment
/// Exercise 4 (build it): the block mechanics of one segment. `segment.rs` holds the
/// data (`blocks`, `free`, `high_water`) and the methods that read it; these two
/// change it, and must leave every field consistent with the others.
impl Segment {
    /// Hands out `rounded` bytes (a positive multiple of 512) and returns the block's
    /// address, or `None`, changing nothing, when no free block is large enough. The
    /// block is the front of the best fit; the rest of it, when 512 bytes or more, is
    /// a free block of its own (on an expandable segment, and in the small pool, that
    /// is the allocator's rule).
    pub fn malloc(&mut self, rounded: u64) -> Option<u64> {
        let _ = rounded;
        todo!("choose, carve, keep the rest; and remember how far the segment has grown")
    }

    /// Frees the block handed out at `addr` and merges it with a free neighbour on
    /// either side, so that no two free blocks ever touch. Returns `false`, changing
    /// nothing, when no allocated block starts at `addr`.
    pub fn free(&mut self, addr: u64) -> bool {
        let _ = addr;
        todo!("mark it free, then look at the block after it and the block before it")
    }
}
// ANCHOR_END: exercise_segment
