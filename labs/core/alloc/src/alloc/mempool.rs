//! Private memory pools: PyTorch's `torch.cuda.MemPool` and `use_mem_pool`, and the
//! allocator's half of a CUDA graph's private pool.
//!
//! A private pool is a set of lanes: stream indices of its own in the free set's key
//! space (`pool.rs`), one per stream the pool allocates on. A segment belongs to the lane
//! it was made for, its free blocks are listed under that lane's key and every search
//! names one key, so best fit, splitting, merging and parking keep a pool's blocks apart
//! from the default pool's and from other pools' without a change. A lane counts as a
//! stream against [`MAX_STREAMS`](super::MAX_STREAMS). Without a scope open on any thread
//! a malloc pays one check for all this, and without a released pool still holding
//! segments a free pays one.
//!
//! Scope: a pool receives the allocations of the thread that began allocating to it, on
//! every stream, until that thread ends it (PyTorch's `use_mem_pool`, whose filter is the
//! current thread); or, for a CUDA graph's capture, every allocation on one stream,
//! from any thread, until the capture ends (PyTorch's `beginAllocateToPool` with the
//! capturing stream as its filter). Nested scopes route to the innermost that matches.
//! Other threads and streams allocate from the default pool as before, though while any
//! scope is open every malloc looks its thread and stream up (a scope left open by a
//! thread that ended keeps it so). Frees need no scope: a block goes back to its
//! segment's pool.
//!
//! Lifetime: [`Allocator::release_pool`] marks a pool unused (the `MemPool` object gone):
//! its free segments go back to the driver at once, and each remaining segment at the
//! first free after its last block is freed (or at `empty_cache`). Until then
//! `empty_cache`, the out-of-memory ladder and the garbage collector leave the pool's
//! segments alone: they are the pool's, not the cache's.

use std::marker::PhantomData;

use super::allocator::{Allocation, Allocator};
use super::caching::State;
use super::pool::{check_stream_count, BlockState, PoolKey};
use crate::backend::{MemoryBackend, Stream};
use crate::error::{Error, Result};

/// A memory pool's id: 0 is the default pool, private pools count from 1 (PyTorch's
/// `MemPool.id`, `(0, 0)` for the default pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemPoolId(pub u64);

impl MemPoolId {
    /// The default pool, where allocations go outside any pool's scope.
    pub const DEFAULT: MemPoolId = MemPoolId(0);
}

impl std::fmt::Display for MemPoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pool {}", self.0)
    }
}

/// One pool's figures, recounted from its segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemPoolStats {
    /// Bytes held from the driver (mapped pages, on expandable segments).
    pub reserved: u64,
    /// Bytes in blocks handed out.
    pub allocated: u64,
    /// Bytes the program asked for in those blocks.
    pub requested: u64,
    /// Blocks handed out.
    pub blocks: u64,
    /// Segments.
    pub segments: u64,
    /// Whether the pool is released (always false for the default pool).
    pub released: bool,
}

/// The allocator's record of a private pool.
#[derive(Debug, Default)]
pub(crate) struct PrivatePool {
    /// Released: no new allocations; its segments go back to the driver once free.
    pub released: bool,
    /// Its lanes, one per stream it allocated on.
    pub lanes: Vec<u32>,
    /// Its live segments.
    pub segments: u64,
    /// Lends its free blocks to a request of the default pool that would otherwise
    /// run out of memory (PyTorch's `MemPool(use_on_oom=True)`).
    pub use_on_oom: bool,
}

/// While alive, the calling thread's allocations on the allocator go to a private pool
/// (PyTorch's `with torch.cuda.use_mem_pool(pool):`). Ends on drop, on the same thread:
/// it cannot move to another one.
#[must_use = "the scope ends when the guard is dropped"]
pub struct MemPoolScope<'a> {
    alloc: &'a Allocator,
    id: MemPoolId,
    _thread_bound: PhantomData<*const ()>,
}

impl MemPoolScope<'_> {
    pub fn id(&self) -> MemPoolId {
        self.id
    }
}

impl Drop for MemPoolScope<'_> {
    fn drop(&mut self) {
        // The scope began on this thread, so it is there to end.
        let _ = self.alloc.end_allocate_to_pool(self.id);
    }
}

/// Whose allocations a scope sends to its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteFrom {
    /// Every allocation of one thread, on any stream (`use_mem_pool`).
    Thread(std::thread::ThreadId),
    /// Every allocation on one stream, by its handle, from any thread (a graph's
    /// capture).
    Stream(u64),
}

impl RouteFrom {
    fn matches(self, thread: std::thread::ThreadId, stream: u64) -> bool {
        match self {
            RouteFrom::Thread(t) => t == thread,
            RouteFrom::Stream(s) => s == stream,
        }
    }
}

impl State {
    /// The key of a request in a private pool's scope: the lane of the pool routed to
    /// by the innermost scope matching the calling thread or the request's stream, for
    /// the stream of `key` (the default pool's lane), made on first use; `key` itself
    /// when no scope matches.
    #[cold]
    pub(super) fn route(&mut self, key: PoolKey, object: Option<&Stream>) -> Result<PoolKey> {
        let me = std::thread::current().id();
        let handle = self.streams[key.stream as usize];
        let Some(&(_, pool)) = self.routes.iter().rev().find(|r| r.0.matches(me, handle)) else {
            return Ok(key);
        };
        let p = &self.pools[pool as usize - 1];
        let lane = match p
            .lanes
            .iter()
            .find(|&&l| self.streams[l as usize] == handle)
        {
            Some(&l) => l,
            None => {
                // After the stream's default lane (made by `key_of`), so that the default
                // pool's search by handle finds that one first.
                check_stream_count(self.streams.len())?;
                self.streams.push(handle);
                self.stream_objects.push(None);
                self.lane_pools.push(pool);
                let l = (self.streams.len() - 1) as u32;
                self.pools[pool as usize - 1].lanes.push(l);
                l
            }
        };
        if let Some(object) = object {
            if self.stream_objects[lane as usize].is_none() {
                self.stream_objects[lane as usize] = Some(object.clone());
            }
        }
        Ok(PoolKey {
            stream: lane,
            pool: key.pool,
        })
    }

    /// The lanes of the live pools that lend on out-of-memory, for the stream of
    /// `key` (a default-pool key), as keys of the same size class.
    pub(super) fn lending_lanes(&self, key: PoolKey) -> Vec<PoolKey> {
        if self.lane_pools[key.stream as usize] != 0 {
            return Vec::new(); // a private pool's own request borrows from nobody
        }
        let handle = self.streams[key.stream as usize];
        (self.pools.iter())
            .filter(|p| p.use_on_oom && !p.released)
            .flat_map(|p| p.lanes.iter().copied())
            .filter(|&l| self.streams[l as usize] == handle)
            .map(|l| PoolKey {
                stream: l,
                pool: key.pool,
            })
            .collect()
    }

    /// Whether some stream's allocations go to a pool now: a graph is being captured.
    #[inline]
    pub(super) fn capture_underway(&self) -> bool {
        (self.routes.iter()).any(|r| matches!(r.0, RouteFrom::Stream(_)))
    }

    /// The private pool of a key's lane, 0 for the default pool.
    #[inline]
    pub(super) fn pool_of_key(&self, key: PoolKey) -> u64 {
        self.lane_pools[key.stream as usize]
    }

    /// Whether a key's lane belongs to a private pool not released.
    pub(super) fn in_live_pool(&self, key: PoolKey) -> bool {
        match self.pool_of_key(key) {
            0 => false,
            p => !self.pools[p as usize - 1].released,
        }
    }

    /// Counts a new segment of `key`'s lane under its pool.
    pub(super) fn count_segment(&mut self, key: PoolKey) {
        if let p @ 1.. = self.pool_of_key(key) {
            self.pools[p as usize - 1].segments += 1;
        }
    }

    /// Uncounts a released segment of `key`'s lane; a released pool's last one ends its
    /// draining.
    pub(super) fn forget_segment(&mut self, key: PoolKey) {
        if let p @ 1.. = self.pool_of_key(key) {
            let pool = &mut self.pools[p as usize - 1];
            pool.segments -= 1;
            if pool.released && pool.segments == 0 {
                self.draining -= 1;
            }
        }
    }

    /// A free while some released pool still holds segments: a block of such a pool
    /// merges at once rather than being parked, and its segment goes back to the driver
    /// once wholly free.
    #[cold]
    pub(super) fn free_draining(
        &mut self,
        be: &dyn MemoryBackend,
        block: Allocation,
    ) -> Result<()> {
        self.check_handle(&block)?;
        let (key, segment) = {
            let b = &self.blocks[block.id];
            (b.key, b.segment as usize)
        };
        if !matches!(self.pool_of_key(key), p @ 1.. if self.pools[p as usize - 1].released) {
            return self.free_cached(be, block);
        }
        let park = std::mem::replace(&mut self.conf.park_freed_blocks, false);
        let freed = self.free_cached(be, block);
        self.conf.park_freed_blocks = park;
        freed?;
        if self.segments[segment].alive {
            if self.segments[segment].expandable {
                self.unmap_idle(be, segment as u32)?;
            }
            self.release_segment_if_free(be, segment)?;
        }
        self.sample_timeline();
        Ok(())
    }

    /// Gives back every wholly free segment of the released pools, or of pool `only`.
    fn release_drained(&mut self, be: &dyn MemoryBackend, only: Option<u64>) -> Result<()> {
        for s in 0..self.segments.len() {
            let seg = &self.segments[s];
            let pool = self.pool_of_key(seg.key);
            if !seg.alive
                || pool == 0
                || self.in_live_pool(seg.key)
                || only.is_some_and(|p| p != pool)
            {
                continue;
            }
            if seg.expandable {
                self.unmap_idle(be, s as u32)?;
            }
            self.release_segment_if_free(be, s)?;
        }
        self.sample_timeline();
        Ok(())
    }

    /// Checks that `id` names a private pool, not released.
    fn check_live_pool(&self, id: MemPoolId) -> Result<()> {
        if self.stream_ordered.is_some() {
            return Err(Error::InvalidArgument(format!(
                "{id}: private pools (and graph captures into them) conflict with \
                 backend:cudaMallocAsync: the driver's pool serves every request"
            )));
        }
        match id.0 {
            0 => Err(Error::InvalidArgument(
                "the default pool is not a private pool".into(),
            )),
            p if p as usize > self.pools.len() => Err(Error::InvalidArgument(format!(
                "{id} was not created by this allocator"
            ))),
            p if self.pools[p as usize - 1].released => {
                Err(Error::InvalidArgument(format!("{id} is released")))
            }
            _ => Ok(()),
        }
    }

    /// Marks pool `id` released; returns the bytes given back now.
    fn release_pool(&mut self, be: &dyn MemoryBackend, id: MemPoolId) -> Result<u64> {
        self.check_live_pool(id)?;
        if self.routes.iter().any(|r| r.1 == id.0) {
            return Err(Error::InvalidArgument(format!(
                "{id} is in use by a scope (a thread's or a capture's); end it first"
            )));
        }
        // Parked blocks are free memory: merged, so that whole segments show.
        self.unpark_all();
        let before = self.stats.reserved.current;
        let pool = &mut self.pools[id.0 as usize - 1];
        pool.released = true;
        if pool.segments > 0 {
            self.draining += 1;
        }
        self.release_drained(be, Some(id.0))?;
        Ok(before - self.stats.reserved.current)
    }

    /// Releases every pool, for the allocator's drop.
    pub(super) fn release_all_pools(&mut self) {
        self.routes.clear();
        for pool in self.pools.iter_mut().filter(|p| !p.released) {
            pool.released = true;
            if pool.segments > 0 {
                self.draining += 1;
            }
        }
    }

    /// Bytes allocated in private pools, for the out-of-memory report.
    pub(super) fn private_pools_allocated(&self) -> u64 {
        (1..=self.pools.len() as u64)
            .filter_map(|p| self.pool_stats(MemPoolId(p)).ok())
            .map(|s| s.allocated)
            .sum()
    }

    /// Pool `id`'s figures, recounted from its segments.
    fn pool_stats(&self, id: MemPoolId) -> Result<MemPoolStats> {
        if id.0 as usize > self.pools.len() {
            return Err(Error::InvalidArgument(format!(
                "{id} was not created by this allocator"
            )));
        }
        let mut out = MemPoolStats {
            released: id.0 > 0 && self.pools[id.0 as usize - 1].released,
            ..MemPoolStats::default()
        };
        for seg in self.segments.iter().filter(|s| s.alive) {
            if self.pool_of_key(seg.key) != id.0 {
                continue;
            }
            out.segments += 1;
            out.reserved += if seg.expandable {
                seg.mapped_pages * self.pages.page
            } else {
                seg.size
            };
            for b in self.blocks_of(seg) {
                if b.state == BlockState::Allocated {
                    out.allocated += b.size;
                    out.requested += b.requested;
                    out.blocks += 1;
                }
            }
        }
        Ok(out)
    }

    /// The pools' invariants: lanes and pools name each other, the first lane of a
    /// stream is the default pool's, the segment counts match, the draining count
    /// matches, scopes name live pools, every free-set entry is a free block of its
    /// key's lane, and the pools' figures add up to the device's.
    pub(super) fn check_pools(&self) -> std::result::Result<(), String> {
        let lanes = self.streams.len();
        if self.lane_pools.len() != lanes || self.stream_objects.len() != lanes {
            return Err("lanes: the per-lane tables differ in length".into());
        }
        for (l, &p) in self.lane_pools.iter().enumerate() {
            let handle = self.streams[l];
            let first = self.streams.iter().position(|&s| s == handle);
            if p == 0 {
                if first != Some(l) {
                    return Err(format!("lane {l}: a second default lane of its stream"));
                }
                continue;
            }
            if first.is_none_or(|f| f >= l || self.lane_pools[f] != 0) {
                return Err(format!("lane {l}: before its stream's default lane"));
            }
            match self.pools.get(p as usize - 1) {
                Some(pool) if pool.lanes.contains(&(l as u32)) => {}
                _ => return Err(format!("lane {l}: pool {p} does not list it")),
            }
        }
        let mut segments = vec![0u64; self.pools.len() + 1];
        for seg in self.segments.iter().filter(|s| s.alive) {
            segments[self.pool_of_key(seg.key) as usize] += 1;
        }
        let mut draining = 0;
        for (i, pool) in self.pools.iter().enumerate() {
            let id = i as u64 + 1;
            for (n, &l) in pool.lanes.iter().enumerate() {
                let handle = self.streams[l as usize];
                if self.lane_pools[l as usize] != id
                    || pool.lanes[..n]
                        .iter()
                        .any(|&o| self.streams[o as usize] == handle)
                {
                    return Err(format!("pool {id}: lane {l} misattributed or repeated"));
                }
            }
            if pool.segments != segments[i + 1] {
                return Err(format!(
                    "pool {id}: {} segments counted, {} recounted",
                    pool.segments,
                    segments[i + 1]
                ));
            }
            if pool.released && pool.segments > 0 {
                draining += 1;
            }
        }
        if draining != self.draining {
            return Err(format!(
                "{} pools draining, {draining} recounted",
                self.draining
            ));
        }
        if let Some(r) =
            (self.routes.iter()).find(|r| self.check_live_pool(MemPoolId(r.1)).is_err())
        {
            return Err(format!("a scope routes to pool {}, not live", r.1));
        }
        for (bits, size, id) in self.free.entries() {
            let b = &self.blocks[id];
            if b.state != BlockState::Free || b.key.bits() != bits || b.size != size {
                return Err(format!(
                    "free set: entry of block {:#x} is not a free block of its lane",
                    b.addr
                ));
            }
        }
        // The pools' figures are their segments' (`pool_stats`): one pass sums them by
        // pool, and the pools together must make the device's.
        let mut by_pool = vec![(0u64, 0u64); self.pools.len() + 1];
        for seg in self.segments.iter().filter(|s| s.alive) {
            let e = &mut by_pool[self.pool_of_key(seg.key) as usize];
            e.0 += if seg.expandable {
                seg.mapped_pages * self.pages.page
            } else {
                seg.size
            };
            e.1 += (self.blocks_of(seg))
                .filter(|b| b.state == BlockState::Allocated)
                .map(|b| b.size)
                .sum::<u64>();
        }
        let sum = MemPoolStats {
            reserved: by_pool.iter().map(|e| e.0).sum(),
            allocated: by_pool.iter().map(|e| e.1).sum(),
            segments: segments.iter().sum(),
            ..MemPoolStats::default()
        };
        let s = &self.stats;
        let device = (
            s.reserved.current,
            s.allocated.current,
            s.segments.all.current,
        );
        if (sum.reserved, sum.allocated, sum.segments) != device {
            return Err(format!(
                "pools: reserved, allocated, segments sum to {:?}, the device's are {device:?}",
                (sum.reserved, sum.allocated, sum.segments),
            ));
        }
        Ok(())
    }
}

impl Allocator {
    /// A new private pool (PyTorch's `torch.cuda.MemPool()`): empty until a thread
    /// allocates to it.
    pub fn create_pool(&self) -> MemPoolId {
        self.create_pool_with(false)
    }

    /// A new private pool that, with `use_on_oom`, lends its free blocks to a request
    /// of the default pool that would otherwise run out of memory, once the cache has
    /// been given back (PyTorch's `torch.cuda.MemPool(use_on_oom=True)`). A lent block
    /// stays the pool's: freed, it goes back to the pool.
    pub fn create_pool_with(&self, use_on_oom: bool) -> MemPoolId {
        let mut st = self.lock();
        st.pools.push(PrivatePool {
            use_on_oom,
            ..PrivatePool::default()
        });
        MemPoolId(st.pools.len() as u64)
    }

    /// Sends the calling thread's allocations to pool `id` until
    /// [`end_allocate_to_pool`](Self::end_allocate_to_pool) (PyTorch's
    /// `_cuda_beginAllocateCurrentThreadToPool`).
    pub fn begin_allocate_to_pool(&self, id: MemPoolId) -> Result<()> {
        let mut st = self.lock();
        st.check_live_pool(id)?;
        st.routes
            .push((RouteFrom::Thread(std::thread::current().id()), id.0));
        Ok(())
    }

    /// Ends the calling thread's innermost scope of pool `id`.
    pub fn end_allocate_to_pool(&self, id: MemPoolId) -> Result<()> {
        let me = RouteFrom::Thread(std::thread::current().id());
        self.end_route(me, id, "this thread does not allocate to")
    }

    /// Sends every allocation on `stream`, from any thread, to pool `id` until
    /// [`end_allocate_stream_to_pool`](Self::end_allocate_stream_to_pool): what a CUDA
    /// graph's capture does with its pool (PyTorch's `beginAllocateToPool` with the
    /// capturing stream as the filter).
    pub fn begin_allocate_stream_to_pool(&self, id: MemPoolId, stream: &Stream) -> Result<()> {
        let mut st = self.lock();
        st.check_live_pool(id)?;
        st.routes.push((RouteFrom::Stream(stream.handle()), id.0));
        Ok(())
    }

    /// Ends the innermost scope that sends `stream`'s allocations to pool `id`. With
    /// the last capture ended, the cross-stream frees made during captures record
    /// their events.
    pub fn end_allocate_stream_to_pool(&self, id: MemPoolId, stream: &Stream) -> Result<()> {
        let from = RouteFrom::Stream(stream.handle());
        self.end_route(from, id, "no scope sends this stream's allocations to")?;
        let mut st = self.lock();
        if !st.capture_underway() {
            for block in std::mem::take(&mut st.after_capture) {
                st.defer_free(&*self.backend, block)?;
            }
        }
        Ok(())
    }

    fn end_route(&self, from: RouteFrom, id: MemPoolId, missing: &str) -> Result<()> {
        let mut st = self.lock();
        match st.routes.iter().rposition(|r| *r == (from, id.0)) {
            Some(i) => {
                st.routes.remove(i);
                Ok(())
            }
            None => Err(Error::InvalidArgument(format!("{missing} {id}"))),
        }
    }

    /// Allocates to pool `id` from the calling thread while the guard lives (PyTorch's
    /// `with torch.cuda.use_mem_pool(pool):`).
    pub fn use_pool(&self, id: MemPoolId) -> Result<MemPoolScope<'_>> {
        self.begin_allocate_to_pool(id)?;
        Ok(MemPoolScope {
            alloc: self,
            id,
            _thread_bound: PhantomData,
        })
    }

    /// The pool the calling thread allocates to now.
    pub fn current_pool(&self) -> MemPoolId {
        let me = std::thread::current().id();
        let st = self.lock();
        let route = st
            .routes
            .iter()
            .rev()
            .find(|r| r.0 == RouteFrom::Thread(me));
        MemPoolId(route.map_or(0, |r| r.1))
    }

    /// Marks pool `id` unused (its `MemPool` object gone, PyTorch's `releasePool`): no
    /// new allocations; its free segments go back to the driver now, the rest as their
    /// blocks are freed. Returns the bytes given back now.
    pub fn release_pool(&self, id: MemPoolId) -> Result<u64> {
        let mut st = self.lock();
        st.release_pool(&*self.backend, id)
    }

    /// Pool `id`'s figures ([`MemPoolId::DEFAULT`] for the default pool's).
    pub fn pool_stats(&self, id: MemPoolId) -> Result<MemPoolStats> {
        self.lock().pool_stats(id)
    }

    /// The pool `block` belongs to.
    pub fn pool_of(&self, block: &Allocation) -> Result<MemPoolId> {
        let st = self.lock();
        st.check_handle(block)?;
        Ok(MemPoolId(st.pool_of_key(st.blocks[block.id].key)))
    }

    /// Bytes held by private pools, released ones included.
    pub fn private_pools_reserved(&self) -> u64 {
        let st = self.lock();
        (1..=st.pools.len() as u64)
            .filter_map(|p| st.pool_stats(MemPoolId(p)).ok())
            .map(|s| s.reserved)
            .sum()
    }
}
