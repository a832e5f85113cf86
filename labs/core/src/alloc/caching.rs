//! The caching allocator: blocks carved out of segments, kept after a free and handed
//! out again without a driver call.
//!
//! Two segment sources. Fixed segments (PyTorch's native mode) are `cuMemAlloc`
//! blocks of 2 MiB, 20 MiB or the request rounded to 2 MiB. Expandable segments (the
//! default) are large reserved address ranges whose pages get memory only while some
//! block uses them; a page that no block uses is "idle" and, before any new memory is
//! taken from the driver, an idle page is unmapped and its memory mapped where it is
//! needed. Reserved memory then only grows when every page held is in use, which is
//! what keeps peak reserved close to peak allocated on real traces.

use std::sync::Arc;

use super::lock::{Guard, Lock};

use super::config::Config;
use super::pool::{stream_pool, BlockState, Blocks, FreeSet, NONE};
use super::size::{
    pool_of, round_size, segment_size, Pool, EXPANDABLE_VA, LARGE_BUFFER, MIN_BLOCK, SMALL_SIZE,
};
use super::stats::Stats;
use crate::device::{Backend, DeviceId, DevicePtr, Event, Stream};
use crate::error::{Error, Result};

/// A block handed out by the allocator. It is a plain handle: give it back with
/// [`Allocator::free`] (tensors do this when dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    id: u32,
    generation: u32,
    ptr: DevicePtr,
    size: u64,
    requested: u64,
    stream: u64,
}

impl Block {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The block's size after rounding.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// The size the program asked for.
    pub fn requested(&self) -> u64 {
        self.requested
    }
    /// The stream the block was allocated on.
    pub fn stream(&self) -> u64 {
        self.stream
    }
}

/// One segment as [`Allocator::snapshot`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base: DevicePtr,
    pub size: u64,
    pub stream: u64,
    pub pool: Pool,
    pub expandable: bool,
    /// Bytes with memory behind them (all of a fixed segment).
    pub mapped: u64,
    pub blocks: Vec<BlockInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    pub addr: DevicePtr,
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
}

#[derive(Clone, Copy, Default)]
struct Page {
    /// Blocks that are not free (allocated or pending) overlapping the page.
    users: u32,
    mapped: bool,
    /// Listed in the idle queue (at most once).
    queued: bool,
    /// When the page last became idle. An entry whose stamp is older belongs to an
    /// earlier idle spell and is moved to the back when met.
    idle_since: u64,
}

struct Segment {
    /// The free-set prefix of the segment's stream and pool.
    sp: u64,
    base: DevicePtr,
    size: u64,
    stream: u64,
    pool: Pool,
    expandable: bool,
    alive: bool,
    first: u32,
    pages: Vec<Page>,
    mapped_pages: u64,
}

pub struct Allocator {
    backend: Arc<dyn Backend>,
    device: DeviceId,
    state: Lock<State>,
}

struct State {
    conf: Config,
    total: u64,
    limit: u64,
    page: u64,
    blocks: Blocks,
    free: FreeSet,
    segments: Vec<Segment>,
    vacant_segments: Vec<u32>,
    /// Pages that became idle, oldest first: (segment, page, stamp). The page idle the
    /// longest is the one taken, as the least likely to be wanted back soon where it is
    /// (taking the newest makes blocks land on just-unmapped pages again and again).
    idle: std::collections::VecDeque<(u32, u32, u64)>,
    idle_stamp: u64,
    /// Events of cross-stream frees, with the block each one holds back.
    pending: Vec<(Event, u32)>,
    stats: Stats,
    /// Stream handles in order of first use; a stream's index is its key in the free set.
    streams: Vec<u64>,
}

impl Allocator {
    pub fn new(backend: Arc<dyn Backend>, conf: Config) -> Result<Allocator> {
        let total = backend.mem_info()?.total;
        let page = if conf.expandable_segments {
            backend.vm_granularity()? as u64
        } else {
            0
        };
        let limit = (total as f64 * conf.per_process_memory_fraction) as u64;
        Ok(Allocator {
            device: backend.id(),
            backend,
            state: Lock::new(State {
                conf,
                total,
                limit,
                page,
                blocks: Blocks::default(),
                free: FreeSet::default(),
                segments: Vec::new(),
                vacant_segments: Vec::new(),
                idle: Default::default(),
                idle_stamp: 0,
                pending: Vec::new(),
                stats: Stats::default(),
                streams: Vec::new(),
            }),
        })
    }

    pub fn device(&self) -> DeviceId {
        self.device
    }

    pub fn config(&self) -> Config {
        self.lock().conf.clone()
    }

    #[inline]
    fn lock(&self) -> Guard<'_, State> {
        self.state.lock()
    }

    /// A block of at least `size` bytes for work on `stream`.
    pub fn malloc(&self, size: usize, stream: &Stream) -> Result<Block> {
        self.malloc_on(size as u64, stream.handle())
    }

    /// As [`malloc`](Self::malloc), naming the stream by its handle (trace replay uses
    /// the trace's stream ids).
    pub fn malloc_on(&self, size: u64, stream: u64) -> Result<Block> {
        let mut st = self.lock();
        st.malloc(&*self.backend, self.device, size, stream)
    }

    /// Gives a block back to the cache. When other streams used it
    /// ([`record_stream`](Self::record_stream)), it is reused only after their work so
    /// far has completed.
    pub fn free(&self, block: Block) -> Result<()> {
        let mut st = self.lock();
        st.free(&*self.backend, block)
    }

    // ANCHOR: record_stream
    /// Marks `block` as used by work on `stream`, so that freeing it waits for that work.
    pub fn record_stream(&self, block: &Block, stream: &Stream) -> Result<()> {
        let mut st = self.lock();
        st.check_handle(block)?;
        if stream.handle() == block.stream {
            return Ok(());
        }
        let uses = &mut st.blocks[block.id].stream_uses;
        if !uses.iter().any(|s| s.handle() == stream.handle()) {
            uses.push(stream.clone());
        }
        Ok(())
    }
    // ANCHOR_END: record_stream

    /// Returns every byte of cached memory no block uses to the driver (after waiting
    /// for pending cross-stream frees); returns how many bytes that was.
    pub fn empty_cache(&self) -> Result<u64> {
        let mut st = self.lock();
        st.process_events(&*self.backend, true)?;
        st.release_cached(&*self.backend)
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    pub fn reset_peak_stats(&self) {
        self.lock().stats.reset_peaks();
    }

    /// Caps this process's reservations at `fraction` of the device's memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {fraction} must be in (0, 1]"
            )));
        }
        let mut st = self.lock();
        st.conf.per_process_memory_fraction = fraction;
        st.limit = (st.total as f64 * fraction) as u64;
        Ok(())
    }

    /// The segments and their blocks, in address order.
    pub fn snapshot(&self) -> Vec<SegmentInfo> {
        let st = self.lock();
        let mut out: Vec<SegmentInfo> = st
            .segments
            .iter()
            .filter(|s| s.alive)
            .map(|s| {
                let mut blocks = Vec::new();
                let mut id = s.first;
                while id != NONE {
                    let b = &st.blocks[id];
                    blocks.push(BlockInfo {
                        addr: b.addr,
                        size: b.size,
                        requested: b.requested,
                        state: b.state,
                    });
                    id = b.next;
                }
                SegmentInfo {
                    base: s.base,
                    size: s.size,
                    stream: s.stream,
                    pool: s.pool,
                    expandable: s.expandable,
                    mapped: if s.expandable {
                        s.mapped_pages * st.page
                    } else {
                        s.size
                    },
                    blocks,
                }
            })
            .collect();
        out.sort_by_key(|s| s.base);
        out
    }

    /// Checks every structural invariant and that the statistics match a recount; a
    /// description of the first violation otherwise. For tests.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.lock().check_invariants()
    }
}

impl Drop for Allocator {
    /// Returns the cache to the driver. Blocks still allocated keep their memory: a
    /// tensor may outlive a private allocator only by a bug, and freeing memory under it
    /// would turn that bug into corruption.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        let result = st
            .process_events(&*self.backend, true)
            .and_then(|_| st.release_cached(&*self.backend));
        if let Err(e) = result {
            eprintln!("warning: releasing the cache of {}: {e}", self.device);
        }
    }
}

fn oom(device: DeviceId, requested: u64, st: &State) -> Error {
    Error::OutOfMemory {
        device,
        requested,
        free: st.limit.saturating_sub(st.stats.reserved.current),
        total: st.limit,
    }
}

impl State {
    // ANCHOR: malloc_retry
    fn malloc(
        &mut self,
        be: &dyn Backend,
        device: DeviceId,
        size: u64,
        stream: u64,
    ) -> Result<Block> {
        if !self.pending.is_empty() {
            self.process_events(be, false)?;
        }
        let rounded = round_size(size, self.conf.roundup_power2_divisions);
        let pool = pool_of(rounded);
        let index = match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i,
            None => {
                self.streams.push(stream);
                self.streams.len() - 1
            }
        };
        let sp = stream_pool(index as u64, pool);
        let mut stage = 0;
        loop {
            match self.try_malloc(be, device, sp, stream, pool, rounded, size) {
                Ok(b) => return Ok(b),
                Err(e) if e.is_out_of_memory() => {
                    // A block freed on another stream may be exactly what is needed: wait
                    // for its events rather than fail (PyTorch can raise here).
                    if stage == 0 && !self.pending.is_empty() {
                        self.process_events(be, true)?;
                        stage = 1;
                        continue;
                    }
                    if stage <= 1 {
                        self.stats.num_alloc_retries += 1;
                        self.process_events(be, true)?;
                        self.release_cached(be)?;
                        stage = 2;
                        continue;
                    }
                    self.stats.num_ooms += 1;
                    return Err(oom(device, size, self));
                }
                Err(e) => return Err(e),
            }
        }
    }
    // ANCHOR_END: malloc_retry

    #[allow(clippy::too_many_arguments)]
    fn try_malloc(
        &mut self,
        be: &dyn Backend,
        device: DeviceId,
        sp: u64,
        stream: u64,
        pool: Pool,
        rounded: u64,
        requested: u64,
    ) -> Result<Block> {
        let id = match self.find_free(sp, rounded) {
            Some((size, id)) => {
                self.free.remove(sp, size, self.blocks[id].addr, id);
                id
            }
            None => self.new_segment(be, device, sp, stream, pool, rounded)?,
        };
        let seg_index = self.blocks[id].segment;
        let expandable = self.segments[seg_index as usize].expandable;
        let remaining = self.blocks[id].size - rounded;
        // ANCHOR: split
        if self.should_split(expandable, pool, rounded, remaining) {
            let b = &self.blocks[id];
            let (addr, next) = (b.addr + rounded, b.next);
            let rest = self.blocks.insert(addr, remaining, seg_index, id, next);
            if next != NONE {
                self.blocks[next].prev = rest;
            }
            let b = &mut self.blocks[id];
            b.size = rounded;
            b.next = rest;
            self.free.insert(sp, remaining, addr, rest);
        }
        // ANCHOR_END: split
        let b = &mut self.blocks[id];
        b.state = BlockState::Allocated;
        b.requested = requested;
        let (ptr, size) = (b.addr, b.size);
        if expandable {
            if let Err(e) = self.occupy(be, id) {
                self.blocks[id].state = BlockState::Free;
                self.release_block(id);
                return Err(e);
            }
        }
        self.stats.requested.add(requested);
        self.stats.allocated.add(size);
        self.stats.allocations.add(1);
        Ok(Block {
            id,
            generation: self.blocks[id].generation,
            ptr,
            size,
            requested,
            stream,
        })
    }

    // ANCHOR: find_free
    #[inline]
    fn find_free(&self, sp: u64, rounded: u64) -> Option<(u64, u32)> {
        let key = self.free.best_fit(sp, rounded)?;
        if let (false, Some(max_split)) = (self.conf.expandable_segments, self.conf.max_split_size)
        {
            // Oversize blocks serve only oversize requests, and only close fits; the
            // set is ordered by size, so the first candidate decides.
            if rounded < max_split && key.0 >= max_split {
                return None;
            }
            if rounded >= max_split && key.0 >= rounded + LARGE_BUFFER {
                return None;
            }
        }
        Some(key)
    }
    // ANCHOR_END: find_free

    #[inline]
    fn should_split(&self, expandable: bool, pool: Pool, rounded: u64, remaining: u64) -> bool {
        if expandable || pool == Pool::Small {
            remaining >= MIN_BLOCK
        } else {
            remaining > SMALL_SIZE && self.conf.max_split_size.is_none_or(|m| rounded < m)
        }
    }

    /// A new segment for the stream and pool; returns its one (free, unlisted) block.
    fn new_segment(
        &mut self,
        be: &dyn Backend,
        device: DeviceId,
        sp: u64,
        stream: u64,
        pool: Pool,
        rounded: u64,
    ) -> Result<u32> {
        let expandable = self.conf.expandable_segments;
        let (base, size, pages) = if expandable {
            let size = EXPANDABLE_VA.max(rounded.div_ceil(self.page) * self.page);
            let base = be.vm_reserve(size as usize)?;
            (
                base,
                size,
                vec![Page::default(); (size / self.page) as usize],
            )
        } else {
            let size = segment_size(rounded);
            if let Some(t) = self.conf.garbage_collection_threshold {
                if (self.stats.reserved.current + size) as f64 > t * self.limit as f64 {
                    self.release_cached(be)?;
                }
            }
            if self.stats.reserved.current + size > self.limit {
                return Err(oom(device, rounded, self));
            }
            let base = be.raw_alloc(size as usize)?;
            self.stats.device_allocs += 1;
            self.stats.reserved.add(size);
            (base, size, Vec::new())
        };
        self.stats.segments.add(1);
        let seg = Segment {
            sp,
            base,
            size,
            stream,
            pool,
            expandable,
            alive: true,
            first: NONE,
            pages,
            mapped_pages: 0,
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
        let id = self.blocks.insert(base, size, index, NONE, NONE);
        self.segments[index as usize].first = id;
        Ok(id)
    }

    fn page_span(&self, id: u32) -> (u32, std::ops::Range<usize>) {
        let b = &self.blocks[id];
        let seg = &self.segments[b.segment as usize];
        let first = ((b.addr - seg.base) / self.page) as usize;
        let last = ((b.addr + b.size - 1 - seg.base) / self.page) as usize;
        (b.segment, first..last + 1)
    }

    /// Counts the block as a user of its pages and maps the ones without memory.
    fn occupy(&mut self, be: &dyn Backend, id: u32) -> Result<()> {
        let (s, span) = self.page_span(id);
        let mut unmapped = 0;
        for p in span.clone() {
            let page = &mut self.segments[s as usize].pages[p];
            page.users += 1;
            unmapped += usize::from(!page.mapped);
        }
        if unmapped > 0 {
            let mut synced = false;
            for p in span {
                if !self.segments[s as usize].pages[p].mapped {
                    self.map_page(be, s, p, &mut synced)?;
                }
            }
        }
        Ok(())
    }

    /// Maps one page; `synced` says whether the device was already synchronised during
    /// this allocation (once is enough before unmapping any number of idle pages).
    fn map_page(&mut self, be: &dyn Backend, s: u32, p: usize, synced: &mut bool) -> Result<()> {
        // Move an idle page's memory here rather than take more from the driver.
        while let Some((is, ip, stamp)) = self.idle.pop_front() {
            let Some(page) = self
                .segments
                .get_mut(is as usize)
                .filter(|g| g.alive)
                .and_then(|g| g.pages.get_mut(ip as usize))
            else {
                continue;
            };
            if !(page.mapped && page.users == 0) {
                page.queued = false;
                continue;
            }
            if page.idle_since != stamp {
                self.idle.push_back((is, ip, page.idle_since));
                continue;
            }
            page.queued = false;
            {
                if !*synced {
                    // Freed blocks may still be in use by work queued on their stream.
                    be.synchronize()?;
                    *synced = true;
                }
                self.unmap_page(be, is, ip as usize)?;
                break;
            }
        }
        let page = self.page;
        if self.stats.reserved.current + page > self.limit {
            return Err(Error::OutOfMemory {
                device: be.id(),
                requested: page,
                free: self.limit.saturating_sub(self.stats.reserved.current),
                total: self.limit,
            });
        }
        let seg = &mut self.segments[s as usize];
        be.vm_map(seg.base + p as u64 * page, page as usize)?;
        seg.pages[p].mapped = true;
        seg.mapped_pages += 1;
        self.stats.device_allocs += 1;
        self.stats.reserved.add(page);
        Ok(())
    }

    fn unmap_page(&mut self, be: &dyn Backend, s: u32, p: usize) -> Result<()> {
        let seg = &mut self.segments[s as usize];
        be.vm_unmap(seg.base + p as u64 * self.page, self.page as usize)?;
        seg.pages[p].mapped = false;
        seg.mapped_pages -= 1;
        self.stats.device_frees += 1;
        self.stats.reserved.sub(self.page);
        Ok(())
    }

    fn check_handle(&self, block: &Block) -> Result<()> {
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

    // ANCHOR: free
    fn free(&mut self, be: &dyn Backend, block: Block) -> Result<()> {
        self.check_handle(&block)?;
        let id = block.id;
        let b = &mut self.blocks[id];
        self.stats.requested.sub(b.requested);
        self.stats.allocated.sub(b.size);
        self.stats.allocations.sub(1);
        if b.stream_uses.is_empty() {
            b.state = BlockState::Free;
            self.release_block(id);
            return Ok(());
        }
        b.state = BlockState::Pending;
        let uses = std::mem::take(&mut b.stream_uses);
        for s in &uses {
            let event = be.new_event()?;
            s.record(&event)?;
            self.pending.push((event, id));
            self.blocks[id].pending_events += 1;
        }
        self.stats.num_deferred_frees += 1;
        Ok(())
    }
    // ANCHOR_END: free

    /// Frees blocks whose events have completed; with `wait`, waits for all of them.
    fn process_events(&mut self, be: &dyn Backend, wait: bool) -> Result<()> {
        let _ = be;
        let mut i = 0;
        while i < self.pending.len() {
            let done = if wait {
                self.pending[i].0.synchronize()?;
                true
            } else {
                self.pending[i].0.query()?
            };
            if done {
                let (_, id) = self.pending.swap_remove(i);
                let b = &mut self.blocks[id];
                b.pending_events -= 1;
                if b.pending_events == 0 {
                    b.state = BlockState::Free;
                    self.release_block(id);
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Puts a block whose state is already `Free` back: its pages lose a user, and it
    /// merges with free neighbours.
    fn release_block(&mut self, mut id: u32) {
        let seg_index = self.blocks[id].segment;
        let seg = &self.segments[seg_index as usize];
        let sp = seg.sp;
        if seg.expandable {
            let (s, span) = self.page_span(id);
            let seg = &mut self.segments[s as usize];
            for p in span {
                let page = &mut seg.pages[p];
                page.users -= 1;
                if page.users == 0 && page.mapped {
                    self.idle_stamp += 1;
                    page.idle_since = self.idle_stamp;
                    if !page.queued {
                        page.queued = true;
                        self.idle.push_back((s, p as u32, self.idle_stamp));
                    }
                }
            }
        }
        // ANCHOR: merge
        let prev = self.blocks[id].prev;
        if prev != NONE && self.blocks[prev].state == BlockState::Free {
            let p = &self.blocks[prev];
            self.free.remove(sp, p.size, p.addr, prev);
            self.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks[id].next;
        if next != NONE && self.blocks[next].state == BlockState::Free {
            let n = &self.blocks[next];
            self.free.remove(sp, n.size, n.addr, next);
            self.absorb_next(id);
        }
        let b = &self.blocks[id];
        self.free.insert(sp, b.size, b.addr, id);
        // ANCHOR_END: merge
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

    /// Gives back whole free segments and idle pages; returns the bytes released.
    fn release_cached(&mut self, be: &dyn Backend) -> Result<u64> {
        let before = self.stats.reserved.current;
        let mut synced = false;
        for s in 0..self.segments.len() {
            if !self.segments[s].alive {
                continue;
            }
            if self.segments[s].expandable {
                for p in 0..self.segments[s].pages.len() {
                    let page = self.segments[s].pages[p];
                    if page.mapped && page.users == 0 {
                        if !synced {
                            be.synchronize()?;
                            synced = true;
                        }
                        self.unmap_page(be, s as u32, p)?;
                    }
                }
            }
            let seg = &self.segments[s];
            let first = &self.blocks[seg.first];
            if first.state != BlockState::Free || first.size != seg.size {
                continue;
            }
            let (base, size, first_id) = (seg.base, seg.size, seg.first);
            self.free.remove(seg.sp, size, base, first_id);
            if seg.expandable {
                be.vm_release(base, size as usize)?;
            } else {
                be.raw_free(base)?;
                self.stats.device_frees += 1;
                self.stats.reserved.sub(size);
            }
            self.blocks.remove(first_id);
            self.stats.segments.sub(1);
            let seg = &mut self.segments[s];
            seg.alive = false;
            seg.pages = Vec::new();
            self.vacant_segments.push(s as u32);
        }
        Ok(before - self.stats.reserved.current)
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let (mut allocated, mut requested, mut count, mut reserved, mut free_blocks) =
            (0u64, 0u64, 0u64, 0u64, 0usize);
        for (si, seg) in self.segments.iter().enumerate().filter(|(_, s)| s.alive) {
            let sp = seg.sp;
            let mut users = vec![0u32; seg.pages.len()];
            let (mut id, mut prev, mut addr) = (seg.first, NONE, seg.base);
            let mut prev_free = false;
            while id != NONE {
                let b = &self.blocks[id];
                if b.prev != prev || b.segment != si as u32 {
                    return Err(format!("block {:#x}: broken links", b.addr));
                }
                if b.addr != addr {
                    return Err(format!(
                        "block {:#x}: expected at {addr:#x} (gap or overlap)",
                        b.addr
                    ));
                }
                let is_free = b.state == BlockState::Free;
                if is_free && prev_free {
                    return Err(format!(
                        "block {:#x}: two free neighbours not merged",
                        b.addr
                    ));
                }
                match b.state {
                    BlockState::Free => {
                        free_blocks += 1;
                        if !self.free.contains(sp, b.size, b.addr, id) {
                            return Err(format!(
                                "free block {:#x} missing from the free set",
                                b.addr
                            ));
                        }
                    }
                    BlockState::Allocated => {
                        allocated += b.size;
                        requested += b.requested;
                        count += 1;
                    }
                    BlockState::Pending => {}
                }
                if seg.expandable && !is_free {
                    let first = ((b.addr - seg.base) / self.page) as usize;
                    let last = ((b.addr + b.size - 1 - seg.base) / self.page) as usize;
                    for (p, u) in users.iter_mut().enumerate().take(last + 1).skip(first) {
                        *u += 1;
                        if !seg.pages[p].mapped {
                            return Err(format!("block {:#x} uses an unmapped page", b.addr));
                        }
                    }
                }
                prev_free = is_free;
                addr += b.size;
                prev = id;
                id = b.next;
            }
            if addr != seg.base + seg.size {
                return Err(format!(
                    "segment {:#x}: blocks cover {} of {} bytes",
                    seg.base,
                    addr - seg.base,
                    seg.size
                ));
            }
            if seg.expandable {
                let mapped = seg.pages.iter().filter(|p| p.mapped).count() as u64;
                if mapped != seg.mapped_pages {
                    return Err(format!(
                        "segment {:#x}: mapped page count is stale",
                        seg.base
                    ));
                }
                if let Some(p) = (0..users.len()).find(|&p| users[p] != seg.pages[p].users) {
                    return Err(format!(
                        "segment {:#x}: page {p} users {} vs recount {}",
                        seg.base, seg.pages[p].users, users[p]
                    ));
                }
                reserved += mapped * self.page;
            } else {
                reserved += seg.size;
            }
        }
        if free_blocks != self.free.len() {
            return Err(format!(
                "{} free blocks but {} in the free set",
                free_blocks,
                self.free.len()
            ));
        }
        let s = &self.stats;
        for (name, stat, recount) in [
            ("allocated", s.allocated.current, allocated),
            ("requested", s.requested.current, requested),
            ("allocations", s.allocations.current, count),
            ("reserved", s.reserved.current, reserved),
        ] {
            if stat != recount {
                return Err(format!("stats: {name} is {stat}, recount {recount}"));
            }
        }
        Ok(())
    }
}
