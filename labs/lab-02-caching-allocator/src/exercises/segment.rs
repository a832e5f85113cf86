//! The segment of exercise 4, shared by the starter code and the solutions: its data
//! and the methods that only read it. `malloc` and `free`, the exercise, are in
//! `starter.rs` (and `solutions.rs`).

use std::collections::{BTreeMap, BTreeSet};

use super::FreeBlock;

// ANCHOR: segment
/// One segment of `capacity` bytes, cut into blocks that tile it from address 0: every
/// byte belongs to exactly one block, free or allocated. A new segment is one free
/// block.
#[derive(Debug, Clone)]
pub struct Segment {
    pub(super) capacity: u64,
    /// Every block, free or allocated, by its address.
    pub(super) blocks: BTreeMap<u64, Block>,
    /// The free blocks, the same ones as the free entries of `blocks`, ordered by
    /// size and then address: the order of exercise 2's search.
    pub(super) free: BTreeSet<FreeBlock>,
    /// The end of the highest block handed out so far. On an expandable segment this
    /// is how far the segment has grown: what it has had to map.
    pub(super) high_water: u64,
}

/// A block of a [`Segment`]: `size` bytes, free or handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    pub free: bool,
}

impl Segment {
    /// A segment of `capacity` bytes (a positive multiple of 512), all of it free.
    pub fn new(capacity: u64) -> Segment {
        assert!(
            capacity > 0 && capacity.is_multiple_of(512),
            "a segment of {capacity} bytes: its size is a positive multiple of 512"
        );
        let whole = FreeBlock {
            size: capacity,
            addr: 0,
        };
        Segment {
            capacity,
            blocks: BTreeMap::from([(
                0,
                Block {
                    size: capacity,
                    free: true,
                },
            )]),
            free: BTreeSet::from([whole]),
            high_water: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Every block, in address order, with its address.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.blocks.iter().map(|(&addr, &block)| (addr, block))
    }

    /// The free set, in the order a best-fit search reads it.
    pub fn free_blocks(&self) -> &BTreeSet<FreeBlock> {
        &self.free
    }

    /// The end of the highest block handed out so far (0 before the first).
    pub fn high_water(&self) -> u64 {
        self.high_water
    }
}
// ANCHOR_END: segment
