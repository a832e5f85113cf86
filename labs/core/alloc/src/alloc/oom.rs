//! Before raising out-of-memory: the retry ladder, and the one place the allocator's
//! out-of-memory error is built.

use super::allocator::Allocation;
use super::caching::State;
use super::category::Category;
use super::history::frames_of;
use super::origin::origin_of;
use super::pool::BlockState;
use super::pool::PoolKey;
use crate::backend::MemoryBackend;
use crate::error::{Error, Result};
use crate::oom_report::{LiveAllocation, OomReport, Suggestion};
use crate::snapshot::{Frame, TraceAction};

/// What has been tried for a request so far, in the order the ladder climbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Best fit, else a new segment.
    First,
    /// Again, after waiting for the events of pending cross-stream frees.
    AfterWaitingForFrees,
    /// Again, after returning every cached byte to the driver.
    AfterReleasingCache,
}

impl State {
    // ANCHOR: malloc_retry
    /// Serves a request that no parked block could: tries, and on out-of-memory frees
    /// what can be freed and tries again, the whole search each time.
    pub(super) fn malloc_with_retries(
        &mut self,
        be: &dyn MemoryBackend,
        key: PoolKey,
        stream: u64,
        rounded: u64,
        size: u64,
        category: Category,
    ) -> Result<Allocation> {
        let mut attempt = Attempt::First;
        loop {
            match self.try_malloc(be, key, stream, rounded, size, category, true) {
                Err(e) if e.is_out_of_memory() => {}
                result => return result,
            }
            // While a graph is captured nothing may wait or give memory back: the
            // request fails at once, as in PyTorch.
            let capturing = self.capture_underway();
            attempt = match attempt {
                // A block freed on another stream may be exactly what is needed: wait
                // for its events rather than fail (PyTorch can raise here).
                Attempt::First if !self.deferred.is_empty() && !capturing => {
                    self.process_events(true)?;
                    Attempt::AfterWaitingForFrees
                }
                Attempt::First | Attempt::AfterWaitingForFrees if !capturing => {
                    self.stats.num_alloc_retries += 1;
                    self.process_events(true)?;
                    self.release_cached(be)?;
                    Attempt::AfterReleasingCache
                }
                _ => {
                    // Last, a pool that lends on out-of-memory (`use_on_oom`) may have
                    // a free block that fits.
                    for lane in self.lending_lanes(key) {
                        match self.try_malloc(be, lane, stream, rounded, size, category, false) {
                            Err(e) if e.is_out_of_memory() => {}
                            result => return result,
                        }
                    }
                    self.stats.num_ooms += 1;
                    self.note(TraceAction::Oom, 0, size, stream);
                    return Err(self.out_of_memory_report(be, size));
                }
            };
        }
    }
    // ANCHOR_END: malloc_retry

    /// The out-of-memory error of one attempt, which the retry ladder may still
    /// recover from: the figures only, cheap to make.
    pub(super) fn out_of_memory(&self, requested: u64) -> Error {
        Error::OutOfMemory {
            device: self.device,
            requested,
            free: self.limit.saturating_sub(self.stats.reserved.current),
            total: self.limit,
            report: None,
        }
    }

    // ANCHOR: oom_report
    /// The error a request fails with for good: the device's figures from the driver,
    /// and the allocator's [`OomReport`] of what holds the memory.
    pub(super) fn out_of_memory_report(&self, be: &dyn MemoryBackend, requested: u64) -> Error {
        let (free, total) = match be.mem_info() {
            Ok(info) => (info.free, info.total),
            Err(_) => (
                self.limit.saturating_sub(self.stats.reserved.current),
                self.total,
            ),
        };
        let (free_pieces, largest_free) = self.free_pieces();
        let mut report = OomReport {
            allocated: self.stats.allocated.current,
            private_pools_allocated: self.private_pools_allocated(),
            reserved: self.stats.reserved.current,
            limit: self.limit,
            fraction: self.conf.per_process_memory_fraction,
            expandable: self.conf.expandable_segments,
            free_pieces,
            largest_free,
            activations: self.stats.by_category[Category::Activation.index()].current,
            largest_live: self.largest_live(5),
            suggestion: Suggestion::FreeOrSmallerBatch,
        };
        report.suggestion = report.suggest(requested, total);
        // The driver's pool has no segments to make expandable: its cache is given back
        // to the device, not carved differently.
        if self.stream_ordered.is_some() && report.suggestion == Suggestion::ExpandableSegments {
            report.suggestion = Suggestion::FreeOrSmallerBatch;
        }
        Error::OutOfMemory {
            device: self.device,
            requested,
            free,
            total,
            report: Some(Box::new(report)),
        }
    }
    // ANCHOR_END: oom_report

    /// Reserved but unallocated memory as separate pieces: free blocks, counting only
    /// the pages with memory behind them. Their number and the largest.
    fn free_pieces(&self) -> (u64, u64) {
        let (mut count, mut largest) = (0u64, 0u64);
        for seg in self.segments.iter().filter(|s| s.alive) {
            let mapped = if seg.expandable {
                self.pages.mapped_ranges(seg)
            } else {
                vec![(seg.base, seg.size)]
            };
            for b in self.blocks_of(seg) {
                if !matches!(b.state, BlockState::Free | BlockState::Parked) {
                    continue;
                }
                for &(start, len) in &mapped {
                    let lo = b.addr.max(start);
                    let hi = (b.addr + b.size).min(start + len);
                    if hi > lo {
                        count += 1;
                        largest = largest.max(hi - lo);
                    }
                }
            }
        }
        (count, largest)
    }

    /// The `n` largest live allocations, largest first, with their categories and,
    /// when the history records backtraces, where they were made.
    fn largest_live(&self, n: usize) -> Vec<LiveAllocation> {
        let mut live: Vec<_> = self
            .segments
            .iter()
            .filter(|s| s.alive)
            .flat_map(|s| self.blocks_of(s))
            .filter(|b| b.state == BlockState::Allocated)
            .chain(self.stream_ordered_live())
            .map(|b| (b.size, b.addr, b.category))
            .collect();
        live.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        live.truncate(n);
        live.into_iter()
            .map(|(size, addr, category)| LiveAllocation {
                size,
                category: category.name(),
                site: self
                    .history
                    .as_ref()
                    .and_then(|h| h.alloc_site(addr))
                    .and_then(|bt| call_site(&frames_of(&bt))),
            })
            .collect()
    }
}

/// Where a block was made, as the leak guard says it: the op, and the program's line
/// that called it.
fn call_site(frames: &[Frame]) -> Option<String> {
    let origin = origin_of(frames);
    match (&origin.op, &origin.at) {
        (None, None) => None,
        (None, Some(at)) => Some(at.clone()),
        _ => Some(origin.to_string()),
    }
}
