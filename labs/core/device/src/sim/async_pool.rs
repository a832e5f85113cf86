//! The simulated GPU's stream-ordered pools: what `cuMemAllocAsync` and
//! `cuMemFreeAsync` allocate from and free to, modelled on the driver's documented
//! semantics rather than mocked.
//!
//! The model. A pool holds chunks of the device's memory, each a whole number of the
//! driver's 2 MiB physical pages (a request larger than any free range grows the pool by
//! one chunk of the request rounded up to 2 MiB: what `ReservedCurrent` counts).
//! Requests are rounded to 512 bytes (`UsedCurrent` counts the rounded sizes) and served
//! best fit, smallest free range first, lowest address on a tie, from the free ranges
//! the request may use:
//!
//! - a range freed on the requesting stream at once: the stream's later work runs after
//!   the free (stream order, as `cuMemFreeAsync` promises);
//! - a range freed on another stream once the free's place in that stream has been
//!   reached, which the pool learns from an event recorded there at the free and
//!   queried at each request (the driver's "opportunistic" reuse, on by default).
//!
//! Neighbouring free ranges merge once both are known complete, or while both wait on
//! the same stream. When no range fits and the device has no room for a new chunk, the
//! pool waits for the frees still in flight and tries again before failing with
//! out-of-memory. Freed memory stays in the pool: at a synchronisation of the device or
//! of a stream, the pool gives whole unused chunks back to the device while it holds
//! more than its release threshold (0 unless set, as the driver's default), and
//! `pool_trim_to` gives them back down to the bytes asked to keep.
//!
//! Where it differs from the driver, knowingly:
//! - the driver may make a request on one stream wait for a free on another
//!   (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`) instead of growing; the model
//!   grows, and waits only when the device is full;
//! - it does not follow event dependencies between streams
//!   (`..._REUSE_FOLLOW_EVENT_DEPENDENCIES`): a stream that waited on a free's stream
//!   reuses the range only once the free is complete;
//! - a chunk goes back only whole, and the driver's own chunk sizes (it may reserve more
//!   than a request at once, 32 MiB and more for small requests on some versions) are
//!   not modelled: reserved memory here is the 2 MiB-rounded chunks the requests made;
//! - event synchronisations are not synchronisation points; device and stream
//!   synchronisations are;
//! - a pool's memory is not shared with other pools: an unused chunk of one pool is not
//!   given back to serve another's request;
//! - it fragments more than the driver: a chunk's pages stay at its addresses, so free
//!   pages of several chunks never serve one larger request, where the driver, which
//!   maps physical memory into its own address range, seems to reuse them. Replaying
//!   the shared traces (`lab-02 mappings`), peak reserved over peak requested is
//!   1.06-1.51 here against 1.03-1.13 for PyTorch's `backend:cudaMallocAsync` on an
//!   H100 (`book/src/outputs/lab-02/mappings-gpu.txt`): the sim's figures for this
//!   backend are an upper bound, not the GPU's.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::memory::{SimMemory, PAGE};
use super::stream::SimEvent;
use crate::backend::{AsyncPool, DeviceId, DevicePtr, Event, PoolAttribute, Stream};
use crate::error::{Error, Result};

/// Requests are rounded to this, as `cuMemAllocAsync` aligns them.
const ALIGNMENT: u64 = 512;
/// The handle of the device's default pool.
const DEFAULT_POOL: u64 = 1;

/// Every stream-ordered pool of one simulated GPU.
pub(crate) struct SimPools {
    device: DeviceId,
    memory: Arc<SimMemory>,
    state: Mutex<Pools>,
}

#[derive(Default)]
struct Pools {
    pools: HashMap<u64, Pool>,
    next_handle: u64,
    /// The live allocations: their pool and rounded size.
    live: HashMap<DevicePtr, (u64, u64)>,
}

#[derive(Default)]
struct Pool {
    /// Chunks by base address.
    chunks: BTreeMap<u64, Chunk>,
    release_threshold: u64,
    reserved: u64,
    reserved_high: u64,
    used: u64,
    used_high: u64,
    /// Destroyed with allocations outstanding: its chunks go when they are unused.
    destroyed: bool,
}

struct Chunk {
    size: u64,
    /// The free ranges by address: their size, and the free still in flight, if any.
    free: BTreeMap<u64, (u64, Option<InFlight>)>,
}

/// A free not yet known to be complete: its stream, the event recorded there after it,
/// and the order it was made in (of two on one stream, the later one completes last).
#[derive(Clone)]
struct InFlight {
    stream: u64,
    event: Event,
    order: u64,
}

/// Numbers the frees, in the order they are made.
static FREES: AtomicU64 = AtomicU64::new(0);

impl Chunk {
    fn is_unused(&self) -> bool {
        self.free.len() == 1
            && self
                .free
                .values()
                .all(|(s, f)| *s == self.size && f.is_none())
    }

    /// Marks completed frees as such, then merges neighbours that may merge.
    fn settle(&mut self) -> Result<()> {
        for (_, inflight) in self.free.values_mut() {
            if let Some(f) = inflight {
                if f.event.query()? {
                    *inflight = None;
                }
            }
        }
        let mut merged: BTreeMap<u64, (u64, Option<InFlight>)> = BTreeMap::new();
        for (addr, (size, inflight)) in std::mem::take(&mut self.free) {
            if let Some((&last, (last_size, last_flight))) = merged.iter_mut().next_back() {
                // `last` is the previous range's address: adjacent when it ends here.
                let adjacent = last + *last_size == addr;
                let mergeable = match (&*last_flight, &inflight) {
                    (None, None) => true,
                    // Events of one stream complete in order: the later covers both.
                    (Some(a), Some(b)) => a.stream == b.stream,
                    _ => false,
                };
                if adjacent && mergeable {
                    *last_size += size;
                    if let (Some(a), Some(b)) = (&*last_flight, &inflight) {
                        if b.order > a.order {
                            *last_flight = inflight;
                        }
                    }
                    continue;
                }
            }
            merged.insert(addr, (size, inflight));
        }
        self.free = merged;
        Ok(())
    }
}

impl SimPools {
    pub fn new(device: DeviceId, memory: Arc<SimMemory>) -> SimPools {
        SimPools {
            device,
            memory,
            state: Mutex::new(Pools {
                next_handle: DEFAULT_POOL + 1,
                ..Pools::default()
            }),
        }
    }

    pub fn default_pool(&self) -> AsyncPool {
        self.state
            .lock()
            .unwrap()
            .pools
            .entry(DEFAULT_POOL)
            .or_default();
        AsyncPool(DEFAULT_POOL)
    }

    pub fn create(&self) -> AsyncPool {
        let mut s = self.state.lock().unwrap();
        let handle = s.next_handle;
        s.next_handle += 1;
        s.pools.insert(handle, Pool::default());
        AsyncPool(handle)
    }

    fn unknown(&self, pool: AsyncPool) -> Error {
        Error::InvalidArgument(format!(
            "memory pool {:#x} is not a live pool of {}",
            pool.0, self.device
        ))
    }

    pub fn destroy(&self, pool: AsyncPool) -> Result<()> {
        if pool.0 == DEFAULT_POOL {
            return Err(Error::InvalidArgument(format!(
                "cuMemPoolDestroy: the default pool of {} cannot be destroyed",
                self.device
            )));
        }
        let mut s = self.state.lock().unwrap();
        let p = s.pools.get_mut(&pool.0).filter(|p| !p.destroyed);
        let p = p.ok_or_else(|| self.unknown(pool))?;
        p.destroyed = true;
        self.release_unused(p, 0)?;
        if p.chunks.is_empty() {
            s.pools.remove(&pool.0);
        }
        Ok(())
    }

    // ANCHOR: sim_pool_alloc
    pub fn alloc(&self, pool: AsyncPool, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let size = (bytes as u64).max(1).next_multiple_of(ALIGNMENT);
        let mut s = self.state.lock().unwrap();
        let p = s.pools.get_mut(&pool.0).filter(|p| !p.destroyed);
        let p = p.ok_or_else(|| self.unknown(pool))?;
        for c in p.chunks.values_mut() {
            c.settle()?;
        }
        let ptr = match best_fit(p, size, stream.handle()) {
            Some(at) => at,
            None => match self.grow(p, size) {
                Ok(at) => at,
                Err(e) if e.is_out_of_memory() => {
                    // The device is full: wait for the frees in flight, then look again.
                    for c in p.chunks.values_mut() {
                        for (_, f) in c.free.values() {
                            if let Some(f) = f {
                                f.event.synchronize()?;
                            }
                        }
                        c.settle()?;
                    }
                    best_fit(p, size, stream.handle()).ok_or(e)?
                }
                Err(e) => return Err(e),
            },
        };
        take(p, ptr, size);
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        s.live.insert(ptr, (pool.0, size));
        Ok(ptr)
    }
    // ANCHOR_END: sim_pool_alloc

    /// A new chunk for a request of `size` bytes; the place to carve it from.
    fn grow(&self, p: &mut Pool, size: u64) -> Result<u64> {
        let bytes = size.next_multiple_of(PAGE);
        let base = self.memory.alloc(bytes as usize)?;
        let mut free = BTreeMap::new();
        free.insert(base, (bytes, None));
        p.chunks.insert(base, Chunk { size: bytes, free });
        p.reserved += bytes;
        p.reserved_high = p.reserved_high.max(p.reserved);
        Ok(base)
    }

    pub fn free(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        let (pool, size) = s.live.remove(&ptr).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "cuMemFreeAsync of {ptr:#x} on {}: not a live stream-ordered allocation",
                self.device
            ))
        })?;
        let event = SimEvent::new_event(self.device);
        if let Err(e) = stream.record(&event) {
            s.live.insert(ptr, (pool, size));
            return Err(e);
        }
        let p = s
            .pools
            .get_mut(&pool)
            .expect("a live allocation's pool lives");
        let chunk = (p.chunks.range_mut(..=ptr).next_back())
            .map(|(_, c)| c)
            .expect("a live allocation lies in a chunk");
        let inflight = InFlight {
            stream: stream.handle(),
            event,
            order: FREES.fetch_add(1, Ordering::Relaxed),
        };
        chunk.free.insert(ptr, (size, Some(inflight)));
        chunk.settle()?;
        p.used -= size;
        if p.destroyed {
            self.release_unused(p, 0)?;
            if p.chunks.is_empty() {
                s.pools.remove(&pool);
            }
        }
        Ok(())
    }

    pub fn attribute(&self, pool: AsyncPool, attribute: PoolAttribute) -> Result<u64> {
        let s = self.state.lock().unwrap();
        let p = s.pools.get(&pool.0).filter(|p| !p.destroyed);
        let p = p.ok_or_else(|| self.unknown(pool))?;
        Ok(match attribute {
            PoolAttribute::ReleaseThreshold => p.release_threshold,
            PoolAttribute::ReservedCurrent => p.reserved,
            PoolAttribute::ReservedHigh => p.reserved_high,
            PoolAttribute::UsedCurrent => p.used,
            PoolAttribute::UsedHigh => p.used_high,
        })
    }

    pub fn set_attribute(
        &self,
        pool: AsyncPool,
        attribute: PoolAttribute,
        value: u64,
    ) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        let p = s.pools.get_mut(&pool.0).filter(|p| !p.destroyed);
        let p = p.ok_or_else(|| self.unknown(pool))?;
        match attribute {
            PoolAttribute::ReleaseThreshold => p.release_threshold = value,
            PoolAttribute::ReservedHigh if value == 0 => p.reserved_high = p.reserved,
            PoolAttribute::UsedHigh if value == 0 => p.used_high = p.used,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "cuMemPoolSetAttribute: {attribute:?} cannot be set to {value} (a \
                     high-water mark only to 0, the current values never)"
                )))
            }
        }
        Ok(())
    }

    pub fn trim_to(&self, pool: AsyncPool, keep: u64) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        let p = s.pools.get_mut(&pool.0).filter(|p| !p.destroyed);
        let p = p.ok_or_else(|| self.unknown(pool))?;
        self.release_unused(p, keep)
    }

    /// A synchronisation point: every pool gives unused chunks back down to its release
    /// threshold.
    pub fn synchronized(&self) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        for p in s.pools.values_mut() {
            let keep = if p.destroyed { 0 } else { p.release_threshold };
            self.release_unused(p, keep)?;
        }
        s.pools.retain(|_, p| !(p.destroyed && p.chunks.is_empty()));
        Ok(())
    }

    /// Gives unused chunks back, largest first, while the pool holds more than `keep`.
    fn release_unused(&self, p: &mut Pool, keep: u64) -> Result<()> {
        let mut unused: Vec<(u64, u64)> = Vec::new();
        for (&base, c) in p.chunks.iter_mut() {
            c.settle()?;
            if c.is_unused() {
                unused.push((c.size, base));
            }
        }
        unused.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (size, base) in unused {
            if p.reserved <= keep {
                break;
            }
            self.memory.free(base)?;
            p.chunks.remove(&base);
            p.reserved -= size;
        }
        Ok(())
    }
}

/// The smallest free range of at least `size` bytes that work on `stream` may use, the
/// lowest address on a tie.
fn best_fit(p: &Pool, size: u64, stream: u64) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for c in p.chunks.values() {
        for (&addr, (len, inflight)) in &c.free {
            let usable = inflight.as_ref().is_none_or(|f| f.stream == stream);
            if usable && *len >= size && best.is_none_or(|b| (*len, addr) < b) {
                best = Some((*len, addr));
            }
        }
    }
    best.map(|(_, addr)| addr)
}

/// Carves `size` bytes off the front of the free range at `at`.
fn take(p: &mut Pool, at: u64, size: u64) {
    let chunk = (p.chunks.range_mut(..=at).next_back())
        .map(|(_, c)| c)
        .expect("a free range lies in a chunk");
    let (len, inflight) = chunk.free.remove(&at).expect("the range is free");
    if len > size {
        chunk.free.insert(at + size, (len - size, inflight));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Sender};

    use super::super::stream::sim_stream;
    use super::super::SimBackend;
    use crate::backend::prelude::*;
    use crate::backend::{AsyncPool, DeviceId, PoolAttribute, Stream};

    const MIB: u64 = 1 << 20;

    fn device() -> SimBackend {
        SimBackend::new(DeviceId::Sim(7), 1 << 30)
    }

    /// Holds `stream`'s queue until the sender is dropped or sent to.
    fn block(be: &SimBackend, stream: &Stream) -> Sender<()> {
        let (tx, rx) = channel::<()>();
        let s = sim_stream(stream, be.id()).unwrap();
        s.enqueue(Box::new(move || {
            let _ = rx.recv();
            Ok(())
        }))
        .unwrap();
        tx
    }

    fn reserved(be: &SimBackend, pool: AsyncPool) -> u64 {
        be.pool_attribute(pool, PoolAttribute::ReservedCurrent)
            .unwrap()
    }

    #[test]
    fn a_free_serves_its_stream_at_once_and_others_once_it_is_done() {
        let be = device();
        let pool = be.pool_create().unwrap();
        // Kept across synchronisations, as the allocator's pool is.
        be.pool_set_attribute(pool, PoolAttribute::ReleaseThreshold, u64::MAX)
            .unwrap();
        let (s0, s1) = (be.new_stream(0).unwrap(), be.new_stream(0).unwrap());
        let a = be.pool_alloc_async(pool, (3 * MIB) as usize, &s0).unwrap();
        assert_eq!(
            reserved(&be, pool),
            4 * MIB,
            "one chunk of whole 2 MiB pages"
        );
        let release = block(&be, &s0);
        be.raw_free_async(a, &s0).unwrap();
        // The free is queued behind the held work: another stream cannot have it.
        let other = be.pool_alloc_async(pool, (3 * MIB) as usize, &s1).unwrap();
        assert_ne!(other, a);
        assert_eq!(reserved(&be, pool), 8 * MIB);
        // Its own stream can: its later work runs after the free.
        let same = be.pool_alloc_async(pool, (3 * MIB) as usize, &s0).unwrap();
        assert_eq!(same, a);
        be.raw_free_async(same, &s0).unwrap();
        drop(release);
        s0.synchronize().unwrap();
        let third = be.pool_alloc_async(pool, (3 * MIB) as usize, &s1).unwrap();
        assert_eq!(third, a, "done on its stream: any stream reuses it");
        assert_eq!(reserved(&be, pool), 8 * MIB);
        for (p, s) in [(other, &s1), (third, &s1)] {
            be.raw_free_async(p, s).unwrap();
        }
    }

    #[test]
    fn best_fit_takes_the_smallest_range_and_neighbours_merge() {
        let be = device();
        let pool = be.pool_create().unwrap();
        let s = be.default_stream().unwrap();
        let big = be.pool_alloc_async(pool, (6 * MIB) as usize, &s).unwrap();
        let small = be.pool_alloc_async(pool, (2 * MIB) as usize, &s).unwrap();
        be.raw_free_async(big, &s).unwrap();
        be.raw_free_async(small, &s).unwrap();
        let fit = be.pool_alloc_async(pool, MIB as usize, &s).unwrap();
        assert_eq!(fit, small, "the 2 MiB range, not the 6 MiB one");
        be.raw_free_async(fit, &s).unwrap();
        // Sizes are rounded to 512 bytes, and a range carved up merges back.
        let pieces: Vec<_> = (0..12)
            .map(|_| be.pool_alloc_async(pool, 500_000, &s).unwrap())
            .collect();
        assert_eq!(pieces[1] - pieces[0], 500_224);
        for p in pieces {
            be.raw_free_async(p, &s).unwrap();
        }
        let whole = be.pool_alloc_async(pool, (6 * MIB) as usize, &s).unwrap();
        assert_eq!(whole, big);
        assert_eq!(reserved(&be, pool), 8 * MIB);
        be.raw_free_async(whole, &s).unwrap();
    }

    #[test]
    fn synchronisation_gives_back_above_the_threshold_and_trim_down_to_keep() {
        let be = device();
        let s = be.default_stream().unwrap();
        // The default pool keeps nothing across a synchronisation (threshold 0).
        let default = be.pool_default().unwrap();
        let p = be.raw_alloc_async((10 * MIB) as usize, &s).unwrap();
        be.raw_free_async(p, &s).unwrap();
        assert_eq!(reserved(&be, default), 10 * MIB);
        s.synchronize().unwrap();
        assert_eq!(reserved(&be, default), 0);
        // A pool with a threshold keeps up to it.
        let pool = be.pool_create().unwrap();
        be.pool_set_attribute(pool, PoolAttribute::ReleaseThreshold, 8 * MIB)
            .unwrap();
        let a = be.pool_alloc_async(pool, (6 * MIB) as usize, &s).unwrap();
        let b = be.pool_alloc_async(pool, (10 * MIB) as usize, &s).unwrap();
        be.raw_free_async(a, &s).unwrap();
        be.raw_free_async(b, &s).unwrap();
        be.synchronize().unwrap();
        assert_eq!(reserved(&be, pool), 6 * MIB, "the larger chunk went first");
        be.pool_trim_to(pool, 0).unwrap();
        assert_eq!(reserved(&be, pool), 0);
        assert_eq!(be.mem_info().unwrap().free, 1 << 30);
    }

    #[test]
    fn high_water_marks_reset_to_the_current_values() {
        let be = device();
        let pool = be.pool_create().unwrap();
        let s = be.default_stream().unwrap();
        let a = be.pool_alloc_async(pool, (20 * MIB) as usize, &s).unwrap();
        be.raw_free_async(a, &s).unwrap();
        // Until the free is known complete, trimming cannot give its memory back.
        s.synchronize().unwrap();
        be.pool_trim_to(pool, 0).unwrap();
        assert_eq!(reserved(&be, pool), 0);
        let get = |attr| be.pool_attribute(pool, attr).unwrap();
        assert_eq!(get(PoolAttribute::ReservedHigh), 20 * MIB);
        assert_eq!(get(PoolAttribute::UsedHigh), 20 * MIB);
        assert_eq!(get(PoolAttribute::UsedCurrent), 0);
        be.pool_set_attribute(pool, PoolAttribute::ReservedHigh, 0)
            .unwrap();
        be.pool_set_attribute(pool, PoolAttribute::UsedHigh, 0)
            .unwrap();
        assert_eq!(get(PoolAttribute::ReservedHigh), 0);
        assert_eq!(get(PoolAttribute::UsedHigh), 0);
        assert!(be
            .pool_set_attribute(pool, PoolAttribute::UsedHigh, 5)
            .is_err());
        assert!(be
            .pool_set_attribute(pool, PoolAttribute::ReservedCurrent, 0)
            .is_err());
    }

    #[test]
    fn a_full_device_waits_for_frees_in_flight_before_failing() {
        let be = SimBackend::new(DeviceId::Sim(7), 64 * MIB);
        let pool = be.pool_create().unwrap();
        let (s0, s1) = (be.new_stream(0).unwrap(), be.new_stream(0).unwrap());
        let a = be.pool_alloc_async(pool, (48 * MIB) as usize, &s0).unwrap();
        let release = block(&be, &s0);
        be.raw_free_async(a, &s0).unwrap();
        let waiter = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(release);
        });
        // No room for a new chunk: the request waits for the free on the other stream.
        let b = be.pool_alloc_async(pool, (48 * MIB) as usize, &s1).unwrap();
        assert_eq!(b, a);
        waiter.join().unwrap();
        let e = be
            .pool_alloc_async(pool, (32 * MIB) as usize, &s1)
            .unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        be.raw_free_async(b, &s1).unwrap();
        be.pool_destroy(pool).unwrap();
    }
}
