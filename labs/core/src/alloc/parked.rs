//! Parked blocks: freed blocks kept whole, for the next request of the same size on the
//! same stream.
//!
//! A program that frees a tensor usually asks for one of the same size soon after (the
//! next iteration's activation, the next step's gradient). Putting the block back into
//! the free set and merging it with its neighbours, then splitting it off again, costs
//! four updates of an ordered set. Parking it costs a push onto a list, and the next
//! request of that size a pop.
//!
//! Parking must not change what best fit sees: any request that misses the parked lists
//! first returns every parked block to the free set (merging it as a free would have),
//! so searches and new segments always see the same free memory as without parking.
//!
//! The lists live in a small direct-mapped table indexed by a hash of (stream pool,
//! size). A block whose slot is taken by another size is not parked but freed the usual
//! way, so the table never grows and needs no allocation.

use super::pool::{Blocks, NONE};

/// Slots in the table. Enough for the distinct sizes of one training step's
/// short-lived tensors; a collision only means a block is freed the usual way.
const SLOTS: usize = 64;

#[derive(Clone, Copy)]
struct Slot {
    /// The (stream pool, size) this slot's list holds, 0 when it has never held one.
    key: u64,
    /// The most recently parked block, linked to the others through `parked_next`.
    head: u32,
    /// Listed in `used`.
    listed: bool,
}

pub(crate) struct Parked {
    slots: Box<[Slot; SLOTS]>,
    /// Slots that held a list since the last drain (each once), so that returning
    /// everything is quick.
    used: Vec<u8>,
    /// Blocks parked now.
    count: usize,
}

impl Default for Parked {
    fn default() -> Self {
        Parked {
            slots: Box::new(
                [Slot {
                    key: 0,
                    head: NONE,
                    listed: false,
                }; SLOTS],
            ),
            used: Vec::with_capacity(SLOTS),
            count: 0,
        }
    }
}

/// One integer for (stream pool, size): sizes are multiples of 512 below 2^49, stream
/// pools below 2^16 (see `pool::key`), so neither part overlaps the other; never 0.
#[inline]
fn key(stream_pool: u64, size: u64) -> u64 {
    (stream_pool << 48) | (size >> 9)
}

#[inline]
fn slot_of(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros())) as usize
}

impl Parked {
    /// Parks block `id` for requests of `size` bytes on `stream_pool`; false (nothing
    /// done) when its slot holds another size.
    #[inline]
    pub fn park(&mut self, blocks: &mut Blocks, stream_pool: u64, size: u64, id: u32) -> bool {
        let k = key(stream_pool, size);
        let i = slot_of(k);
        let slot = &mut self.slots[i];
        if slot.key != k {
            if slot.head != NONE {
                return false;
            }
            slot.key = k;
        }
        if !slot.listed {
            slot.listed = true;
            self.used.push(i as u8);
        }
        blocks[id].parked_next = slot.head;
        slot.head = id;
        self.count += 1;
        true
    }

    /// The block parked last for requests of `size` bytes on `stream_pool`, taken off
    /// its list.
    #[inline]
    pub fn take(&mut self, blocks: &Blocks, stream_pool: u64, size: u64) -> Option<u32> {
        let k = key(stream_pool, size);
        let slot = &mut self.slots[slot_of(k)];
        if slot.key != k || slot.head == NONE {
            return None;
        }
        let id = slot.head;
        slot.head = blocks[id].parked_next;
        self.count -= 1;
        Some(id)
    }

    /// Takes every parked block off its list, appending them to `out`.
    pub fn drain_into(&mut self, blocks: &Blocks, out: &mut Vec<u32>) {
        for i in self.used.drain(..) {
            let slot = &mut self.slots[i as usize];
            let mut id = slot.head;
            while id != NONE {
                out.push(id);
                id = blocks[id].parked_next;
            }
            slot.head = NONE;
            slot.listed = false;
        }
        self.count = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// Every parked block with the (stream pool, size) it is parked for, for checks.
    pub fn entries(&self, blocks: &Blocks) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for slot in self.slots.iter() {
            let mut id = slot.head;
            while id != NONE {
                out.push((id, slot.key));
                id = blocks[id].parked_next;
            }
        }
        out
    }

    /// The key a block parked for `size` bytes on `stream_pool` is listed under.
    pub fn key_of(stream_pool: u64, size: u64) -> u64 {
        key(stream_pool, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_block_comes_back_for_its_size_only() {
        let mut blocks = Blocks::default();
        let a = blocks.insert(0, 512, 0, 0, NONE, NONE);
        let b = blocks.insert(512, 512, 0, 0, NONE, NONE);
        let mut p = Parked::default();
        assert!(p.park(&mut blocks, 0, 512, a));
        assert!(p.park(&mut blocks, 0, 512, b));
        assert_eq!(p.len(), 2);
        assert_eq!(p.take(&blocks, 0, 1024), None);
        assert_eq!(p.take(&blocks, 2, 512), None, "another stream's pool");
        assert_eq!(p.take(&blocks, 0, 512), Some(b), "last parked first");
        let mut out = Vec::new();
        p.drain_into(&blocks, &mut out);
        assert_eq!(out, vec![a]);
        assert!(p.is_empty());
        assert_eq!(p.take(&blocks, 0, 512), None);
    }

    #[test]
    fn a_taken_slot_refuses_other_sizes_until_it_empties() {
        let mut blocks = Blocks::default();
        let a = blocks.insert(0, 512, 0, 0, NONE, NONE);
        let b = blocks.insert(512, 512, 0, 0, NONE, NONE);
        let mut p = Parked::default();
        assert!(p.park(&mut blocks, 0, 512, a));
        // Find a size that lands in the same slot.
        let size = (2..)
            .map(|n| n * 512)
            .find(|&s| slot_of(key(0, s)) == slot_of(key(0, 512)))
            .unwrap();
        assert!(!p.park(&mut blocks, 0, size, b));
        assert_eq!(p.take(&blocks, 0, 512), Some(a));
        assert!(p.park(&mut blocks, 0, size, b), "the slot is free again");
        assert_eq!(p.take(&blocks, 0, size), Some(b));
    }
}
