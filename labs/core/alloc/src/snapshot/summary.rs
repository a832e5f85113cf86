//! The figures `summary` prints: counts and byte totals over segments, blocks and the
//! trace, with PyTorch's meanings (allocated = bytes of blocks handed out, after
//! rounding; reserved = bytes held from the driver).

use std::collections::HashMap;

use serde::Serialize;

use super::model::{BlockState, Snapshot, TraceAction};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub segments: usize,
    pub small_segments: usize,
    pub large_segments: usize,
    /// Sum of the segments' sizes.
    pub reserved_bytes: u64,
    /// Sum of the sizes of blocks in state active_allocated.
    pub allocated_bytes: u64,
    /// What the program asked for in those blocks, before rounding.
    pub requested_bytes: u64,
    pub active_blocks: usize,
    pub pending_free_blocks: usize,
    pub pending_free_bytes: u64,
    pub inactive_blocks: usize,
    /// Cached bytes: reserved but not active.
    pub inactive_bytes: u64,
    pub largest_inactive_block: u64,
    pub trace_events: usize,
    pub trace_allocs: usize,
    pub trace_frees: usize,
    pub trace_segment_allocs: usize,
    pub trace_ooms: usize,
    /// Peak of the live sum of `alloc` sizes over the trace (requested bytes: the
    /// reservation a perfect allocator would need). Only as good as the trace is
    /// complete: a ring buffer that dropped early events undercounts.
    pub trace_peak_requested_bytes: u64,
    /// Allocated bytes by what they hold, when the snapshot's blocks say (the labs'
    /// snapshots do; PyTorch's do not, and then this is empty).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub allocated_by_category: std::collections::BTreeMap<String, u64>,
}

impl Summary {
    pub fn of(s: &Snapshot) -> Summary {
        let blocks = || s.segments.iter().flat_map(|seg| seg.blocks.iter());
        let in_state = |state: BlockState| blocks().filter(move |b| b.state == state);
        let count = |a: TraceAction| s.trace.iter().filter(|e| e.action == a).count();
        let mut allocated_by_category = std::collections::BTreeMap::new();
        for b in in_state(BlockState::ActiveAllocated) {
            if let Some(c) = &b.category {
                *allocated_by_category.entry(c.clone()).or_insert(0u64) += b.size;
            }
        }
        Summary {
            segments: s.segments.len(),
            small_segments: s
                .segments
                .iter()
                .filter(|g| g.segment_type == super::SegmentType::Small)
                .count(),
            large_segments: s
                .segments
                .iter()
                .filter(|g| g.segment_type == super::SegmentType::Large)
                .count(),
            reserved_bytes: s
                .segments
                .iter()
                .map(|g| g.total_size)
                .fold(0, u64::saturating_add),
            allocated_bytes: in_state(BlockState::ActiveAllocated)
                .map(|b| b.size)
                .fold(0, u64::saturating_add),
            requested_bytes: in_state(BlockState::ActiveAllocated)
                .map(|b| b.requested_size)
                .fold(0, u64::saturating_add),
            active_blocks: in_state(BlockState::ActiveAllocated).count(),
            pending_free_blocks: in_state(BlockState::ActivePendingFree).count(),
            pending_free_bytes: in_state(BlockState::ActivePendingFree)
                .map(|b| b.size)
                .fold(0, u64::saturating_add),
            inactive_blocks: in_state(BlockState::Inactive).count(),
            inactive_bytes: in_state(BlockState::Inactive)
                .map(|b| b.size)
                .fold(0, u64::saturating_add),
            largest_inactive_block: in_state(BlockState::Inactive)
                .map(|b| b.size)
                .max()
                .unwrap_or(0),
            trace_events: s.trace.len(),
            trace_allocs: count(TraceAction::Alloc),
            trace_frees: count(TraceAction::FreeRequested),
            trace_segment_allocs: count(TraceAction::SegmentAlloc),
            trace_ooms: count(TraceAction::Oom),
            trace_peak_requested_bytes: peak_requested(s),
            allocated_by_category,
        }
    }
}

fn peak_requested(s: &Snapshot) -> u64 {
    // Sums of u128: trace sizes are the file's, and no trace can wrap them.
    let mut live: HashMap<(i64, u64), u64> = HashMap::new();
    let (mut current, mut peak) = (0u128, 0u128);
    for e in &s.trace {
        match e.action {
            TraceAction::Alloc => {
                if let Some(old) = live.insert((e.device, e.addr), e.size) {
                    current -= old as u128;
                }
                current += e.size as u128;
                peak = peak.max(current);
            }
            TraceAction::FreeRequested => {
                if let Some(size) = live.remove(&(e.device, e.addr)) {
                    current -= size as u128;
                }
            }
            _ => {}
        }
    }
    u64::try_from(peak).unwrap_or(u64::MAX)
}
