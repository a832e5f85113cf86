//! Reference solutions to the exercises in `starter.rs`.

use std::collections::HashMap;

use labs_core::alloc::{BlockState, SegmentInfo};
use labs_core::snapshot::{self, Snapshot, TraceAction};

use super::Counters;

pub fn recount(segments: &[SegmentInfo]) -> Counters {
    let mut c = Counters::default();
    for seg in segments {
        // Reserved memory is memory behind addresses: all of a fixed segment, only
        // the mapped pages of an expandable one.
        c.reserved += seg.mapped();
        for b in &seg.blocks {
            match b.state {
                BlockState::Allocated => {
                    c.allocated += b.size;
                    c.active += b.size;
                }
                // Freed, but still in use by another stream: active, not allocated.
                BlockState::Pending => c.active += b.size,
                BlockState::Free | BlockState::Parked => {}
            }
        }
    }
    c
}

pub fn largest_cached_block(snapshot: &Snapshot) -> u64 {
    snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == snapshot::BlockState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0)
}

pub fn peak_live_bytes(snapshot: &Snapshot) -> u64 {
    // Live allocations by (device, address): a free is matched to its allocation, and
    // a free of memory allocated before the trace began counts for nothing.
    let mut live: HashMap<(i64, u64), u64> = HashMap::new();
    let (mut current, mut peak) = (0u64, 0u64);
    for e in &snapshot.trace {
        match e.action {
            TraceAction::Alloc => {
                current += e.size;
                if let Some(old) = live.insert((e.device, e.addr), e.size) {
                    current -= old;
                }
                peak = peak.max(current);
            }
            TraceAction::FreeRequested => {
                if let Some(size) = live.remove(&(e.device, e.addr)) {
                    current -= size;
                }
            }
            _ => {}
        }
    }
    peak
}
