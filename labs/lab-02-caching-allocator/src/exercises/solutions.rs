//! Reference solutions to the exercises in `starter.rs`.

use std::collections::BTreeSet;

use labs_core::alloc::Pool;

use super::{Block, FreeBlock, Segment, Split};

const MIN_BLOCK: u64 = 512;
const MIB: u64 = 1 << 20;

pub fn round_request(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

pub fn new_segment_size(rounded: u64) -> u64 {
    if rounded <= MIB {
        2 * MIB
    } else if rounded < 10 * MIB {
        20 * MIB
    } else {
        rounded.div_ceil(2 * MIB) * 2 * MIB
    }
}

pub fn best_fit(free: &BTreeSet<FreeBlock>, rounded: u64) -> Option<FreeBlock> {
    // The first block at or above (rounded, address 0): the smallest that fits, and
    // the lowest address among blocks of that size.
    free.range(
        FreeBlock {
            size: rounded,
            addr: 0,
        }..,
    )
    .next()
    .copied()
}

pub fn split(block: FreeBlock, rounded: u64, pool: Pool, max_split_size: Option<u64>) -> Split {
    let remaining = block.size - rounded;
    let keep = match pool {
        Pool::Small => remaining >= MIN_BLOCK,
        Pool::Large => remaining > MIB && max_split_size.is_none_or(|m| rounded < m),
    };
    if keep {
        Split {
            handed_out: rounded,
            remainder: Some(FreeBlock {
                size: remaining,
                addr: block.addr + rounded,
            }),
        }
    } else {
        Split {
            handed_out: block.size,
            remainder: None,
        }
    }
}

impl Segment {
    pub fn malloc(&mut self, rounded: u64) -> Option<u64> {
        assert!(
            rounded > 0 && rounded.is_multiple_of(MIN_BLOCK),
            "a request of {rounded} bytes: sizes here are rounded, positive multiples of 512"
        );
        let found = best_fit(&self.free, rounded)?;
        self.free.remove(&found);
        let rest = found.size - rounded;
        let handed_out = if rest >= MIN_BLOCK {
            let tail = FreeBlock {
                size: rest,
                addr: found.addr + rounded,
            };
            self.free.insert(tail);
            let free = Block {
                size: rest,
                free: true,
            };
            self.blocks.insert(tail.addr, free);
            rounded
        } else {
            found.size
        };
        let block = Block {
            size: handed_out,
            free: false,
        };
        self.blocks.insert(found.addr, block);
        self.high_water = self.high_water.max(found.addr + handed_out);
        Some(found.addr)
    }

    pub fn free(&mut self, addr: u64) -> bool {
        let (mut start, mut size) = match self.blocks.get(&addr) {
            Some(b) if !b.free => (addr, b.size),
            _ => return false,
        };
        // The block after it joins it, if free.
        let after = addr + size;
        if let Some(next) = self.blocks.get(&after).filter(|b| b.free).copied() {
            self.take_free(after, next.size);
            size += next.size;
        }
        // And it joins the block before it, if that one is free.
        let previous = self.blocks.range(..addr).next_back();
        if let Some((&before, &prev)) = previous.filter(|(_, b)| b.free) {
            self.take_free(before, prev.size);
            self.blocks.remove(&addr);
            (start, size) = (before, size + prev.size);
        }
        self.blocks.insert(start, Block { size, free: true });
        self.free.insert(FreeBlock { size, addr: start });
        true
    }

    /// Takes the free block at `addr` out of both `blocks` and the free set.
    fn take_free(&mut self, addr: u64, size: u64) {
        self.free.remove(&FreeBlock { size, addr });
        self.blocks.remove(&addr);
    }
}
