//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-02 --features exercises`.

use std::collections::BTreeSet;

use labs_core::alloc::Pool;

use super::{FreeBlock, Split};

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
    todo!("split or not, by the rule of chapter 2's 'Split and merge' and the max_split_size knob")
}
// ANCHOR_END: exercise_split
