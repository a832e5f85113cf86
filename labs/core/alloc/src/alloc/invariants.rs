//! The allocator's self-check: every structural invariant of segments, blocks, pages
//! and parked lists, and a recount of every statistic. The property tests call it after
//! every step.

use super::caching::State;
use super::category::Category;
use super::parked::Parked;
use super::pool::{BlockState, NONE};
use super::size::{round_size, Pool};

impl State {
    pub(super) fn check_invariants(&self) -> std::result::Result<(), String> {
        if self.stream_ordered.is_some() {
            return self.check_stream_ordered();
        }
        // Per pool (indexed by `Pool as usize`), in the order of `Recount`'s fields.
        let mut rc = [Recount::default(); 2];
        let (mut free_blocks, mut parked_blocks) = (0usize, 0usize);
        for (si, seg) in self.segments.iter().enumerate().filter(|(_, s)| s.alive) {
            let key = seg.key;
            let r = &mut rc[seg.pool() as usize];
            r.segments += 1;
            let mut users = vec![0u32; seg.pages.len()];
            let (mut id, mut prev, mut addr) = (seg.first, NONE, seg.base);
            let mut prev_free = false;
            while id != NONE {
                let b = &self.blocks[id];
                if b.prev != prev || b.segment != si as u32 || b.key != key {
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
                        if !seg.expandable && (b.prev != NONE || b.next != NONE) {
                            r.inactive_split += 1;
                            r.inactive_split_bytes += b.size;
                        }
                        if !self.free.contains(key, b.size, self.place_of(id), id) {
                            return Err(format!(
                                "free block {:#x} missing from the free set",
                                b.addr
                            ));
                        }
                    }
                    BlockState::Allocated => {
                        r.allocated += b.size;
                        r.requested += b.requested;
                        r.allocations += 1;
                        r.active += 1;
                        r.active_bytes += b.size;
                    }
                    BlockState::Pending => {
                        r.active += 1;
                        r.active_bytes += b.size;
                    }
                    BlockState::Parked => {
                        // Not counted as inactive_split until it is merged: the
                        // statistics read as if it had been merged at its free.
                        parked_blocks += 1;
                        let rounded = round_size(
                            b.requested,
                            self.conf.roundup_power2_divisions.for_size(b.requested),
                        );
                        let listed_as = Parked::key_of(key, rounded);
                        if !self.parked.entries(&self.blocks).contains(&(id, listed_as))
                            && !self.parked_large.contains(&(key, rounded, id))
                        {
                            return Err(format!(
                                "parked block {:#x} missing from its parked list",
                                b.addr
                            ));
                        }
                    }
                }
                if seg.expandable && !is_free {
                    let span = self.pages.span(seg, b.addr, b.size);
                    for (p, u) in users.iter_mut().enumerate().take(span.end).skip(span.start) {
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
                let mut p = 0;
                while p < seg.pages.len() {
                    let page = &seg.pages[p];
                    if !page.mapped {
                        p += 1;
                        continue;
                    }
                    let n = page.len as usize;
                    let run = seg.pages.get(p..p + n).unwrap_or(&[]);
                    if n == 0
                        || run.len() != n
                        || run.iter().any(|q| !q.mapped || q.head != p as u32)
                    {
                        return Err(format!(
                            "segment {:#x}: mapping at page {p} broken",
                            seg.base
                        ));
                    }
                    let recount: u32 = users[p..p + n].iter().sum();
                    if recount != page.users {
                        return Err(format!(
                            "segment {:#x}: mapping at page {p} users {} vs recount {recount}",
                            seg.base, page.users
                        ));
                    }
                    p += n;
                }
                r.reserved += mapped * self.pages.page;
            } else {
                r.reserved += seg.size;
            }
        }
        let listed = self.parked.entries(&self.blocks).len() + self.parked_large.len();
        if parked_blocks != self.parked.len() + self.parked_large.len() || listed != parked_blocks {
            return Err(format!(
                "{parked_blocks} parked blocks but {} counted and {listed} listed",
                self.parked.len() + self.parked_large.len(),
            ));
        }
        let mut streams: Vec<u64> = self.parked_large.iter().map(|e| e.0.bits()).collect();
        streams.sort_unstable();
        streams.dedup();
        if streams.len() != self.parked_large.len() {
            return Err("two parked large blocks on one stream".into());
        }
        if free_blocks != self.free.len() {
            return Err(format!(
                "{} free blocks but {} in the free set",
                free_blocks,
                self.free.len()
            ));
        }
        let s = &self.stats;
        for pool in [Pool::Small, Pool::Large] {
            let r = &rc[pool as usize];
            for ((name, ps), recount) in s.named().into_iter().zip([
                r.allocated,
                r.reserved,
                r.active_bytes,
                r.inactive_split_bytes,
                r.requested,
                r.allocations,
                r.segments,
                r.active,
                r.inactive_split,
            ]) {
                let stat = ps.pool(pool).current;
                if stat != recount {
                    return Err(format!(
                        "stats: {name} ({pool:?}) is {stat}, recount {recount}"
                    ));
                }
            }
        }
        let mut by_category = [0u64; Category::COUNT];
        for b in self
            .segments
            .iter()
            .filter(|s| s.alive)
            .flat_map(|s| self.blocks_of(s))
            .filter(|b| b.state == BlockState::Allocated)
        {
            by_category[b.category.index()] += b.size;
        }
        for c in Category::ALL {
            let stat = &s.by_category[c.index()];
            if stat.current != by_category[c.index()] || stat.allocated - stat.freed != stat.current
            {
                return Err(format!(
                    "stats: {c} bytes are {stat:?}, recount {}",
                    by_category[c.index()]
                ));
            }
        }
        for (name, ps) in s.named() {
            if ps.all.current != ps.small().current + ps.large().current {
                return Err(format!("stats: {name} is not the sum of its pools"));
            }
            for st in [&ps.all, ps.small(), ps.large()] {
                if st.allocated - st.freed != st.current || st.peak < st.current {
                    return Err(format!("stats: {name} totals disagree: {st:?}"));
                }
            }
        }
        self.check_pools()
    }
}

/// What [`State::check_invariants`] counts for one pool.
#[derive(Clone, Copy, Default)]
struct Recount {
    allocated: u64,
    reserved: u64,
    active_bytes: u64,
    inactive_split_bytes: u64,
    requested: u64,
    allocations: u64,
    segments: u64,
    active: u64,
    inactive_split: u64,
}
