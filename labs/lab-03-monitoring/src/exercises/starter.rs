//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-03 --features exercises`.

use labs_core::alloc::SegmentInfo;
use labs_core::snapshot::Snapshot;

use super::Counters;

// ANCHOR: exercise_recount
/// Exercise 1: allocated, reserved and active bytes, recounted from the allocator's
/// listing of its segments and their blocks (`Allocator::segments()`), for any
/// configuration, expandable segments included.
pub fn recount(segments: &[SegmentInfo]) -> Counters {
    let _ = segments;
    todo!("the three figures as 'Five numbers, one inside the other' and 'Active is not allocated' define them")
}
// ANCHOR_END: exercise_recount

// ANCHOR: exercise_largest_cached
/// Exercise 2: the largest block the snapshot's allocator could hand out right away
/// without asking the driver for memory (0 when there is none).
pub fn largest_cached_block(snapshot: &Snapshot) -> u64 {
    let _ = snapshot;
    todo!("mind the three block states a snapshot uses")
}
// ANCHOR_END: exercise_largest_cached

// ANCHOR: exercise_peak
/// Exercise 3: the most bytes the program had asked for and not yet freed at any
/// moment of the snapshot's trace: what a perfect allocator would have had to reserve.
/// Bytes are live from their `alloc` event to their `free_requested` event.
pub fn peak_live_bytes(snapshot: &Snapshot) -> u64 {
    let _ = snapshot;
    todo!("the peak of the live total over the trace, in order (the history's actions)")
}
// ANCHOR_END: exercise_peak
