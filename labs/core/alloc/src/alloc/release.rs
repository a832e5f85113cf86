//! Giving memory back to the driver: whole free segments and idle pages, for
//! `empty_cache`, the out-of-memory ladder and the garbage collector, and the segments of
//! released private pools (`mempool.rs`).

use super::caching::State;
use super::pool::BlockState;
use crate::backend::MemoryBackend;
use crate::error::Result;
use crate::snapshot::TraceAction;

impl State {
    /// Gives back whole free segments and idle pages; returns the bytes released. The
    /// segments of private pools still in use stay (`mempool.rs`).
    pub fn release_cached(&mut self, be: &dyn MemoryBackend) -> Result<u64> {
        if self.stream_ordered.is_some() {
            return self.trim_stream_ordered(be);
        }
        self.unpark_all();
        let before = self.stats.reserved.current;
        for s in 0..self.segments.len() {
            if !self.segments[s].alive {
                continue;
            }
            if !self.pools.is_empty() && self.in_live_pool(self.segments[s].key) {
                continue;
            }
            if self.segments[s].expandable {
                self.unmap_idle(be, s as u32)?;
            }
            self.release_segment_if_free(be, s)?;
        }
        self.sample_timeline();
        Ok(before - self.stats.reserved.current)
    }

    /// Gives segment `s` back to the driver if one free block covers it, unless a
    /// graph is being captured: freeing device memory synchronises the device, which
    /// ends a capture with an error, so the segment stays cached until the capture ends
    /// (as PyTorch's allocator releases no cached block while a capture is underway).
    pub(super) fn release_segment_if_free(
        &mut self,
        be: &dyn MemoryBackend,
        s: usize,
    ) -> Result<()> {
        if self.capture_underway() {
            return Ok(());
        }
        let seg = &self.segments[s];
        let first = &self.blocks[seg.first];
        if first.state != BlockState::Free || first.size != seg.size {
            return Ok(());
        }
        let (key, base, size, first_id, stream, expandable) = (
            seg.key,
            seg.base,
            seg.size,
            seg.first,
            seg.stream,
            seg.expandable,
        );
        self.unlist_free(key, first_id);
        if expandable {
            (self.stats.driver.segment_free).time(|| be.vm_release(base, size as usize))?;
        } else {
            (self.stats.driver.segment_free).time(|| be.raw_free(base))?;
            self.note(TraceAction::SegmentFree, base, size, stream);
            self.stats.device_frees += 1;
            self.stats.reserved.sub(key.pool, size);
        }
        self.blocks.remove(first_id);
        self.stats.segments.sub(key.pool, 1);
        let seg = &mut self.segments[s];
        seg.alive = false;
        seg.pages = Vec::new();
        self.vacant_segments.push(s as u32);
        if !self.pools.is_empty() {
            self.forget_segment(key);
        }
        Ok(())
    }
}
