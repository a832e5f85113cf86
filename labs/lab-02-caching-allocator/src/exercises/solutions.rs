//! Reference solutions to the exercises in `starter.rs`.

use std::collections::BTreeSet;

use labs_core::alloc::Pool;

use super::{FreeBlock, Split};

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
