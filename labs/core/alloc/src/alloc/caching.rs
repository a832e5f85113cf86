//! The caching policy: blocks carved out of segments, kept after a free and handed out
//! again without a driver call.
//!
//! malloc: a parked block of the exact size if there is one (`parked.rs`); else best
//! fit over the free blocks of the stream and pool (`fit.rs`), or a new segment; split
//! off what the request does not need; on expandable segments, give the block's pages
//! memory (`pages.rs`); hand it out. free: park the block, or wait for other streams'
//! work (`deferred.rs`), or merge it with its free neighbours. Out of memory, the retry
//! ladder (`oom.rs`) frees what can be freed and tries again.
//!
//! Two segment sources. Fixed segments (PyTorch's default, and the labs') are
//! `cuMemAlloc` blocks of 2 MiB, 20 MiB or the request rounded to 2 MiB. Expandable
//! segments (`expandable_segments:True`, and `preset:labs`) are large reserved address
//! ranges whose pages get memory only while some block uses them (see `pages.rs`),
//! while best fit prefers free blocks on mapped memory, so that a training loop's
//! steady state moves no pages and calls no driver.

use super::allocator::Allocation;
use super::category::Category;
use super::config::Config;
use super::deferred::Deferred;
use super::history::History;
use super::mempool::PrivatePool;
use super::pages::PageMap;
use super::parked::Parked;
use super::pool::{
    check_stream_count, place, BlockState, Blocks, FreeSet, PoolKey, Segment, NONE, SERIAL_LIMIT,
};
use super::size::{
    checked_round_size, pool_of, segment_size, Pool, EXPANDABLE_VA, MIN_BLOCK, SMALL_SIZE,
};
use super::stats::Stats;
use super::stream_ordered::StreamOrdered;
use super::timeline::CategoryTimeline;
use crate::backend::{DeviceId, MemoryBackend, Stream};
use crate::error::{Error, Result};
use crate::snapshot::TraceAction;

/// Everything the allocator knows, behind its one lock.
pub(super) struct State {
    pub conf: Config,
    pub device: DeviceId,
    /// The device's memory, and the share of it this allocator may reserve.
    pub total: u64,
    pub limit: u64,
    pub blocks: Blocks,
    pub free: FreeSet,
    /// Freed small blocks kept whole for the next request of their size.
    pub parked: Parked,
    /// Parked large blocks, at most one per stream and pool: (pool key, rounded size,
    /// block).
    pub parked_large: Vec<(PoolKey, u64, u32)>,
    /// Reused buffer for the blocks taken off the parked lists.
    pub unparked: Vec<u32>,
    pub segments: Vec<Segment>,
    pub vacant_segments: Vec<u32>,
    /// Segments made so far: the next one's serial (see `pool::place`).
    pub serials: u64,
    /// The page map of the expandable segments (their pages live in each segment).
    pub pages: PageMap,
    /// Cross-stream frees waiting on events.
    pub deferred: Deferred,
    pub stats: Stats,
    /// Stream handles in order of first use; a stream's index is its pool key.
    pub streams: Vec<u64>,
    /// The streams themselves, by the same index, where the allocator was handed them
    /// (`malloc`; replays name streams by handle only): unmapping idle memory then
    /// waits for its stream alone rather than the whole device.
    pub stream_objects: Vec<Option<Stream>>,
    /// Per stream index ("lane"): the private pool it allocates to, 0 for the default
    /// pool (`mempool.rs`).
    pub lane_pools: Vec<u64>,
    /// The private pools, by id - 1 (`mempool.rs`).
    pub pools: Vec<PrivatePool>,
    /// The scopes allocating to a private pool now, as (whose requests, pool id),
    /// innermost last (`mempool.rs`).
    pub routes: Vec<(super::mempool::RouteFrom, u64)>,
    /// Released pools that still hold segments: their frees give segments back.
    pub draining: u32,
    /// Cross-stream frees made while a graph was captured: their events are recorded
    /// when the capture ends (`mempool.rs`).
    pub after_capture: Vec<u32>,
    /// The memory history, while recorded (`record_memory_history`).
    pub history: Option<Box<History>>,
    /// `backend:cudaMallocAsync`: the driver's pool that serves every request instead
    /// of the cache (`stream_ordered.rs`).
    pub stream_ordered: Option<Box<StreamOrdered>>,
    /// Bytes per category after each event, while recorded
    /// ([`Allocator::record_category_timeline`](super::Allocator::record_category_timeline)).
    pub timeline: Option<Box<CategoryTimeline>>,
}

impl State {
    pub fn new(conf: Config, device: DeviceId, total: u64, page: u64) -> State {
        let limit = (total as f64 * conf.per_process_memory_fraction) as u64;
        let max_mapping = conf.max_mapping;
        State {
            conf,
            device,
            total,
            limit,
            blocks: Blocks::default(),
            free: FreeSet::default(),
            parked: Parked::default(),
            parked_large: Vec::new(),
            unparked: Vec::new(),
            segments: Vec::new(),
            vacant_segments: Vec::new(),
            serials: 0,
            pages: PageMap::new(page, max_mapping),
            deferred: Deferred::default(),
            stats: Stats::default(),
            streams: Vec::new(),
            stream_objects: Vec::new(),
            lane_pools: Vec::new(),
            pools: Vec::new(),
            after_capture: Vec::new(),
            routes: Vec::new(),
            draining: 0,
            history: None,
            stream_ordered: None,
            timeline: None,
        }
    }

    /// The pool key of a request on `stream` (the stream's handle) from `pool`.
    #[inline]
    pub(super) fn key_of(
        &mut self,
        stream: u64,
        object: Option<&Stream>,
        pool: Pool,
    ) -> Result<PoolKey> {
        let index = match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i,
            None => {
                // The stream's index is a 15-bit field of the free-set key (`pool.rs`).
                check_stream_count(self.streams.len())?;
                self.streams.push(stream);
                self.stream_objects.push(None);
                self.lane_pools.push(0);
                self.streams.len() - 1
            }
        };
        if let Some(object) = object {
            if self.stream_objects[index].is_none() {
                self.stream_objects[index] = Some(object.clone());
            }
        }
        Ok(PoolKey {
            stream: index as u32,
            pool,
        })
    }

    /// The handle of the stream of a pool key.
    #[inline]
    pub fn stream_of(&self, key: PoolKey) -> u64 {
        self.streams[key.stream as usize]
    }

    /// Gives block `a` another category, moving its bytes between the statistics.
    pub fn recategorise(&mut self, a: &Allocation, category: Category) -> Result<()> {
        self.check_handle(a)?;
        let b = &mut self.blocks[a.id];
        let old = std::mem::replace(&mut b.category, category);
        let addr = b.addr;
        if old != category {
            if let Some(h) = self.history.as_deref_mut() {
                h.categorise(addr, category);
            }
            self.stats.by_category[old.index()].sub(a.size);
            self.stats.by_category[category.index()].add(a.size);
            // Still at the peak (nothing allocated since): the peak's split is now's.
            if self.stats.allocated.all.current == self.stats.allocated.all.peak {
                self.stats.note_category_peak();
            }
            self.sample_timeline();
        }
        Ok(())
    }

    /// The category block `a` is counted under.
    pub fn category_of(&self, a: &Allocation) -> Result<Category> {
        self.check_handle(a)?;
        Ok(self.blocks[a.id].category)
    }

    /// A block of at least `size` bytes on `stream`, counted under `category`.
    pub fn malloc(
        &mut self,
        be: &dyn MemoryBackend,
        size: u64,
        stream: u64,
        object: Option<&Stream>,
        category: Category,
    ) -> Result<Allocation> {
        if self.stream_ordered.is_some() {
            return self.malloc_stream_ordered(be, size, stream, object, category);
        }
        // No event is queried while a graph is captured (CUDA forbids querying one
        // recorded in the capture): the frees it holds back wait for the capture's end.
        if !self.deferred.is_empty() && !self.capture_underway() {
            self.process_events(false)?;
        }
        // Sizes come from outside (programs, traces): one that cannot fit is an OOM
        // here, before any work or host memory in proportion to it (`size.rs`).
        let divisions = self.conf.roundup_power2_divisions.for_size(size);
        let Some(rounded) = checked_round_size(size, divisions, self.limit) else {
            self.stats.num_ooms += 1;
            self.note(TraceAction::Oom, 0, size, stream);
            return Err(self.out_of_memory_report(be, size));
        };
        let pool = pool_of(rounded);
        let mut key = self.key_of(stream, object, pool)?;
        if !self.routes.is_empty() {
            key = self.route(key, object)?;
        }
        // ANCHOR: parked_hit
        let parked = match pool {
            Pool::Small => self.parked.take(&self.blocks, key, rounded),
            Pool::Large => self.take_parked_large(key, rounded),
        };
        if let Some(id) = parked {
            self.stats.num_parked_hits += 1;
            return Ok(self.hand_out(id, size, stream, category));
        }
        // Every other request sees the free memory as if nothing were parked.
        self.unpark_all();
        // ANCHOR_END: parked_hit
        self.malloc_with_retries(be, key, stream, rounded, size, category)
    }

    /// One attempt at a request: best fit, else (with `grow`) a new segment; split; map
    /// its pages. Without `grow`, only a free block of `key` serves it (an
    /// out-of-memory error without one that fits).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn try_malloc(
        &mut self,
        be: &dyn MemoryBackend,
        key: PoolKey,
        stream: u64,
        rounded: u64,
        requested: u64,
        category: Category,
        grow: bool,
    ) -> Result<Allocation> {
        let id = match self.find_free(key, rounded) {
            Some((id, 0)) => {
                self.unlist_free(key, id);
                id
            }
            Some((id, offset)) => {
                self.unlist_free(key, id);
                self.split_off_head(key, id, offset)
            }
            None if grow => self.new_segment(be, key, stream, rounded)?,
            None => return Err(self.out_of_memory(requested)),
        };
        let seg_index = self.blocks[id].segment;
        let expandable = self.segments[seg_index as usize].expandable;
        let remaining = self.blocks[id].size - rounded;
        // ANCHOR: split
        if self.should_split(expandable, key.pool, rounded, remaining) {
            let b = &self.blocks[id];
            let (addr, next) = (b.addr + rounded, b.next);
            let rest = self
                .blocks
                .insert(addr, remaining, key, seg_index, id, next);
            if next != NONE {
                self.blocks[next].prev = rest;
            }
            let b = &mut self.blocks[id];
            b.size = rounded;
            b.next = rest;
            self.list_free(key, rest);
        }
        // ANCHOR_END: split
        if expandable {
            self.blocks[id].state = BlockState::Allocated;
            if let Err(e) = self.occupy(be, id) {
                self.blocks[id].state = BlockState::Free;
                self.release_block(id);
                return Err(e);
            }
        }
        Ok(self.hand_out(id, requested, stream, category))
    }

    /// Marks block `id` allocated for a request of `requested` bytes and counts it.
    #[inline]
    pub(super) fn hand_out(
        &mut self,
        id: u32,
        requested: u64,
        stream: u64,
        category: Category,
    ) -> Allocation {
        let b = &mut self.blocks[id];
        b.state = BlockState::Allocated;
        b.requested = requested;
        b.category = category;
        let (ptr, size, generation, pool) = (b.addr, b.size, b.generation, b.key.pool);
        let s = &mut self.stats;
        let peak_before = s.allocated.all.peak;
        s.requested.add(pool, requested);
        s.allocated.add(pool, size);
        s.allocations.add(pool, 1);
        s.active.add(pool, 1);
        s.active_bytes.add(pool, size);
        s.by_category[category.index()].add(size);
        if s.allocated.all.peak > peak_before {
            s.note_category_peak();
        }
        // The running count of allocations numbers this one, for the leak guard.
        self.blocks[id].serial = s.allocations.all.allocated;
        self.note(TraceAction::Alloc, ptr, requested, stream);
        if let Some(h) = self.history.as_deref_mut() {
            h.categorise(ptr, category);
        }
        self.sample_timeline();
        Allocation {
            id,
            generation,
            ptr,
            size,
            requested,
            stream,
        }
    }

    /// Splits the first `offset` bytes off free block `id` (already out of the free
    /// set) as a free block of their own, listed; returns the block that follows.
    fn split_off_head(&mut self, key: PoolKey, id: u32, offset: u64) -> u32 {
        let b = &self.blocks[id];
        let (addr, size, next, seg) = (b.addr, b.size, b.next, b.segment);
        let rest = self
            .blocks
            .insert(addr + offset, size - offset, key, seg, id, next);
        if next != NONE {
            self.blocks[next].prev = rest;
        }
        let b = &mut self.blocks[id];
        b.size = offset;
        b.next = rest;
        self.list_free(key, id);
        rest
    }

    /// Whether `remaining` bytes left over from a block are worth a free block of their
    /// own (else they stay attached to the block handed out).
    #[inline]
    pub(super) fn should_split(
        &self,
        expandable: bool,
        pool: Pool,
        rounded: u64,
        remaining: u64,
    ) -> bool {
        if expandable || pool == Pool::Small {
            remaining >= MIN_BLOCK
        } else {
            remaining > SMALL_SIZE && self.conf.max_split_size.is_none_or(|m| rounded < m)
        }
    }

    /// A new segment for the stream and pool; returns its one (free, unlisted) block.
    fn new_segment(
        &mut self,
        be: &dyn MemoryBackend,
        key: PoolKey,
        stream: u64,
        rounded: u64,
    ) -> Result<u32> {
        let expandable = self.conf.expandable_segments;
        let page = self.pages.page;
        let (base, size, pages) = if expandable {
            // Address space only: pages get memory as blocks use them. PyTorch reserves
            // 1 1/8 of the device's memory, so that a stream's pool grows in one segment
            // for good; the labs' recycling moves pages within smaller ones.
            let va = if self.conf.recycle_idle_pages {
                EXPANDABLE_VA
            } else {
                (self.total + self.total / 8).div_ceil(page) * page
            };
            let size = va.max(rounded.div_ceil(page) * page);
            let base = (self.stats.driver.segment_alloc).time(|| be.vm_reserve(size as usize))?;
            (base, size, vec![Default::default(); (size / page) as usize])
        } else {
            let size = segment_size(rounded);
            if let Some(t) = self.conf.garbage_collection_threshold {
                if (self.stats.reserved.current + size) as f64 > t * self.limit as f64 {
                    self.release_cached(be)?;
                }
            }
            if self.stats.reserved.current + size > self.limit {
                return Err(self.out_of_memory(rounded));
            }
            let base = (self.stats.driver.segment_alloc).time(|| be.raw_alloc(size as usize))?;
            self.note(TraceAction::SegmentAlloc, base, size, stream);
            self.stats.device_allocs += 1;
            self.stats.reserved.add(key.pool, size);
            (base, size, Vec::new())
        };
        self.stats.segments.add(key.pool, 1);
        if !self.pools.is_empty() {
            self.count_segment(key);
        }
        let seg = Segment {
            key,
            base,
            size,
            stream,
            expandable,
            alive: true,
            first: NONE,
            pages,
            mapped_pages: 0,
            mapped_end: 0,
            serial: self.next_serial(),
        };
        let index = match self.vacant_segments.pop() {
            Some(i) => {
                self.segments[i as usize] = seg;
                i
            }
            None => {
                self.segments.push(seg);
                (self.segments.len() - 1) as u32
            }
        };
        let id = self.blocks.insert(base, size, key, index, NONE, NONE);
        self.segments[index as usize].first = id;
        Ok(id)
    }

    /// Block `id`'s place in the free set's order (`pool::place`).
    #[inline]
    pub(super) fn place_of(&self, id: u32) -> u64 {
        let b = &self.blocks[id];
        let seg = &self.segments[b.segment as usize];
        place(seg.serial, b.addr - seg.base)
    }

    /// The serial number of a new segment: one past the last, after renumbering the
    /// live segments (their order kept) when the numbers run out.
    fn next_serial(&mut self) -> u64 {
        if self.serials >= SERIAL_LIMIT {
            self.renumber_segments();
        }
        self.serials += 1;
        self.serials - 1
    }

    /// Numbers the live segments 0, 1, ... in their order, and lists every free block
    /// again at its new place.
    pub(super) fn renumber_segments(&mut self) {
        let mut live: Vec<usize> = (0..self.segments.len())
            .filter(|&s| self.segments[s].alive)
            .collect();
        live.sort_by_key(|&s| self.segments[s].serial);
        for (n, &s) in live.iter().enumerate() {
            self.segments[s].serial = n as u64;
        }
        self.serials = live.len() as u64;
        for (pool, size, id) in self.free.drain() {
            let place = self.place_of(id);
            self.free.restore(pool, size, place, id);
        }
    }

    /// Checks that `block` is a live allocation of this allocator.
    pub fn check_handle(&self, block: &Allocation) -> Result<()> {
        match self.blocks.get(block.id) {
            Some(b)
                if b.generation == block.generation
                    && b.state == BlockState::Allocated
                    && b.addr == block.ptr =>
            {
                Ok(())
            }
            _ => Err(Error::InvalidArgument(format!(
                "block at {:#x} is not allocated by this allocator (double free?)",
                block.ptr
            ))),
        }
    }

    pub fn free(&mut self, be: &dyn MemoryBackend, block: Allocation) -> Result<()> {
        if self.stream_ordered.is_some() {
            return self.free_stream_ordered(be, block);
        }
        if self.draining != 0 {
            return self.free_draining(be, block);
        }
        self.free_cached(be, block)
    }

    /// A free that keeps the block's memory in the cache.
    pub(super) fn free_cached(&mut self, be: &dyn MemoryBackend, block: Allocation) -> Result<()> {
        let freed = self.free_block(be, block);
        self.sample_timeline();
        freed?;
        if self.pages.page > 0 {
            self.count_free(be)?;
        }
        Ok(())
    }

    // ANCHOR: free
    fn free_block(&mut self, be: &dyn MemoryBackend, block: Allocation) -> Result<()> {
        self.check_handle(&block)?;
        let id = block.id;
        if self.history.is_some() {
            let b = &self.blocks[id];
            let (addr, requested, now) = (b.addr, b.requested, b.stream_uses.is_empty());
            self.note(TraceAction::FreeRequested, addr, requested, block.stream);
            if now {
                self.note(TraceAction::FreeCompleted, addr, requested, block.stream);
            }
        }
        let b = &self.blocks[id];
        let pool = b.key.pool;
        let s = &mut self.stats;
        s.requested.sub(pool, b.requested);
        s.allocated.sub(pool, b.size);
        s.allocations.sub(pool, 1);
        s.by_category[b.category.index()].sub(b.size);
        if !b.stream_uses.is_empty() {
            // Other streams' work may still use it (`deferred.rs`); while a graph is
            // captured, no event is recorded or queried: it waits for the capture's end
            // (`mempool.rs`), as PyTorch's allocator defers it.
            if self.capture_underway() {
                self.blocks[id].state = BlockState::Pending;
                self.after_capture.push(id);
                return Ok(());
            }
            return self.defer_free(be, id);
        }
        s.active.sub(pool, 1);
        s.active_bytes.sub(pool, b.size);
        if !self.park(id) {
            self.blocks[id].state = BlockState::Free;
            self.release_block(id);
        }
        Ok(())
    }
    // ANCHOR_END: free

    /// Puts a block whose state is already `Free` back: its pages lose a user, and it
    /// merges with free neighbours.
    pub(super) fn release_block(&mut self, mut id: u32) {
        let seg = &self.segments[self.blocks[id].segment as usize];
        let key = seg.key;
        if seg.expandable {
            self.vacate(id);
        }
        // ANCHOR: merge
        let prev = self.blocks[id].prev;
        if prev != NONE && self.blocks[prev].state == BlockState::Free {
            self.unlist_free(key, prev);
            self.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks[id].next;
        if next != NONE && self.blocks[next].state == BlockState::Free {
            self.unlist_free(key, next);
            self.absorb_next(id);
        }
        self.list_free(key, id);
        // ANCHOR_END: merge
    }

    /// Adds a free block to the free set. Every free block enters and leaves the set
    /// through here and [`unlist_free`](Self::unlist_free), and a listed block's
    /// neighbours come and go only by leaving the set first, so these two keep the
    /// `inactive_split` statistics without a walk. Free blocks of expandable segments
    /// are left out, as PyTorch leaves them out: `empty_cache` unmaps their idle pages,
    /// so they are not the memory that statistic warns about.
    #[inline]
    fn list_free(&mut self, key: PoolKey, id: u32) {
        let place = self.place_of(id);
        let b = &self.blocks[id];
        self.free.insert(key, b.size, place, id);
        if !self.conf.expandable_segments && (b.prev != NONE || b.next != NONE) {
            self.stats.inactive_split.add(key.pool, 1);
            self.stats.inactive_split_bytes.add(key.pool, b.size);
        }
    }

    #[inline]
    pub(super) fn unlist_free(&mut self, key: PoolKey, id: u32) {
        let place = self.place_of(id);
        let b = &self.blocks[id];
        self.free.remove(key, b.size, place, id);
        if !self.conf.expandable_segments && (b.prev != NONE || b.next != NONE) {
            self.stats.inactive_split.sub(key.pool, 1);
            self.stats.inactive_split_bytes.sub(key.pool, b.size);
        }
    }

    /// Merges the block after `id` into `id`.
    fn absorb_next(&mut self, id: u32) {
        let next = self.blocks[id].next;
        let (size, after) = (self.blocks[next].size, self.blocks[next].next);
        self.blocks[id].size += size;
        self.blocks[id].next = after;
        if after != NONE {
            self.blocks[after].prev = id;
        }
        self.blocks.remove(next);
    }

    /// Samples the bytes per category, when the timeline is being recorded.
    #[inline(always)]
    pub(super) fn sample_timeline(&mut self) {
        if let Some(t) = self.timeline.as_deref_mut() {
            t.push(&self.stats);
        }
    }

    /// Records an event in the memory history, when one is being recorded.
    #[inline(always)]
    pub(super) fn note(&mut self, action: TraceAction, addr: u64, size: u64, stream: u64) {
        if let Some(h) = self.history.as_deref_mut() {
            h.record(action, addr, size, stream);
        }
    }
}
