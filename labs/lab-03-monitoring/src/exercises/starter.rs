//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-03 --features exercises`.

use labs_core::alloc::SegmentInfo;
use labs_core::snapshot::Snapshot;

use super::Counters;

// ANCHOR: exercise_recount
/// Exercise 1: allocated, reserved and active bytes, recounted from the allocator's
/// listing of its segments and their blocks (`Allocator::segments()`), for any
/// configuration, expandable segments included. (Hint: each `BlockState` counts in
/// some of the three figures and not others; and read the doc comments of
/// `SegmentInfo`'s fields before counting an expandable segment.)
pub fn recount(segments: &[SegmentInfo]) -> Counters {
    let _ = segments;
    todo!(
        "the three figures as 'Five numbers, one inside the other' \
         and 'Active is not allocated' define them"
    )
}
// ANCHOR_END: exercise_recount

// ANCHOR: exercise_largest_cached
/// Exercise 2: the largest block the snapshot's allocator could hand out right away
/// without asking the driver for memory (0 when there is none). (Hint: chapter 3's
/// "The memory history" names the states a snapshot's blocks can be in.)
pub fn largest_cached_block(snapshot: &Snapshot) -> u64 {
    let _ = snapshot;
    todo!("mind the three block states a snapshot uses")
}
// ANCHOR_END: exercise_largest_cached

// ANCHOR: exercise_peak
/// Exercise 3: the most bytes the program had asked for and not yet freed at any
/// moment of the snapshot's trace: what a perfect allocator would have had to reserve.
/// Bytes are live from their `alloc` event to their `free_requested` event. (Hint: a
/// ring buffer may have dropped the `alloc` of a block whose free is still in the
/// trace: what in a free event tells you which allocation it ends?)
pub fn peak_live_bytes(snapshot: &Snapshot) -> u64 {
    let _ = snapshot;
    todo!("the peak of the live total over the trace, in order (the history's actions)")
}
// ANCHOR_END: exercise_peak
