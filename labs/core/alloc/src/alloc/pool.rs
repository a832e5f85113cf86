//! The bookkeeping of memory: segments, an arena of block records linked to their
//! neighbours inside a segment, and the ordered set of free blocks that best fit
//! searches.

use std::collections::BTreeMap;

use super::category::Category;
use super::pages::Page;
use super::size::Pool;
use crate::backend::{DevicePtr, Stream};

pub(crate) const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    Free,
    Allocated,
    /// Freed by the program, but work on another stream may still use it.
    Pending,
    /// Freed, and kept whole for the next request of its size (see `parked.rs`):
    /// free memory that has not been merged with its neighbours yet. Snapshots
    /// report it as `Free`.
    Parked,
}

// ANCHOR: pool_key
/// Which free blocks a request may use: those of its own stream and pool (a block freed
/// on one stream is reused only by work queued behind it on that stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    /// The stream's index among the streams the allocator has seen (so that it is small
    /// whatever the driver's stream handles look like). A private pool's blocks on a
    /// stream have an index of their own, a lane (`mempool.rs`).
    pub stream: u32,
    pub pool: Pool,
}
// ANCHOR_END: pool_key

/// How many streams one allocator tells apart: the stream's index and the pool share
/// the key's top 16 bits.
pub const MAX_STREAMS: usize = 1 << 15;

/// An error once an allocator has seen [`MAX_STREAMS`] streams (`seen`), rather than
/// two streams sharing a pool.
pub(crate) fn check_stream_count(seen: usize) -> crate::error::Result<()> {
    if seen >= MAX_STREAMS {
        return Err(crate::error::Error::InvalidArgument(format!(
            "more than {MAX_STREAMS} streams allocate from one allocator; it tells at most \
             {MAX_STREAMS} streams apart"
        )));
    }
    Ok(())
}

impl PoolKey {
    /// The key as one small integer, stream first: the prefix of the free set's packed
    /// keys and of the parked table's. Below 2^16 (see [`FreeKey`]).
    #[inline]
    pub fn bits(self) -> u64 {
        ((self.stream as u64) << 1) | self.pool as u64
    }
}

/// A reserved range of device memory (a driver allocation, or the address range of an
/// expandable segment), tiled by blocks.
pub(crate) struct Segment {
    pub key: PoolKey,
    pub base: DevicePtr,
    pub size: u64,
    /// The stream's handle, as reported in snapshots and the history.
    pub stream: u64,
    pub expandable: bool,
    /// False once released; the slot waits for the next segment.
    pub alive: bool,
    /// The block at the segment's base, the head of its list of blocks.
    pub first: u32,
    /// The page map of an expandable segment (see `pages.rs`); empty when fixed.
    pub pages: Vec<Page>,
    pub mapped_pages: u64,
    /// The segment's number in the order segments were made (renumbered, order kept,
    /// when the numbers run out): its blocks' places in the free set.
    pub serial: u64,
    /// One past the highest page ever mapped (0 when none): no page at or beyond it
    /// has memory, so searches for mapped memory stop there instead of walking the
    /// rest of a range of the device's size.
    pub mapped_end: u32,
}

impl Segment {
    pub fn pool(&self) -> Pool {
        self.key.pool
    }
}

/// The pool's record of one block: a range of a segment, free or in use.
pub(crate) struct BlockRecord {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    /// The block's stream and pool (its segment's).
    pub key: PoolKey,
    pub segment: u32,
    pub prev: u32,
    pub next: u32,
    pub state: BlockState,
    /// Distinguishes the block in this slot from earlier ones, so that a stale handle
    /// is caught rather than freeing someone else's memory.
    pub generation: u32,
    /// Events still to complete before a pending block is free.
    pub pending_events: u32,
    /// The next block on the same parked list, while parked.
    pub parked_next: u32,
    /// While allocated: the allocator's count of allocations when it was handed out.
    pub serial: u64,
    /// Streams other than the allocation stream that used the block (`record_stream`).
    pub stream_uses: Vec<Stream>,
    /// While allocated: what the block holds (`category.rs`).
    pub category: Category,
}

/// Slots of blocks; a slot is reused after its block merges away, so steady-state
/// allocation does no heap allocation.
#[derive(Default)]
pub(crate) struct Blocks {
    slots: Vec<BlockRecord>,
    vacant: Vec<u32>,
}

impl Blocks {
    pub fn insert(
        &mut self,
        addr: u64,
        size: u64,
        key: PoolKey,
        segment: u32,
        prev: u32,
        next: u32,
    ) -> u32 {
        match self.vacant.pop() {
            Some(id) => {
                let b = &mut self.slots[id as usize];
                b.addr = addr;
                b.size = size;
                b.requested = 0;
                b.key = key;
                b.segment = segment;
                b.prev = prev;
                b.next = next;
                b.state = BlockState::Free;
                b.pending_events = 0;
                id
            }
            None => {
                self.slots.push(BlockRecord {
                    addr,
                    size,
                    requested: 0,
                    key,
                    segment,
                    prev,
                    next,
                    state: BlockState::Free,
                    generation: 0,
                    pending_events: 0,
                    parked_next: NONE,
                    serial: 0,
                    stream_uses: Vec::new(),
                    category: Category::Other,
                });
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub fn remove(&mut self, id: u32) {
        let b = &mut self.slots[id as usize];
        b.generation = b.generation.wrapping_add(1);
        b.stream_uses.clear();
        self.vacant.push(id);
    }

    pub fn get(&self, id: u32) -> Option<&BlockRecord> {
        self.slots.get(id as usize)
    }

    /// Every slot's record, vacant slots included (a vacant slot's block is `Free`
    /// or merged away: look at the state and the segment).
    pub fn records(&self) -> impl Iterator<Item = &BlockRecord> {
        self.slots.iter()
    }
}

impl std::ops::Index<u32> for Blocks {
    type Output = BlockRecord;
    #[inline]
    fn index(&self, id: u32) -> &BlockRecord {
        &self.slots[id as usize]
    }
}

impl std::ops::IndexMut<u32> for Blocks {
    #[inline]
    fn index_mut(&mut self, id: u32) -> &mut BlockRecord {
        &mut self.slots[id as usize]
    }
}

// ANCHOR: free_key
/// A free block's place in the search order: stream and pool first (blocks are reused
/// only by their own stream and pool), then size (best fit), then place: the oldest
/// segment first and, in it, the lowest offset, which packs live blocks together.
/// PyTorch breaks ties by device address; a place is the address a segment would have
/// if the driver handed out addresses in the order segments are made, as it does in a
/// fresh process and as the simulated GPU always does, so that the dry run, the
/// simulated GPU and the GPU choose the same block whatever addresses the driver picks.
/// Packed into one integer because comparing keys is most of the cost of a search:
/// sizes and places are multiples of 512, so 55 bits hold any 64-bit size or place,
/// and the pool key, below 2^16 (at most [`MAX_STREAMS`] streams, checked when a stream
/// is first seen), takes the top bits. No two free blocks share a place, so the key
/// names the block; its slot is the entry's value.
type FreeKey = u128;

/// Bits of a place for the offset in its segment: segments up to 512 GiB.
pub(crate) const OFFSET_BITS: u32 = 39;
/// Segment serials below this fit a place (`SERIAL_LIMIT << OFFSET_BITS` is 2^64).
pub(crate) const SERIAL_LIMIT: u64 = 1 << (64 - OFFSET_BITS);

/// The place of the byte at `offset` of the segment numbered `serial`.
#[inline]
pub(crate) fn place(serial: u64, offset: u64) -> u64 {
    (serial << OFFSET_BITS) | offset
}

/// The bits of a key's size and address fields: a 64-bit value shifted right by 9.
const FIELD: u32 = 64 - 9;

#[inline]
fn key(prefix: u64, size: u64, addr: u64) -> FreeKey {
    ((prefix as u128) << (2 * FIELD)) | (((size >> 9) as u128) << FIELD) | (addr >> 9) as u128
}

/// The size and address of a key.
#[inline]
fn size_addr(k: FreeKey) -> (u64, u64) {
    const MASK: u128 = (1 << FIELD) - 1;
    (
        (((k >> FIELD) & MASK) as u64) << 9,
        ((k & MASK) as u64) << 9,
    )
}
// ANCHOR_END: free_key

#[derive(Default)]
pub(crate) struct FreeSet(BTreeMap<FreeKey, u32>);

impl FreeSet {
    #[inline]
    pub fn insert(&mut self, pool: PoolKey, size: u64, place: u64, id: u32) {
        let fresh = self.0.insert(key(pool.bits(), size, place), id).is_none();
        debug_assert!(fresh, "free block listed twice");
    }
    #[inline]
    pub fn remove(&mut self, pool: PoolKey, size: u64, place: u64, id: u32) {
        let found = self.0.remove(&key(pool.bits(), size, place));
        debug_assert!(found == Some(id), "free block missing from the free set");
    }
    /// The smallest free block of `pool` holding at least `size` bytes, as
    /// (size, slot).
    #[inline]
    pub fn best_fit(&self, pool: PoolKey, size: u64) -> Option<(u64, u32)> {
        let from = key(pool.bits(), size, 0);
        let to = key(pool.bits() + 1, 0, 0);
        // An open range descends the tree once; a closed one would find both ends.
        self.0
            .range(from..)
            .next()
            .filter(|&(&k, _)| k < to)
            .map(|(&k, &id)| (size_addr(k).0, id))
    }
    /// The free blocks of `pool` holding at least `size` bytes, best fit first, as
    /// (size, place, slot).
    #[inline]
    pub fn fits(&self, pool: PoolKey, size: u64) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        let from = key(pool.bits(), size, 0);
        let to = key(pool.bits() + 1, 0, 0);
        // An open range descends the tree once; a closed one would find both ends.
        self.0
            .range(from..)
            .take_while(move |&(&k, _)| k < to)
            .map(|(&k, &id)| {
                let (size, addr) = size_addr(k);
                (size, addr, id)
            })
    }
    pub fn contains(&self, pool: PoolKey, size: u64, place: u64, id: u32) -> bool {
        self.0.get(&key(pool.bits(), size, place)) == Some(&id)
    }
    /// Every entry, as (pool bits, size, slot), emptying the set: for renumbering.
    pub fn drain(&mut self) -> Vec<(u64, u64, u32)> {
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|(k, id)| ((k >> (2 * FIELD)) as u64, size_addr(k).0, id))
            .collect()
    }
    /// Lists an entry drained by [`drain`](Self::drain) at its new place.
    pub fn restore(&mut self, pool_bits: u64, size: u64, place: u64, id: u32) {
        self.0.insert(key(pool_bits, size, place), id);
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Every entry, as (pool bits, size, slot): for the invariants.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        (self.0.iter()).map(|(&k, &id)| ((k >> (2 * FIELD)) as u64, size_addr(k).0, id))
    }
}
