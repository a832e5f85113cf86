//! A caching allocator for page-locked host memory, after PyTorch's
//! `CachingHostAllocator`. `cuMemHostAlloc` is slow (it pins every page, 100 ms for
//! 256 MiB) and `cuMemFreeHost` synchronises the device, so blocks are kept and reused.
//! Reuse has one rule: a block whose memory an asynchronous copy may still read or
//! write goes back into the pool only once an event recorded after that copy has
//! completed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use crate::device::{Device, DeviceId, Event, HostPtr, Stream};
use crate::error::{Error, Result};

/// Blocks are at least a page, so small requests share one size class.
const MIN_BLOCK: usize = 4096;

// ANCHOR: size_class
/// The size a request is served with: the next power of two. Wasteful for odd sizes,
/// but a loader that asks for the same batch size over and over always hits.
pub fn size_class(bytes: usize) -> usize {
    bytes.max(MIN_BLOCK).next_power_of_two()
}
// ANCHOR_END: size_class

/// Counters in the spirit of `torch.cuda.memory_stats()`, for pinned host memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Bytes of blocks handed out and not yet freed.
    pub allocated_bytes: u64,
    pub allocated_peak: u64,
    /// Bytes held from the driver (handed out, cached or waiting on events).
    pub reserved_bytes: u64,
    pub reserved_peak: u64,
    /// Blocks handed out and not yet freed.
    pub allocated_blocks: u64,
    /// Blocks freed by their user whose copies may still be running.
    pub pending_blocks: u64,
    /// `allocate` and `free` calls.
    pub alloc_calls: u64,
    pub free_calls: u64,
    /// Allocations served from the cache, and those that went to `cuMemHostAlloc`.
    pub cache_hits: u64,
    pub host_alloc_calls: u64,
    pub host_free_calls: u64,
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
enum State {
    Allocated,
    /// Freed, waiting for its events.
    Pending,
    Cached,
}

struct Block {
    size: usize,
    state: State,
    /// Streams that used the block since it was handed out (`record_stream`).
    streams: Vec<Stream>,
    /// Events recorded on those streams when the block was freed.
    events: Vec<Event>,
}

struct Inner {
    blocks: HashMap<usize, Block>,
    /// Cached block addresses by size class.
    free: HashMap<usize, Vec<usize>>,
    /// Freed blocks whose events were pending, oldest first.
    pending: VecDeque<usize>,
    /// Completed events, recycled (creating events is not free either).
    spare_events: Vec<Event>,
    stats: HostStats,
}

/// The pinned-memory cache of one device.
pub struct HostAllocator {
    device: Device,
    inner: Mutex<Inner>,
}

fn registry() -> &'static Mutex<HashMap<DeviceId, Arc<HostAllocator>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<DeviceId, Arc<HostAllocator>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl HostAllocator {
    /// The process-wide host allocator for `device` (what `pin_memory()` uses).
    pub fn get(device: &Device) -> Arc<HostAllocator> {
        registry()
            .lock()
            .unwrap()
            .entry(device.id())
            .or_insert_with(|| Arc::new(HostAllocator::new(device)))
            .clone()
    }

    /// A private allocator (tests and experiments that need clean statistics).
    pub fn new(device: &Device) -> HostAllocator {
        HostAllocator {
            device: device.clone(),
            inner: Mutex::new(Inner {
                blocks: HashMap::new(),
                free: HashMap::new(),
                pending: VecDeque::new(),
                spare_events: Vec::new(),
                stats: HostStats::default(),
            }),
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    // ANCHOR: host_allocate
    /// A pinned block of at least `bytes` bytes, freed back to the cache on drop.
    pub fn allocate(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuffer> {
        let size = size_class(bytes);
        let mut inner = self.inner.lock().unwrap();
        inner.stats.alloc_calls += 1;
        // Blocks whose copies have finished since the last call become reusable now.
        inner.process_events()?;
        let cached = inner.free.get_mut(&size).and_then(Vec::pop);
        let ptr = match cached {
            Some(ptr) => {
                inner.stats.cache_hits += 1;
                ptr
            }
            None => {
                // Pinning takes milliseconds: not under the lock, or every thread that
                // frees or allocates meanwhile (the training loop itself) would stall.
                drop(inner);
                let ptr = self.device.backend().host_alloc(size, false)? as usize;
                inner = self.inner.lock().unwrap();
                inner.stats.host_alloc_calls += 1;
                inner.stats.reserved_bytes += size as u64;
                inner.stats.reserved_peak =
                    inner.stats.reserved_peak.max(inner.stats.reserved_bytes);
                inner.blocks.insert(
                    ptr,
                    Block {
                        size,
                        state: State::Cached,
                        streams: Vec::new(),
                        events: Vec::new(),
                    },
                );
                ptr
            }
        };
        let block = inner.blocks.get_mut(&ptr).expect("a known block");
        debug_assert!(block.state == State::Cached && block.events.is_empty());
        block.state = State::Allocated;
        inner.stats.allocated_bytes += size as u64;
        inner.stats.allocated_blocks += 1;
        inner.stats.allocated_peak = inner.stats.allocated_peak.max(inner.stats.allocated_bytes);
        Ok(PinnedBuffer {
            allocator: self.clone(),
            ptr: ptr as HostPtr,
            len: bytes,
            capacity: size,
        })
    }
    // ANCHOR_END: host_allocate

    // ANCHOR: host_record_stream
    /// Marks the block as used by work on `stream`: when it is freed, an event recorded
    /// on that stream must complete before the block is reused.
    pub fn record_stream(&self, ptr: HostPtr, stream: &Stream) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        let block = inner
            .blocks
            .get_mut(&(ptr as usize))
            .filter(|b| b.state == State::Allocated)
            .ok_or_else(|| unknown(ptr))?;
        if !block.streams.iter().any(|s| s.handle() == stream.handle()) {
            block.streams.push(stream.clone());
        }
        Ok(())
    }

    /// Returns a block. Without recorded streams it is reusable at once; otherwise an
    /// event goes on each stream and the block waits for all of them.
    pub fn free(&self, ptr: HostPtr) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        let key = ptr as usize;
        let (size, streams) = match inner.blocks.get_mut(&key) {
            Some(b) if b.state == State::Allocated => (b.size, std::mem::take(&mut b.streams)),
            _ => return Err(unknown(ptr)),
        };
        inner.stats.free_calls += 1;
        inner.stats.allocated_bytes -= size as u64;
        inner.stats.allocated_blocks -= 1;
        let mut events = Vec::with_capacity(streams.len());
        for stream in &streams {
            let event = match inner.spare_events.pop() {
                Some(e) => e,
                None => self.device.new_event()?,
            };
            stream.record(&event)?;
            events.push(event);
        }
        let block = inner.blocks.get_mut(&key).expect("checked above");
        if events.is_empty() {
            block.state = State::Cached;
            inner.free.entry(size).or_default().push(key);
        } else {
            block.state = State::Pending;
            block.events = events;
            inner.pending.push_back(key);
            inner.stats.pending_blocks += 1;
        }
        Ok(())
    }
    // ANCHOR_END: host_record_stream

    /// Moves blocks whose events have completed into the cache.
    pub fn process_events(&self) -> Result<()> {
        self.inner.lock().unwrap().process_events()
    }

    /// Waits for every pending block's events, then gives every cached block back to
    /// the driver (`torch.cuda.empty_cache()`'s counterpart for pinned memory).
    pub fn empty_cache(&self) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        for key in inner.pending.clone() {
            for e in &inner.blocks[&key].events {
                e.synchronize()?;
            }
        }
        inner.process_events()?;
        let cached: Vec<usize> = inner.free.drain().flat_map(|(_, v)| v).collect();
        for key in cached {
            let block = inner.blocks.remove(&key).expect("a cached block is known");
            self.device.backend().host_free(key as HostPtr)?;
            inner.stats.host_free_calls += 1;
            inner.stats.reserved_bytes -= block.size as u64;
        }
        Ok(())
    }

    pub fn stats(&self) -> HostStats {
        self.inner.lock().unwrap().stats
    }

    /// The gauges of `stats` recomputed from the blocks themselves (tests compare them).
    pub fn recount(&self) -> HostStats {
        let inner = self.inner.lock().unwrap();
        let mut s = inner.stats;
        s.allocated_bytes = 0;
        s.allocated_blocks = 0;
        s.reserved_bytes = 0;
        s.pending_blocks = 0;
        for b in inner.blocks.values() {
            s.reserved_bytes += b.size as u64;
            match b.state {
                State::Allocated => {
                    s.allocated_bytes += b.size as u64;
                    s.allocated_blocks += 1;
                }
                State::Pending => s.pending_blocks += 1,
                State::Cached => {}
            }
        }
        s
    }

    /// Live (handed-out) blocks as `(address, capacity)`.
    pub fn live_blocks(&self) -> Vec<(usize, usize)> {
        let inner = self.inner.lock().unwrap();
        let mut v: Vec<(usize, usize)> = inner
            .blocks
            .iter()
            .filter(|(_, b)| b.state == State::Allocated)
            .map(|(&p, b)| (p, b.size))
            .collect();
        v.sort_unstable();
        v
    }
}

impl Inner {
    fn process_events(&mut self) -> Result<()> {
        // Not only the oldest: copies on different streams finish out of order.
        let mut still = VecDeque::with_capacity(self.pending.len());
        while let Some(key) = self.pending.pop_front() {
            let block = self.blocks.get_mut(&key).expect("a pending block is known");
            let mut done = true;
            for e in &block.events {
                if !e.query()? {
                    done = false;
                    break;
                }
            }
            if done {
                block.state = State::Cached;
                let size = block.size;
                self.spare_events.append(&mut block.events);
                self.free.entry(size).or_default().push(key);
                self.stats.pending_blocks -= 1;
            } else {
                still.push_back(key);
            }
        }
        self.pending = still;
        Ok(())
    }
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        if let Err(e) = self.empty_cache() {
            eprintln!("warning: releasing pinned memory of {}: {e}", self.device);
        }
    }
}

fn unknown(ptr: HostPtr) -> Error {
    Error::InvalidArgument(format!(
        "{ptr:p} is not a live block of the pinned-memory allocator"
    ))
}

/// A block of pinned host memory; returns to its allocator's cache when dropped.
pub struct PinnedBuffer {
    allocator: Arc<HostAllocator>,
    ptr: HostPtr,
    len: usize,
    capacity: usize,
}

// SAFETY: the buffer owns its memory exclusively, like a `Box<[u8]>`.
unsafe impl Send for PinnedBuffer {}
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    pub fn as_ptr(&self) -> HostPtr {
        self.ptr
    }
    /// The bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The size class it was served from.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// The bytes. Reading them while a copy into them is queued gives stale data; wait
    /// for the copy's event first.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes of live memory owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// See `HostAllocator::record_stream`.
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.allocator.record_stream(self.ptr, stream)
    }
    pub fn allocator(&self) -> &Arc<HostAllocator> {
        &self.allocator
    }

    /// Enqueues a copy of the first `bytes` bytes to the device and records the stream
    /// on the block, so that dropping the buffer early cannot recycle it under the copy.
    pub fn copy_to_device_async(&self, dst: u64, bytes: usize, stream: &Stream) -> Result<()> {
        self.check_len(bytes)?;
        self.record_stream(stream)?;
        // SAFETY: the block stays allocated until the event recorded at free completes.
        unsafe {
            self.allocator
                .device
                .backend()
                .copy_htod_async(dst, self.ptr, bytes, stream)
        }
    }

    /// Enqueues a copy from the device into the first `bytes` bytes; see above.
    pub fn copy_from_device_async(
        &mut self,
        src: u64,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_len(bytes)?;
        self.record_stream(stream)?;
        // SAFETY: as above.
        unsafe {
            self.allocator
                .device
                .backend()
                .copy_dtoh_async(self.ptr, src, bytes, stream)
        }
    }

    fn check_len(&self, bytes: usize) -> Result<()> {
        if bytes > self.len {
            return Err(Error::InvalidArgument(format!(
                "a copy of {bytes} bytes does not fit a pinned buffer of {}",
                self.len
            )));
        }
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.allocator.free(self.ptr) {
            eprintln!("warning: freeing pinned {:p}: {e}", self.ptr);
        }
    }
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedBuffer({:p}, {} of {} bytes, for {})",
            self.ptr, self.len, self.capacity, self.allocator.device
        )
    }
}
