//! What the allocator reports: statistics under PyTorch's names, its segments and
//! blocks, the blocks live now, the memory history and snapshots.

use std::collections::HashMap;

use super::allocator::Allocator;
use super::caching::State;
use super::export::{to_snapshot, LiveBlock};
use super::history::{frames_of, History, HistoryEvent};
use super::pool::{BlockRecord, BlockState, Segment, NONE};
use super::size::Pool;
use super::stats::Stats;
use super::timeline::{CategorySample, CategoryTimeline};
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::snapshot::{Frame, Snapshot};

/// One segment as [`Allocator::segments`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base: DevicePtr,
    pub size: u64,
    pub stream: u64,
    pub pool: Pool,
    /// The memory pool it belongs to (PyTorch's `segment_pool_id`).
    pub pool_id: super::MemPoolId,
    pub expandable: bool,
    /// The (address, length) of each run of memory-backed pages, in address order: the
    /// whole segment when it is fixed.
    pub mapped_ranges: Vec<(u64, u64)>,
    pub blocks: Vec<BlockInfo>,
}

/// One block of a [`SegmentInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    pub addr: DevicePtr,
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
    /// What it holds, while allocated.
    pub category: super::Category,
}

impl SegmentInfo {
    /// Bytes with memory behind them (all of a fixed segment).
    pub fn mapped(&self) -> u64 {
        self.mapped_ranges.iter().map(|r| r.1).sum()
    }
}

impl State {
    /// The blocks of a segment, in address order.
    pub(super) fn blocks_of<'a>(&'a self, seg: &Segment) -> impl Iterator<Item = &'a BlockRecord> {
        std::iter::successors((seg.first != NONE).then(|| &self.blocks[seg.first]), |b| {
            (b.next != NONE).then(|| &self.blocks[b.next])
        })
    }
}

impl Allocator {
    /// Every statistic. Parked blocks are merged into the free set first, so that the
    /// figures (`inactive_split` is the one parking changes) read as for an allocator
    /// that merges every freed block at once.
    pub fn stats(&self) -> Stats {
        let mut st = self.lock();
        st.unpark_all();
        st.refresh_pool_stats(&*self.backend)
            .unwrap_or_else(|e| eprintln!("warning: reading {}'s pool: {e}", self.device));
        st.stats
    }

    /// Starts every peak again from the current value (with `backend:cudaMallocAsync`,
    /// the pool's high-water marks too).
    pub fn reset_peak_stats(&self) {
        let mut st = self.lock();
        if st.stream_ordered.is_some() {
            st.reset_pool_peaks(&*self.backend)
                .unwrap_or_else(|e| eprintln!("warning: resetting {}'s pool: {e}", self.device));
        } else {
            st.stats.reset_peaks();
        }
    }

    /// Bytes in blocks handed out (PyTorch's `memory_allocated`).
    pub fn memory_allocated(&self) -> u64 {
        self.lock().stats.allocated.current
    }

    /// Bytes held from the driver (PyTorch's `memory_reserved`).
    pub fn memory_reserved(&self) -> u64 {
        self.reserved_stat().current
    }

    /// The most bytes handed out at once since the last peak reset.
    pub fn max_memory_allocated(&self) -> u64 {
        self.lock().stats.allocated.peak
    }

    /// The most bytes held from the driver since the last peak reset.
    pub fn max_memory_reserved(&self) -> u64 {
        self.reserved_stat().peak
    }

    /// The reserved figures, read from the driver's pool first with
    /// `backend:cudaMallocAsync`.
    fn reserved_stat(&self) -> super::Stat {
        let mut st = self.lock();
        if st.stream_ordered.is_some() {
            st.refresh_pool_stats(&*self.backend)
                .unwrap_or_else(|e| eprintln!("warning: reading {}'s pool: {e}", self.device));
        }
        st.stats.reserved.all
    }

    /// Bytes allocated now and at their peak, by what they hold, in
    /// [`Category::ALL`](super::Category::ALL) order.
    pub fn memory_by_category(&self) -> Vec<(super::Category, super::Stat)> {
        let st = self.lock();
        super::Category::ALL
            .iter()
            .map(|&c| (c, st.stats.by_category[c.index()]))
            .collect()
    }

    /// Allocated bytes by what they hold at the moment of the allocated peak (since the
    /// last peak reset), in [`Category::ALL`](super::Category::ALL) order: they sum to
    /// [`max_memory_allocated`](Self::max_memory_allocated).
    pub fn memory_by_category_at_peak(&self) -> Vec<(super::Category, u64)> {
        let st = self.lock();
        super::Category::ALL
            .iter()
            .map(|&c| (c, st.stats.by_category_at_peak[c.index()]))
            .collect()
    }

    /// PyTorch's name for [`reset_peak_stats`](Self::reset_peak_stats).
    pub fn reset_peak_memory_stats(&self) {
        self.reset_peak_stats();
    }

    /// PyTorch's `memory_stats()`: every statistic under its PyTorch key.
    pub fn memory_stats(&self) -> std::collections::BTreeMap<String, u64> {
        self.stats().to_map()
    }

    /// PyTorch's `memory_summary()`: the statistics as a table, with a row for the
    /// private pools' memory once a pool exists.
    pub fn memory_summary(&self) -> String {
        let mut out = self.stats().summary(&self.device.to_string());
        let pools = self.lock().pools.len();
        if pools > 0 {
            let row = format!(
                "| {:<21} | {:>49} |\n",
                "Private pools",
                format!(
                    "{pools} made, {} reserved",
                    crate::format::bytes(self.private_pools_reserved())
                )
            );
            // Before the closing rule.
            let end = out.trim_end().rfind('\n').map_or(out.len(), |i| i + 1);
            out.insert_str(end, &row);
        }
        out
    }

    /// How many allocations this allocator has handed out so far: a baseline for
    /// [`live_blocks`](Self::live_blocks) (blocks with a higher number came later).
    pub fn allocations_so_far(&self) -> u64 {
        self.lock().stats.allocations.all.allocated
    }

    // ANCHOR: record_memory_history
    /// Starts recording the memory history (PyTorch's `_record_memory_history`): the
    /// last `max_entries` events, each with the Rust backtrace of its call when
    /// `with_backtraces` is set. A `max_entries` of 0 stops recording and drops the
    /// history. Starting again starts a new history.
    pub fn record_memory_history(&self, max_entries: usize, with_backtraces: bool) {
        self.lock().history =
            (max_entries > 0).then(|| Box::new(History::new(max_entries, with_backtraces)));
    }
    // ANCHOR_END: record_memory_history

    // ANCHOR: record_category_timeline
    /// Starts recording the category timeline: after every allocation, free, change of
    /// category and release of cached memory, the bytes in each category and the bytes
    /// reserved, up to `max_samples` samples (see `alloc/timeline.rs`). 0 stops and
    /// drops it; starting again starts afresh. The first sample is the state now.
    pub fn record_category_timeline(&self, max_samples: usize) {
        let mut st = self.lock();
        st.timeline = (max_samples > 0).then(|| Box::new(CategoryTimeline::new(max_samples)));
        st.sample_timeline();
    }
    // ANCHOR_END: record_category_timeline

    /// The category timeline recorded so far, oldest first (empty when none is
    /// recorded), and how many samples did not fit.
    pub fn category_timeline(&self) -> (Vec<CategorySample>, u64) {
        let st = self.lock();
        st.timeline
            .as_ref()
            .map_or((Vec::new(), 0), |t| (t.samples().to_vec(), t.dropped))
    }

    /// The recorded history, oldest first (empty when none is recorded), and how many
    /// older entries the ring buffer let go.
    pub fn history(&self) -> (Vec<HistoryEvent>, u64) {
        let st = self.lock();
        st.history
            .as_ref()
            .map_or((Vec::new(), 0), |h| (h.events(), h.dropped))
    }

    /// The allocator's state and history in the snapshot model that lab 3 reads, draws
    /// and exports (PyTorch's `torch.cuda.memory._snapshot()`). An expandable segment
    /// appears as one segment per run of mapped pages, so that segment sizes add up to
    /// `memory_reserved`, as in PyTorch.
    pub fn snapshot(&self) -> Snapshot {
        let segments = self.segments();
        let (events, sites) = {
            let st = self.lock();
            match &st.history {
                Some(h) => {
                    let sites: HashMap<u64, Vec<Frame>> = segments
                        .iter()
                        .flat_map(|s| &s.blocks)
                        .filter(|b| b.state == BlockState::Allocated)
                        .filter_map(|b| h.alloc_site(b.addr).map(|bt| (b.addr, bt)))
                        .map(|(a, bt)| (a, frames_of(&bt)))
                        .collect();
                    (h.events(), sites)
                }
                None => (Vec::new(), HashMap::new()),
            }
        };
        to_snapshot(self.device, &self.config(), &segments, &events, &sites)
    }

    /// Writes [`snapshot`](Self::snapshot) to `path` as JSON (PyTorch's
    /// `_dump_snapshot`), for `lab-03 summary`, `plot` and `export-trace`.
    pub fn dump_snapshot(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        crate::snapshot::dump_to_file(&self.snapshot(), path)
            .map_err(|e| Error::InvalidArgument(e.to_string()))
    }

    /// The blocks allocated now, oldest allocation first, each with the number of
    /// its allocation (see [`allocations_so_far`](Self::allocations_so_far)) and, when
    /// the history records backtraces, where it was made.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let st = self.lock();
        let mut live: Vec<LiveBlock> = (st.segments.iter())
            .filter(|s| s.alive)
            .flat_map(|s| st.blocks_of(s))
            .filter(|b| b.state == BlockState::Allocated)
            .chain(st.stream_ordered_live())
            .map(|b| LiveBlock {
                addr: b.addr,
                size: b.size,
                requested: b.requested,
                stream: st.stream_of(b.key),
                serial: b.serial,
                category: b.category,
                saved_by: st
                    .history
                    .as_ref()
                    .and_then(|h| h.saved_by(b.addr).map(str::to_string)),
                backtrace: st.history.as_ref().and_then(|h| h.alloc_site(b.addr)),
            })
            .collect();
        live.sort_by_key(|b| b.serial);
        live
    }

    /// The segments and their blocks, in address order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut st = self.lock();
        st.unpark_all();
        let mut out: Vec<SegmentInfo> = (st.segments.iter())
            .filter(|s| s.alive)
            .map(|s| {
                let blocks = st
                    .blocks_of(s)
                    .map(|b| BlockInfo {
                        addr: b.addr,
                        size: b.size,
                        requested: b.requested,
                        state: b.state,
                        category: b.category,
                    })
                    .collect();
                SegmentInfo {
                    base: s.base,
                    size: s.size,
                    stream: s.stream,
                    pool: s.pool(),
                    pool_id: super::MemPoolId(st.pool_of_key(s.key)),
                    expandable: s.expandable,
                    mapped_ranges: if s.expandable {
                        st.pages.mapped_ranges(s)
                    } else {
                        vec![(s.base, s.size)]
                    },
                    blocks,
                }
            })
            .collect();
        out.sort_by_key(|s| s.base);
        out
    }
}
