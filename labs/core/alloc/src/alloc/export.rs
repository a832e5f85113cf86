//! The allocator's state in the snapshot model of lab 3 (`crate::snapshot`), and the
//! live blocks the leak guard reports.

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::sync::Arc;

use super::config::Config;
use super::history::HistoryEvent;
use super::pool::BlockState;
use super::report::SegmentInfo;
use super::size::Pool;
use crate::backend::DeviceId;
use crate::snapshot::{self, AllocatorSettings, Frame, SegmentType, Snapshot, TraceEvent};

/// A block allocated now, as [`Allocator::live_blocks`](super::Allocator::live_blocks)
/// reports it.
#[derive(Debug, Clone)]
pub struct LiveBlock {
    pub addr: u64,
    /// Bytes after rounding.
    pub size: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    pub stream: u64,
    /// The allocator's count of allocations when this one was made (1 for the first).
    pub serial: u64,
    /// What it holds.
    pub category: super::Category,
    /// The autograd op that saved it for backward, when the memory history recorded
    /// it.
    pub saved_by: Option<String>,
    /// Where it was allocated, when the history records backtraces.
    pub backtrace: Option<Arc<Backtrace>>,
}

impl LiveBlock {
    /// The op that allocated the block and the program's line that called it, when the
    /// history recorded its backtrace.
    pub fn origin(&self) -> Option<super::Origin> {
        let bt = self.backtrace.as_deref()?;
        Some(super::origin_of(&super::frames_of(bt)))
    }
}

/// Builds a [`Snapshot`]: each run of memory-backed pages becomes a segment holding the
/// parts of the blocks that lie on it; `sites` gives the frames of allocated blocks.
pub(crate) fn to_snapshot(
    device: DeviceId,
    conf: &Config,
    segments: &[SegmentInfo],
    events: &[HistoryEvent],
    sites: &HashMap<u64, Vec<Frame>>,
) -> Snapshot {
    let ordinal = match device {
        DeviceId::Cuda(n) | DeviceId::Sim(n) | DeviceId::Dry(n) => n as i64,
        DeviceId::Cpu => -1,
    };
    let mut out = Vec::new();
    for seg in segments {
        for &(start, len) in &seg.mapped_ranges {
            let end = start + len;
            let blocks = seg
                .blocks
                .iter()
                .filter(|b| b.addr < end && b.addr + b.size > start)
                .map(|b| {
                    let (lo, hi) = (b.addr.max(start), (b.addr + b.size).min(end));
                    let state = match b.state {
                        BlockState::Allocated => snapshot::BlockState::ActiveAllocated,
                        BlockState::Pending => snapshot::BlockState::ActivePendingFree,
                        BlockState::Free | BlockState::Parked => snapshot::BlockState::Inactive,
                    };
                    snapshot::Block {
                        address: lo,
                        size: hi - lo,
                        requested_size: if state == snapshot::BlockState::Inactive {
                            0
                        } else {
                            b.requested
                        },
                        state,
                        frames: sites.get(&b.addr).cloned().unwrap_or_default().into(),
                        category: (state == snapshot::BlockState::ActiveAllocated)
                            .then(|| b.category.name().to_string()),
                    }
                })
                .collect();
            out.push(snapshot::Segment {
                device: ordinal,
                address: start,
                total_size: len,
                stream: seg.stream,
                segment_type: match seg.pool {
                    Pool::Small => SegmentType::Small,
                    Pool::Large => SegmentType::Large,
                },
                is_expandable: seg.expandable,
                segment_pool_id: (0, seg.pool_id.0),
                blocks,
            });
        }
    }
    let trace = events
        .iter()
        .map(|e| TraceEvent {
            device: ordinal,
            action: e.action.clone(),
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            time_us: e.time_us,
            frames: e.frames().into(),
            category: e.category.map(|c| c.name().to_string()),
            saved_by: e.saved_by.clone(),
        })
        .collect();
    Snapshot {
        segments: out,
        trace,
        settings: AllocatorSettings {
            alloc_conf: conf.to_conf_string(),
            expandable_segments: conf.expandable_segments,
            max_split_size: conf.max_split_size,
            garbage_collection_threshold: conf.garbage_collection_threshold.unwrap_or(0.0),
            other: Default::default(),
        },
    }
}
