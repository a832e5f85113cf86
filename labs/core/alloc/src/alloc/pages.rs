//! The page map of expandable segments: which pages have memory, which mappings are
//! idle, and the driver calls that map and unmap them.
//!
//! An expandable segment is a large reserved address range whose pages get memory
//! only while some block uses them, mapped in runs of up to `max_mapping_mb` (16 MiB
//! by default) per driver mapping. A mapping no block uses is "idle". As in PyTorch,
//! idle mappings stay where they are: reserved memory grows until every request of a
//! loop lands on mapped memory, and only `empty_cache` (or a request that would
//! otherwise run out of memory) unmaps them.
//!
//! With `recycle_idle_pages` (`preset:labs`), reserved memory grows freely up to its
//! high-water mark; past it, idle mappings are recycled first (those idle since the
//! last wait for their streams, so no new wait is needed; else one wait for the
//! streams that own idle memory makes every idle mapping safe at once). An idle
//! mapping of the length needed moves whole: its physical memory is unmapped and
//! mapped where it is needed, with no release and no create. Reserved memory then
//! only passes its high-water mark when no memory is idle, which keeps peak reserved
//! close to peak allocated. The device gets access to what one block needed mapped
//! with one call.
//!
//! Recycling has one way to go wrong: in a loop, memory idle for a moment is wanted
//! back at its old place, so moving it away only to move it back costs driver calls
//! every step and saves nothing. The page map notices: pages recycled after `a` frees
//! of idleness and then mapped again are a regret, and from then on a mapping must
//! have been idle for at least `a` frees to be recycled for a block whose new pages
//! are a small share of the high-water mark (`PATIENT_SHARE`); reserved memory grows
//! by those few pages instead. A large block may still take any idle memory, as
//! refusing it would raise the peak by as much. Measured with the dry run on lab-10's
//! loops (GPT-2 and the tutorial Transformer at several sizes), the steps after the
//! third make no driver call, for a peak 0.4-1.4% above moving pages every step (or
//! below it); on the shared traces every peak stays at or below PyTorch's best mode
//! (`lab-10 train --json` and `lab-02 mappings` report the calls; chapter 2 has the
//! figures).
//!
//! The page map answers questions (how many pages of a range lack memory, where in a
//! block a request would lie on mapped pages) and counts users; it never calls back
//! into the policy that decides which block a request gets.

use std::collections::{BTreeSet, VecDeque};

use super::epochs::Marker;
use std::ops::Range;

use super::caching::State;
use super::pool::Segment;
use crate::backend::{MemoryBackend, PhysicalMemory};
use crate::error::Result;
use crate::snapshot::TraceAction;

#[derive(Clone, Copy, Default)]
pub(crate) struct Page {
    pub mapped: bool,
    /// The first page of the mapping this page belongs to (while mapped). Pages are
    /// mapped in runs, one driver mapping per run, and unmapped by the same run.
    pub head: u32,
    /// On a mapping's first page: the mapping's length in pages.
    pub len: u32,
    /// On a mapping's first page: the (block, page) pairs of blocks that are not free
    /// (allocated or pending) on its pages. The mapping is idle when this is zero.
    /// Counted per mapping rather than per page, so that occupying a block walks its
    /// mappings, not its pages.
    pub users: u32,
    /// On a mapping's first page: listed in one of the idle sets.
    queued: bool,
    /// On a mapping's first page: the synchronisation epoch in which it last became
    /// idle; idle since an earlier epoch, no queued work can use it.
    idle_epoch: u64,
    /// On a mapping's first page: the count of frees (`PageMap::frees_total`) when it
    /// last became idle.
    idle_since: u64,
    /// On an unmapped page: how many frees its mapping had been idle, plus one, when
    /// recycling took it away (0: not taken by recycling). Mapping the page again is a
    /// regret (see the module's documentation).
    recycled_after: u64,
}

impl Page {
    /// Whether this is the first page of a mapping that no block uses.
    fn is_idle_head(&self, index: usize) -> bool {
        self.mapped && self.head == index as u32 && self.users == 0
    }
}

/// The allocator-wide half of the page map: the page size, the idle mappings and the
/// epochs that say which of them are safe to unmap.
///
/// Unmapping memory needs the work queued on it before it fell idle to be done. Rather
/// than waiting for that when memory is needed (a stream synchronisation, which drains
/// the queue and leaves the GPU idle while the host refills it), the allocator closes
/// an epoch every `epochs::FREES_PER_EPOCH` frees by recording an event on each stream that
/// owns memory that fell idle in it. Memory idle since a closed epoch is safe once that
/// epoch's events have completed, which by the time the memory is wanted back they
/// usually have: a wait, when one is needed, lasts until that point of the queue, not
/// to its end. Which mapping is unmapped depends on epochs only, never on what has
/// completed, so the dry run and the simulator make the GPU's choices.
#[derive(Default)]
pub(super) struct PageMap {
    /// Bytes per page (the driver's mapping granularity); 0 with fixed segments.
    pub page: u64,
    /// The most pages one driver mapping covers (`max_mapping_mb`). A mapping is
    /// unmapped only as a whole, so the idle pages of a mapping that one block still
    /// uses are stranded: longer runs mean fewer driver calls but more stranded memory
    /// (the figures are at `config::DEFAULT_MAX_MAPPING`).
    pub max_run: usize,
    /// Epochs closed so far (the current epoch).
    pub(super) epoch: u64,
    /// Idle mappings (segment, first page) that fell idle in a closed epoch: safe to
    /// unmap once its events complete (lazy: see `recycle_idle`).
    pub(super) idle: BTreeSet<(u32, u32)>,
    /// Idle mappings that fell idle in the current epoch.
    pub(super) idle_dirty: BTreeSet<(u32, u32)>,
    /// The streams (indices) of the segments of `idle_dirty`'s mappings, each once:
    /// kept as they join, so that closing an epoch does not walk the set (a replay,
    /// whose streams the allocator does not hold, asks at every free).
    pub(super) dirty_owners: Vec<u32>,
    /// The events of closed epochs not yet waited for, oldest first.
    pub(super) markers: VecDeque<Marker>,
    /// Frees since the last epoch closed.
    pub(super) frees: u32,
    /// The most memory ever reserved. Mapping below it costs the peak nothing.
    pub high_water: u64,
    /// Frees of blocks on expandable segments so far: the clock of idleness.
    pub(super) frees_total: u64,
    /// How many frees a mapping must have been idle to be recycled: the longest
    /// idleness whose recycling was regretted (0 until one is).
    pub(super) min_idle: u64,
    /// Whether `min_idle` holds for the block being given pages: only for a block
    /// whose new pages are a small share of the high-water mark (see `occupy`).
    patient: bool,
}

impl PageMap {
    /// The page map of pages of `page` bytes, mapped at most `max_mapping` bytes (whole
    /// pages, at least one) at a time.
    pub fn new(page: u64, max_mapping: u64) -> PageMap {
        PageMap {
            page,
            max_run: (max_mapping.checked_div(page).unwrap_or(1) as usize).max(1),
            ..PageMap::default()
        }
    }

    /// The pages of `seg` that `addr..addr + size` touches.
    pub fn span(&self, seg: &Segment, addr: u64, size: u64) -> Range<usize> {
        let first = ((addr - seg.base) / self.page) as usize;
        let last = ((addr + size - 1 - seg.base) / self.page) as usize;
        first..last + 1
    }

    /// How many pages of `addr..addr + len` in `seg` have no memory.
    #[inline]
    pub fn unmapped_pages(&self, seg: &Segment, addr: u64, len: u64) -> usize {
        let span = self.span(seg, addr, len);
        let mut p = span.start;
        let mut unmapped = 0;
        while p < span.end {
            let page = &seg.pages[p];
            if page.mapped {
                p = page.head as usize + seg.pages[page.head as usize].len as usize;
            } else {
                unmapped += 1;
                p += 1;
            }
        }
        unmapped
    }

    /// The offset of the first page boundary inside the free range `addr..addr + size`
    /// of `seg` from which `rounded` bytes lie on mapped pages, if any. A block whose
    /// start has lost its pages may still hold mapped memory further in (pages are
    /// unmapped a mapping at a time, wherever the oldest idle one is).
    pub fn mapped_window(&self, seg: &Segment, addr: u64, size: u64, rounded: u64) -> Option<u64> {
        let page = self.page;
        let end = (addr + size).min(seg.base + seg.mapped_end as u64 * page);
        let mut start = seg.base + (addr - seg.base).div_ceil(page) * page;
        while start + rounded <= end {
            let first = ((start - seg.base) / page) as usize;
            let last = ((start + rounded - 1 - seg.base) / page) as usize;
            match (first..=last).rev().find(|&p| !seg.pages[p].mapped) {
                None => return Some(start - addr),
                Some(p) => start = seg.base + (p as u64 + 1) * page,
            }
        }
        None
    }

    /// The runs of mapped pages of an expandable segment, as (address, length).
    pub fn mapped_ranges(&self, seg: &Segment) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, _) in seg.pages.iter().enumerate().filter(|(_, p)| p.mapped) {
            let addr = seg.base + i as u64 * self.page;
            match out.last_mut() {
                Some((start, len)) if *start + *len == addr => *len += self.page,
                _ => out.push((addr, self.page)),
            }
        }
        out
    }

    /// Bytes of `seg`'s mapped memory that no block uses.
    pub fn idle_bytes(&self, seg: &Segment) -> u64 {
        let idle_pages: u64 = (seg.pages.iter().enumerate())
            .filter(|(p, page)| page.is_idle_head(*p))
            .map(|(_, page)| page.len as u64)
            .sum();
        idle_pages * self.page
    }

    /// Counts a new user of the mapped pages of `span`; returns how many pages of it
    /// have no memory yet.
    pub fn add_users(&self, seg: &mut Segment, span: Range<usize>) -> u64 {
        let mut unmapped = 0u64;
        let mut p = span.start;
        while p < span.end {
            let page = seg.pages[p];
            if page.mapped {
                let head = &mut seg.pages[page.head as usize];
                let end = (page.head as usize + head.len as usize).min(span.end);
                head.users += (end - p) as u32;
                p = end;
            } else {
                unmapped += 1;
                p += 1;
            }
        }
        unmapped
    }

    /// Whether the idle mapping whose first page is `head` has been idle long enough to
    /// be recycled.
    #[inline]
    fn idle_long_enough(&self, seg: &Segment, h: usize) -> bool {
        !self.patient || self.frees_total - seg.pages[h].idle_since >= self.min_idle
    }

    /// Lists mapping `(s, h)`, of a segment of stream `stream`, as idle in the current
    /// epoch.
    pub(super) fn mark_dirty(&mut self, s: u32, h: u32, stream: u32) {
        self.idle_dirty.insert((s, h));
        if !self.dirty_owners.contains(&stream) {
            self.dirty_owners.push(stream);
        }
    }

    /// Drops a user of the pages of `span` in segment `s`; mappings left with none are
    /// queued as idle (dirty: work queued before now may still use them).
    pub fn drop_users(&mut self, s: u32, seg: &mut Segment, span: Range<usize>) {
        let mut p = span.start;
        while p < span.end {
            let page = seg.pages[p];
            if !page.mapped {
                // Only on the way out of a failed `occupy`.
                p += 1;
                continue;
            }
            let h = page.head;
            let head = &mut seg.pages[h as usize];
            let end = (h as usize + head.len as usize).min(span.end);
            head.users -= (end - p) as u32;
            p = end;
            if head.users == 0 {
                head.idle_epoch = self.epoch;
                head.idle_since = self.frees_total;
                if !head.queued {
                    head.queued = true;
                    self.mark_dirty(s, h, seg.key.stream);
                }
            }
        }
    }
}

// ANCHOR: patient_share
/// A block whose new pages come to at most `1 / PATIENT_SHARE` of the high-water mark
/// of reserved memory (4%) leaves memory idle for less than `min_idle` where it is,
/// growing reserved memory instead; a larger one may take any idle memory. Leaving a
/// training loop's briefly idle memory in place costs the peak a little for each small
/// block, and would cost it much for a large one (a step that first makes an
/// optimizer's state). Measured on the shared traces and lab-10's loops (the module's
/// documentation, chapter 2): 1/25 and 1/50 both stop the loops' driver calls after
/// their third step and keep every trace at or below PyTorch's best mode; 1/100 and
/// 1/200 leave a few loops moving pages.
const PATIENT_SHARE: u64 = 25;
// ANCHOR_END: patient_share

/// The driver calls of the page map, and the statistics and history they change.
impl State {
    /// Counts block `id` as a user of its pages and maps the ones without memory, each
    /// run of unmapped pages with one driver mapping.
    pub(super) fn occupy(&mut self, be: &dyn MemoryBackend, id: u32) -> Result<()> {
        let (s, span) = self.page_span(id);
        let unmapped = (self.pages).add_users(&mut self.segments[s as usize], span.clone());
        if unmapped == 0 {
            return Ok(());
        }
        // A request that cannot fit even with every idle page recycled fails here,
        // before mapping part of it only to unmap it again.
        let needed = unmapped * self.pages.page;
        // PyTorch's expandable segments take any idle memory, and only under pressure.
        self.pages.patient = self.conf.recycle_idle_pages
            && needed.saturating_mul(PATIENT_SHARE) <= self.pages.high_water;
        let reserved = self.stats.reserved.current;
        if reserved + needed > self.limit && reserved + needed > self.limit + self.idle_bytes() {
            return Err(self.out_of_memory(needed));
        }
        // The pages mapped here, first to last: the device gets access to all of them
        // with one call once they are mapped. This saves calls, not time: on an H100
        // `cuMemSetAccess` costs 20-27 us per mapping in its range, so what costs is
        // the number of mappings (`lab-02 bench` measures it).
        let mut newly: Option<Range<usize>> = None;
        let mut p = span.start;
        while p < span.end {
            if self.segments[s as usize].pages[p].mapped {
                p += 1;
                continue;
            }
            let mut end = p + 1;
            while end < span.end
                && end - p < self.pages.max_run
                && !self.segments[s as usize].pages[end].mapped
            {
                end += 1;
            }
            self.map_run(be, s, p, end)?;
            newly = Some(newly.map_or(p..end, |r| r.start..end));
            p = end;
        }
        if let Some(r) = newly {
            let page = self.pages.page;
            let base = self.segments[s as usize].base;
            let addr = base + r.start as u64 * page;
            let bytes = ((r.end - r.start) as u64 * page) as usize;
            (self.stats.driver.access).time(|| be.vm_set_access(addr, bytes))?;
        }
        Ok(())
    }

    /// Drops block `id` as a user of its pages (it is free again).
    pub(super) fn vacate(&mut self, id: u32) {
        let (s, span) = self.page_span(id);
        (self.pages).drop_users(s, &mut self.segments[s as usize], span);
    }

    /// Block `id`'s segment and the pages it touches.
    fn page_span(&self, id: u32) -> (u32, Range<usize>) {
        let b = &self.blocks[id];
        let seg = &self.segments[b.segment as usize];
        (b.segment, self.pages.span(seg, b.addr, b.size))
    }

    /// Bytes of mapped memory no block uses (what recycling could take back).
    fn idle_bytes(&self) -> u64 {
        (self.segments.iter().enumerate())
            .filter(|(i, s)| s.alive && s.expandable && !self.in_private_pool(*i as u32))
            .map(|(_, s)| self.pages.idle_bytes(s))
            .sum()
    }

    /// Whether segment `s` belongs to a live private pool, whose idle pages no other
    /// request may take (`mempool.rs`).
    fn in_private_pool(&self, s: u32) -> bool {
        !self.pools.is_empty() && self.in_live_pool(self.segments[s as usize].key)
    }

    /// Maps pages `first..end` of segment `s` (all unmapped, all with users) as one
    /// mapping. Below the high-water mark of reserved memory new memory costs the peak
    /// nothing, so it is simply mapped and idle memory stays where it is (a training
    /// loop's next iteration finds it mapped). Above it, the mappings idle the longest
    /// are recycled first, so that reserved memory does not grow while memory sits idle:
    /// one of exactly this length is moved here, else idle mappings are released until
    /// new memory fits under the mark. Unmapping needs the work that used the memory to
    /// be done: memory idle since before the last wait for its stream needs no new one,
    /// and the oldest idle mappings are taken first, so waits are rare. The caller grants
    /// the device access (`occupy`).
    fn map_run(&mut self, be: &dyn MemoryBackend, s: u32, first: usize, end: usize) -> Result<()> {
        let n = (end - first) as u64;
        let page = self.pages.page;
        let bytes = n * page;
        let addr = self.segments[s as usize].base + first as u64 * page;
        self.note_regret(s, first, end);
        // Without recycling (PyTorch's expandable segments), idle memory is taken only
        // when the request would not fit otherwise. The limit may have been lowered
        // below the high-water mark since.
        let recycle = self.conf.recycle_idle_pages;
        let growing = |st: &State| {
            let mark = if recycle {
                st.pages.high_water.min(st.limit)
            } else {
                st.limit
            };
            st.stats.reserved.current + bytes > mark
        };
        if recycle && growing(self) {
            // An idle mapping of exactly this length moves here whole: its physical
            // memory is unmapped and mapped again, with no release and no create.
            if let Some(memory) = self.take_idle_of_length(be, n as u32)? {
                (self.stats.driver.map).time(|| be.vm_map_memory(addr, memory))?;
                self.stats.num_remaps += 1;
                self.mapped(s, first, end, false);
                return Ok(());
            }
        }
        while growing(self) {
            if !self.recycle_idle(be)? {
                break;
            }
        }
        if self.stats.reserved.current + bytes > self.limit {
            return Err(self.out_of_memory(bytes));
        }
        let memory = (self.stats.driver.create).time(|| be.vm_create(bytes as usize))?;
        (self.stats.driver.map).time(|| be.vm_map_memory(addr, memory))?;
        self.mapped(s, first, end, true);
        Ok(())
    }

    /// Records the mapping of pages `first..end` of segment `s`, of memory just
    /// `created` or moved from another mapping (already counted as reserved).
    fn mapped(&mut self, s: u32, first: usize, end: usize, created: bool) {
        let n = (end - first) as u64;
        let bytes = n * self.pages.page;
        let seg = &mut self.segments[s as usize];
        let addr = seg.base + first as u64 * self.pages.page;
        for p in &mut seg.pages[first..end] {
            p.mapped = true;
            p.head = first as u32;
        }
        let head = &mut seg.pages[first];
        head.len = n as u32;
        head.users = n as u32;
        seg.mapped_pages += n;
        seg.mapped_end = seg.mapped_end.max(end as u32);
        let (pool, stream) = (seg.pool(), seg.stream);
        if created {
            self.stats.device_allocs += 1;
        }
        self.stats.num_maps += 1;
        self.stats.reserved.add(pool, bytes);
        self.pages.high_water = self.pages.high_water.max(self.stats.reserved.current);
        self.note(TraceAction::SegmentMap, addr, bytes, stream);
    }

    /// Unmaps an idle mapping of exactly `len` pages that no queued work can use, and
    /// returns its memory, still allocated; `None` when no such mapping is among the
    /// few idle the longest that are looked at.
    fn take_idle_of_length(
        &mut self,
        be: &dyn MemoryBackend,
        len: u32,
    ) -> Result<Option<PhysicalMemory>> {
        /// Idle mappings looked at, from the end recycling takes first: enough to find
        /// a training loop's repeating lengths, few enough to keep the search short.
        const CANDIDATES: usize = 32;
        let epoch = self.pages.epoch;
        let mut found = None;
        let candidates: Vec<(u32, u32)> =
            (self.pages.idle.iter().rev().take(CANDIDATES).copied()).collect();
        for (s, h) in candidates {
            let fits = (self.segments.get(s as usize))
                .filter(|g| g.alive)
                .and_then(|g| g.pages.get(h as usize))
                .is_some_and(|p| {
                    p.is_idle_head(h as usize) && p.len == len && p.idle_epoch != epoch
                });
            if fits && (self.pages).idle_long_enough(&self.segments[s as usize], h as usize) {
                found = Some((s, h));
                break;
            }
        }
        let Some((s, h)) = found else {
            return Ok(None);
        };
        self.pages.idle.remove(&(s, h));
        let head = &mut self.segments[s as usize].pages[h as usize];
        head.queued = false;
        let since = head.idle_epoch;
        self.settle(be, since)?;
        self.note_recycled(s, h as usize);
        self.unmap_run(be, s, h as usize, false)
    }

    /// Unmaps an idle mapping; false when none is idle. Mappings idle since before the
    /// last device-wide synchronisation go first, as unmapping them needs no new one;
    /// among them, the one at the highest address (live blocks pack towards low
    /// addresses, so it is the least likely to be wanted back where it is).
    ///
    /// The idle sets are lazy, so that the allocation fast path touches neither: an
    /// entry is checked when taken, and dropped when its mapping is busy or gone.
    /// Mappings not idle long enough to be recycled stay listed.
    fn recycle_idle(&mut self, be: &dyn MemoryBackend) -> Result<bool> {
        let mut kept = Vec::new();
        let recycled = self.recycle_idle_from(be, &mut kept);
        self.pages.idle.extend(kept);
        recycled
    }

    /// [`recycle_idle`](Self::recycle_idle), setting aside in `kept` the idle mappings
    /// it passes over for being idle too briefly.
    fn recycle_idle_from(
        &mut self,
        be: &dyn MemoryBackend,
        kept: &mut Vec<(u32, u32)>,
    ) -> Result<bool> {
        loop {
            while let Some((s, h)) = self.pages.idle.pop_last() {
                if self.in_private_pool(s) {
                    // A live private pool's pages are its own: a graph's replays write
                    // its free blocks.
                    kept.push((s, h));
                    continue;
                }
                let epoch = self.pages.epoch;
                if self.idle_head(s, h).is_some()
                    && !(self.pages).idle_long_enough(&self.segments[s as usize], h as usize)
                {
                    kept.push((s, h));
                    continue;
                }
                let Some(page) = self.idle_head(s, h) else {
                    continue;
                };
                if page.idle_epoch == epoch {
                    // Idle again in the current epoch.
                    let stream = self.segments[s as usize].key.stream;
                    self.pages.mark_dirty(s, h, stream);
                    continue;
                }
                page.queued = false;
                let since = page.idle_epoch;
                self.settle(be, since)?;
                self.note_recycled(s, h as usize);
                self.unmap_run(be, s, h as usize, true)?;
                return Ok(true);
            }
            let mut dirty = std::mem::take(&mut self.pages.idle_dirty);
            dirty.retain(|&(s, h)| self.idle_head(s, h).is_some());
            let old_enough = dirty.iter().any(|&(s, h)| {
                !self.in_private_pool(s)
                    && (self.pages).idle_long_enough(&self.segments[s as usize], h as usize)
            });
            if !old_enough {
                // Nothing idle long enough (or nothing idle at all): no epoch to close.
                self.pages.idle_dirty = dirty;
                return Ok(false);
            }
            self.pages.idle_dirty = dirty;
            // Only memory idle in the current epoch is left: close it.
            let streams = self.idle_owners();
            self.close_epoch(be, streams)?;
        }
    }

    /// The first page of an idle mapping, for an entry of the idle sets; `None` (and
    /// the page unlisted) when the entry is stale.
    fn idle_head(&mut self, s: u32, h: u32) -> Option<&mut Page> {
        let page = (self.segments.get_mut(s as usize))
            .filter(|g| g.alive)
            .and_then(|g| g.pages.get_mut(h as usize))?;
        if page.is_idle_head(h as usize) {
            Some(page)
        } else {
            page.queued = false;
            None
        }
    }

    /// Lowers the high-water mark to what is reserved now (for `empty_cache`, which
    /// starts afresh): a later workload then grows, and recycles idle memory, as it
    /// would on a new allocator, rather than growing freely up to the most an earlier
    /// workload reserved, which would make its peak depend on what ran before it.
    pub(super) fn lower_high_water(&mut self) {
        self.pages.high_water = self.stats.reserved.current;
        // The regrets were the earlier workload's: its period is not the next one's.
        self.pages.min_idle = 0;
        for seg in self.segments.iter_mut().filter(|g| g.alive && g.expandable) {
            seg.pages.iter_mut().for_each(|p| p.recycled_after = 0);
        }
    }

    /// Records that recycling takes the mapping whose first page is `head` away, and
    /// after how long idle (see the module's documentation).
    fn note_recycled(&mut self, s: u32, head: usize) {
        let frees = self.pages.frees_total;
        let seg = &mut self.segments[s as usize];
        let after = frees - seg.pages[head].idle_since + 1;
        let n = seg.pages[head].len as usize;
        seg.pages[head..head + n]
            .iter_mut()
            .for_each(|p| p.recycled_after = after);
    }

    /// Pages `first..end` of segment `s` are being mapped again: where recycling took
    /// them, it took them too soon, and mappings idle no longer than they had been are
    /// not recycled from now on.
    fn note_regret(&mut self, s: u32, first: usize, end: usize) {
        for p in &mut self.segments[s as usize].pages[first..end] {
            if p.recycled_after > 0 {
                self.pages.min_idle = self.pages.min_idle.max(p.recycled_after);
                p.recycled_after = 0;
            }
        }
    }

    /// Unmaps every idle mapping of segment `s` (for `empty_cache`), synchronising
    /// first when one may still be used by queued work; nothing while a graph is being
    /// captured (see `release_segment_if_free`).
    pub(super) fn unmap_idle(&mut self, be: &dyn MemoryBackend, s: u32) -> Result<()> {
        if self.capture_underway() {
            return Ok(());
        }
        for h in 0..self.segments[s as usize].pages.len() {
            let seg = &self.segments[s as usize];
            if !seg.pages[h].is_idle_head(h) {
                continue;
            }
            let since = seg.pages[h].idle_epoch;
            self.settle(be, since)?;
            self.unmap_run(be, s, h, true)?;
        }
        Ok(())
    }

    /// Unmaps the mapping whose first page is `head`, and releases its memory when
    /// `release`; otherwise returns it (still counted as reserved until it is mapped
    /// again, which the caller does at once).
    fn unmap_run(
        &mut self,
        be: &dyn MemoryBackend,
        s: u32,
        head: usize,
        release: bool,
    ) -> Result<Option<PhysicalMemory>> {
        let page = self.pages.page;
        let seg = &mut self.segments[s as usize];
        let n = seg.pages[head].len as usize;
        let bytes = n as u64 * page;
        let addr = seg.base + head as u64 * page;
        let memory = (self.stats.driver.unmap).time(|| be.vm_unmap_memory(addr, bytes as usize))?;
        for p in &mut seg.pages[head..head + n] {
            p.mapped = false;
        }
        seg.mapped_pages -= n as u64;
        let (pool, stream) = (seg.pool(), seg.stream);
        self.stats.num_unmaps += 1;
        self.stats.reserved.sub(pool, bytes);
        self.note(TraceAction::SegmentUnmap, addr, bytes, stream);
        if release {
            (self.stats.driver.release).time(|| be.vm_free_memory(memory))?;
            self.stats.device_frees += 1;
            return Ok(None);
        }
        Ok(Some(memory))
    }
}
