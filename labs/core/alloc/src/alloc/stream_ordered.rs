//! `backend:cudaMallocAsync`: no cache of the labs' own. Every request is a
//! stream-ordered allocation from the driver's pool on the request's stream, every free a
//! stream-ordered free, as PyTorch's `CUDAMallocAsyncAllocator` does; the driver's pool
//! is the cache.
//!
//! What stays the allocator's: the handles (a stale or double free is caught), the
//! categories, the memory history, the leak guard, the out-of-memory observers, and
//! `allocated` (the bytes requested and not yet freed, PyTorch's own count against its
//! memory fraction). What comes from the pool: `reserved` (current and peak are the
//! pool's `ReservedMemCurrent` and `ReservedMemHigh`, read when asked for), and the
//! peaks' reset (the pool's high-water marks are reset with the allocator's).
//!
//! As in PyTorch, the pool keeps what is freed: its release threshold is set to
//! `u64::MAX`, so synchronisations give nothing back, and `empty_cache` synchronises
//! the device and trims the pool to what is live. A block used on other streams
//! (`record_stream`) is freed on a stream of its own that first waits for the block's
//! stream and every stream that used it, so its memory is reused once all that work is
//! done (PyTorch's "unifying free stream").
//!
//! The labs' choices where PyTorch gives nothing or does otherwise:
//! - each allocator has a pool of its own (`cuMemPoolCreate`) rather than the device's
//!   default pool, so that several allocators on one device (tests, the replays of
//!   `lab-02` side by side) each measure their own memory; with one allocator per
//!   device, as in PyTorch, that is the same;
//! - `num_device_alloc` / `num_device_free` count the driver's stream-ordered calls;
//! - `reserved` is the pool's whole figure (`all`); its small and large pools stay 0,
//!   as PyTorch leaves them, while `allocated` keeps its split by size;
//! - the segment listing and snapshots have no segments (the driver does not say how
//!   its pool is carved), and blocks are not rounded: an allocation's size is the size
//!   asked for;
//! - caching knobs, private pools and graph captures into a pool are refused.

use super::allocator::Allocation;
use super::caching::State;
use super::category::Category;
use super::pool::{BlockState, NONE};
use super::size::{pool_of, Pool};
use crate::backend::{AsyncPool, MemoryBackend, PoolAttribute, Stream};
use crate::error::{Error, Result};
use crate::snapshot::TraceAction;

/// The segment index of a block of the stream-ordered pool: it lies in no segment.
pub(super) const STREAM_ORDERED: u32 = NONE - 1;

/// The allocator's side of the driver's pool.
pub(super) struct StreamOrdered {
    pub pool: AsyncPool,
    /// Streams named only by their handles (replays), made at first use.
    streams: Vec<(u64, Stream)>,
    /// Where blocks used on several streams are freed, made at first use.
    unifier: Option<Stream>,
}

impl StreamOrdered {
    // ANCHOR: stream_ordered_new
    /// A pool of the allocator's own that keeps everything freed into it, as PyTorch
    /// sets the device's pool up.
    pub fn new(be: &dyn MemoryBackend) -> Result<StreamOrdered> {
        let pool = be.pool_create()?;
        be.pool_set_attribute(pool, PoolAttribute::ReleaseThreshold, u64::MAX)?;
        Ok(StreamOrdered {
            pool,
            streams: Vec::new(),
            unifier: None,
        })
    }
    // ANCHOR_END: stream_ordered_new
}

impl State {
    /// The stream of handle `stream`: the one given, else one seen before, else the
    /// default stream for handle 0 and a new stream for any other.
    fn stream_object(
        &mut self,
        be: &dyn MemoryBackend,
        stream: u64,
        object: Option<&Stream>,
    ) -> Result<Stream> {
        if let Some(s) = object {
            return Ok(s.clone());
        }
        if let Some(i) = self.streams.iter().position(|&s| s == stream) {
            if let Some(s) = &self.stream_objects[i] {
                return Ok(s.clone());
            }
        }
        let so = self.stream_ordered.as_deref_mut().expect("stream-ordered");
        if let Some((_, s)) = so.streams.iter().find(|(h, _)| *h == stream) {
            return Ok(s.clone());
        }
        let s = if stream == 0 {
            be.default_stream()?
        } else {
            be.new_stream(0)?
        };
        so.streams.push((stream, s.clone()));
        Ok(s)
    }

    // ANCHOR: malloc_stream_ordered
    /// A request served by the driver's pool on its stream.
    pub(super) fn malloc_stream_ordered(
        &mut self,
        be: &dyn MemoryBackend,
        size: u64,
        stream: u64,
        object: Option<&Stream>,
        category: Category,
    ) -> Result<Allocation> {
        // PyTorch's own limit: the bytes it holds, against the memory fraction.
        if size > self.limit.saturating_sub(self.stats.allocated.current) {
            return Err(self.stream_ordered_oom(be, size, stream));
        }
        let key = self.key_of(stream, object, pool_of(size.max(1)))?;
        let s = self.stream_object(be, stream, object)?;
        let pool = self.stream_ordered.as_ref().expect("stream-ordered").pool;
        let ptr = match (self.stats.driver.segment_alloc)
            .time(|| be.pool_alloc_async(pool, size as usize, &s))
        {
            Ok(ptr) => ptr,
            Err(e) if e.is_out_of_memory() => return Err(self.stream_ordered_oom(be, size, stream)),
            Err(e) => return Err(e),
        };
        self.stats.device_allocs += 1;
        let id = self
            .blocks
            .insert(ptr, size, key, STREAM_ORDERED, NONE, NONE);
        let a = self.hand_out(id, size, stream, category);
        if self.timeline.is_some() {
            self.refresh_pool_stats(be)?;
        }
        Ok(a)
    }
    // ANCHOR_END: malloc_stream_ordered

    /// Out of memory: counted, noted in the history, with the allocator's report.
    fn stream_ordered_oom(&mut self, be: &dyn MemoryBackend, size: u64, stream: u64) -> Error {
        self.stats.num_ooms += 1;
        self.note(TraceAction::Oom, 0, size, stream);
        if let Err(e) = self.refresh_pool_stats(be) {
            return e;
        }
        self.out_of_memory_report(be, size)
    }

    // ANCHOR: free_stream_ordered
    /// Frees a block into the driver's pool on its stream, or, when other streams used
    /// it, on the unifying stream once they and its own stream reach this point.
    pub(super) fn free_stream_ordered(
        &mut self,
        be: &dyn MemoryBackend,
        block: Allocation,
    ) -> Result<()> {
        self.check_handle(&block)?;
        let id = block.id;
        let own = self.stream_object(be, block.stream, None)?;
        let uses = std::mem::take(&mut self.blocks[id].stream_uses);
        let freed = self.free_on(be, block, own, &uses);
        if let Err(e) = freed {
            self.blocks[id].stream_uses = uses;
            return Err(e);
        }
        if !uses.is_empty() {
            self.stats.num_deferred_frees += 1;
        }
        self.stats.device_frees += 1;
        let b = &self.blocks[id];
        let (addr, requested, size, pool, category) =
            (b.addr, b.requested, b.size, b.key.pool, b.category);
        self.note(TraceAction::FreeRequested, addr, requested, block.stream);
        self.note(TraceAction::FreeCompleted, addr, requested, block.stream);
        let s = &mut self.stats;
        s.requested.sub(pool, requested);
        s.allocated.sub(pool, size);
        s.allocations.sub(pool, 1);
        s.active.sub(pool, 1);
        s.active_bytes.sub(pool, size);
        s.by_category[category.index()].sub(size);
        self.blocks[id].state = BlockState::Free;
        self.blocks.remove(id);
        self.sample_timeline();
        if self.timeline.is_some() {
            self.refresh_pool_stats(be)?;
        }
        Ok(())
    }
    // ANCHOR_END: free_stream_ordered

    /// The driver's free of `block`, ordered after its stream's work and `uses`' work.
    fn free_on(
        &mut self,
        be: &dyn MemoryBackend,
        block: Allocation,
        own: Stream,
        uses: &[Stream],
    ) -> Result<()> {
        let on = if uses.is_empty() {
            own
        } else {
            let so = self.stream_ordered.as_deref_mut().expect("stream-ordered");
            let unifier = match &so.unifier {
                Some(u) => u.clone(),
                None => so.unifier.insert(be.new_stream(0)?).clone(),
            };
            for s in std::iter::once(&own).chain(uses) {
                let event = be.new_event()?;
                s.record(&event)?;
                unifier.wait(&event)?;
            }
            unifier
        };
        (self.stats.driver.segment_free).time(|| be.raw_free_async(block.ptr, &on))
    }

    /// `empty_cache`: waits for the device, then gives the pool's unused memory back;
    /// returns the bytes given back.
    pub(super) fn trim_stream_ordered(&mut self, be: &dyn MemoryBackend) -> Result<u64> {
        let pool = self.stream_ordered.as_ref().expect("stream-ordered").pool;
        let before = be.pool_attribute(pool, PoolAttribute::ReservedCurrent)?;
        (self.stats.driver.synchronize).time(|| be.synchronize())?;
        self.stats.num_sync_all_streams += 1;
        be.pool_trim_to(pool, 0)?;
        self.refresh_pool_stats(be)?;
        self.sample_timeline();
        Ok(before.saturating_sub(self.stats.reserved.current))
    }

    /// Reads `reserved` from the pool: current and peak are the pool's, and the
    /// running totals follow the change since the last reading.
    pub(super) fn refresh_pool_stats(&mut self, be: &dyn MemoryBackend) -> Result<()> {
        let Some(so) = self.stream_ordered.as_deref() else {
            return Ok(());
        };
        let current = be.pool_attribute(so.pool, PoolAttribute::ReservedCurrent)?;
        let high = be.pool_attribute(so.pool, PoolAttribute::ReservedHigh)?;
        let r = &mut self.stats.reserved.all;
        if current >= r.current {
            r.allocated += current - r.current;
        } else {
            r.freed += r.current - current;
        }
        r.current = current;
        r.peak = high.max(current);
        Ok(())
    }

    /// Resets the pool's high-water marks with the allocator's peaks.
    pub(super) fn reset_pool_peaks(&mut self, be: &dyn MemoryBackend) -> Result<()> {
        let Some(so) = self.stream_ordered.as_deref() else {
            return Ok(());
        };
        be.pool_set_attribute(so.pool, PoolAttribute::ReservedHigh, 0)?;
        be.pool_set_attribute(so.pool, PoolAttribute::UsedHigh, 0)?;
        self.stats.reset_peaks();
        self.refresh_pool_stats(be)
    }

    /// The blocks of the pool allocated now.
    pub(super) fn stream_ordered_live(
        &self,
    ) -> impl Iterator<Item = &super::pool::BlockRecord> + '_ {
        (self.blocks.records())
            .filter(|b| b.segment == STREAM_ORDERED && b.state == BlockState::Allocated)
    }

    /// The self-check of this backend: no segment or cached block, and the statistics
    /// recounted from the live blocks.
    pub(super) fn check_stream_ordered(&self) -> std::result::Result<(), String> {
        if self.segments.iter().any(|s| s.alive) {
            return Err("backend:cudaMallocAsync: a segment exists".into());
        }
        if !self.deferred.is_empty() {
            return Err("backend:cudaMallocAsync: a deferred free exists".into());
        }
        let mut recount = [(0u64, 0u64, 0u64); 2];
        for b in self.stream_ordered_live() {
            let r = &mut recount[b.key.pool as usize];
            r.0 += b.size;
            r.1 += b.requested;
            r.2 += 1;
        }
        for pool in [Pool::Small, Pool::Large] {
            let (allocated, requested, count) = recount[pool as usize];
            let s = &self.stats;
            let kept = (
                s.allocated.pool(pool).current,
                s.requested.pool(pool).current,
                s.allocations.pool(pool).current,
                s.active.pool(pool).current,
                s.active_bytes.pool(pool).current,
            );
            if kept != (allocated, requested, count, count, allocated) {
                return Err(format!(
                    "backend:cudaMallocAsync, {pool:?} pool: allocated, requested, \
                     allocations, active, active bytes are {kept:?}, the live blocks \
                     give {:?}",
                    (allocated, requested, count, count, allocated)
                ));
            }
        }
        Ok(())
    }
}
