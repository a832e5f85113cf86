//! Grades the workshop exercises (`src/exercises/`) against the real allocator: its
//! size functions, and what it does on the device under test when a script of
//! allocations and frees runs through it with fixed segments, as PyTorch's default.

use std::collections::BTreeSet;

use lab_02::exercises::{best_fit, new_segment_size, round_request, split, FreeBlock, Split};
use labs_core::alloc::{pool_of, round_size, segment_size, Allocator, BlockState, Config, Pool};
use labs_core::testing::test_device;
use labs_core::Device;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// PyTorch's native mode, on the device under test. Parking is off because PyTorch has
/// no parked blocks: a request of a size freed just before would get that block back
/// whole, whatever best fit says.
fn native_allocator(device: &Device, knobs: &str) -> Allocator {
    let mut conf = Config::parse(knobs).unwrap();
    conf.expandable_segments = false;
    conf.park_freed_blocks = false;
    Allocator::new(device.backend_arc(), conf).unwrap()
}

/// Request sizes from 1 byte to 1 GiB: every size class, its boundaries and their
/// neighbours, and pseudo-random sizes in between (a fixed seed, so failures repeat).
fn request_sizes() -> Vec<u64> {
    let mut sizes: Vec<u64> = (0..=2048).collect();
    for edge in [512, MIB, 2 * MIB, 10 * MIB, 20 * MIB, 64 * MIB, 1 << 30] {
        for offset in [-513i64, -512, -511, -1, 0, 1, 511, 512, 513] {
            sizes.extend(edge.checked_add_signed(offset));
        }
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let magnitude = 1 + x % 30; // 2 B .. 1 GiB
        sizes.push(1 + (x >> 8) % (1 << magnitude));
    }
    sizes
}

#[test]
fn round_request_matches_the_allocators_rounding() {
    for size in request_sizes() {
        assert_eq!(
            round_request(size),
            round_size(size, 0),
            "a request of {size} bytes"
        );
    }
}

#[test]
fn new_segment_size_matches_the_allocators_segments() {
    for size in request_sizes() {
        let rounded = round_size(size, 0);
        assert_eq!(
            new_segment_size(rounded),
            segment_size(rounded),
            "a request rounded to {rounded} bytes"
        );
    }
}

/// One request on an empty allocator: what it reserves is the new segment, and what
/// it allocates is the rounded size (these requests leave either no remainder or one
/// that the pool splits off, so the block is exactly the rounded size).
#[test]
fn a_first_request_reserves_and_allocates_what_the_exercise_says() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    for size in [
        1,
        511,
        513,
        4000,
        MIB - 1,
        MIB,
        MIB + 1,
        3 * MIB + 5,
        7 * MIB,
        10 * MIB - 1,
        10 * MIB,
        12 * MIB + 1,
        100 * MIB + 3,
    ] {
        let a = native_allocator(&device, "");
        let block = a.malloc(size as usize, &stream).unwrap();
        let rounded = round_request(size);
        assert_eq!(a.memory_allocated(), rounded, "a request of {size} bytes");
        assert_eq!(
            a.memory_reserved(),
            new_segment_size(rounded),
            "a request of {size} bytes"
        );
        a.free(block).unwrap();
    }
}

/// The allocator's free blocks in `pool`, as the exercises see them.
fn free_blocks(a: &Allocator, pool: Pool) -> BTreeSet<FreeBlock> {
    a.segments()
        .iter()
        .filter(|s| s.pool == pool)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Free)
        .map(|b| FreeBlock {
            size: b.size,
            addr: b.addr,
        })
        .collect()
}

/// The address of the block handed out last.
fn newest_address(a: &Allocator) -> u64 {
    a.live_blocks().last().expect("a block is allocated").addr
}

/// A step of a script: allocate this many bytes, or free the block that the n-th
/// allocation of the script handed out.
enum Step {
    Alloc(u64),
    Free(usize),
}
use Step::{Alloc, Free};

/// Runs `script` on a fresh native allocator; before each allocation, `check` gets
/// the allocator, the request's rounded size and pool, and the free blocks of that
/// pool as they were just before it, and runs after the allocation.
fn run_script(
    knobs: &str,
    script: &[Step],
    mut check: impl FnMut(&Allocator, u64, Pool, &BTreeSet<FreeBlock>),
) {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = native_allocator(&device, knobs);
    let mut handles = Vec::new();
    for step in script {
        match *step {
            Alloc(size) => {
                let rounded = round_size(size, 0);
                let pool = pool_of(rounded);
                let before = free_blocks(&a, pool);
                handles.push(Some(a.malloc(size as usize, &stream).unwrap()));
                check(&a, rounded, pool, &before);
            }
            Free(n) => a.free(handles[n].take().expect("freed once")).unwrap(),
        }
    }
    for h in handles.into_iter().flatten() {
        a.free(h).unwrap();
    }
    a.check_invariants().unwrap();
}

/// Small blocks of equal and different sizes, freed between live separators so that
/// they cannot merge: requests then have several candidates, ties among them, exact
/// fits, and at the end nothing that fits.
const SMALL_SCRIPT: &[Step] = &[
    Alloc(4 * KIB), // 0
    Alloc(512),
    Alloc(8 * KIB), // 2
    Alloc(512),
    Alloc(4 * KIB), // 4
    Alloc(512),
    Alloc(16 * KIB), // 6
    Alloc(512),
    Alloc(4 * KIB), // 8
    Alloc(512),
    Free(8),
    Free(4),
    Free(0),
    Free(6),
    Free(2),
    Alloc(3000),     // the lowest of three 4 KiB blocks, leaving 1 KiB
    Alloc(4 * KIB),  // the next 4 KiB block, exactly
    Alloc(6000),     // the 8 KiB block
    Alloc(1000),     // the 1 KiB remainder
    Alloc(20 * KIB), // nothing freed fits: the segment's tail
    Alloc(MIB),      // the rest of the tail, split again
    Alloc(MIB),      // nor does the tail any more: a new segment
    Alloc(MIB),      // the second segment's other half, exactly
];

/// Blocks of 1-10 MiB sharing 20 MiB segments, and large ones with their own.
const LARGE_SCRIPT: &[Step] = &[
    Alloc(6 * MIB), // 0
    Alloc(4 * MIB),
    Alloc(9 * MIB + 512 * KIB), // the 10 MiB tail: 512 KiB left, kept attached
    Free(0),
    Alloc(5 * MIB), // 3: the 6 MiB block, 1 MiB left, kept attached
    Free(3),
    Alloc(4 * MIB + 1000), // the same block again, split this time
    Alloc(3 * MIB),        // a second 20 MiB segment
    Alloc(33 * MIB),       // a 34 MiB segment, 1 MiB left, kept attached
    Alloc(40 * MIB),       // 7
    Free(7),
    Alloc(18 * MIB), // the 40 MiB segment (the second segment's 17 MiB is too small), split
];

/// With `max_split_size_mb:32`, oversize blocks are handed out whole.
const MAX_SPLIT_SCRIPT: &[Step] = &[
    Alloc(40 * MIB), // 0
    Free(0),
    Alloc(34 * MIB), // oversize, fits within 20 MiB: the whole 40 MiB block
    Alloc(6 * MIB),  // a normal request: a 20 MiB segment, split
    Alloc(32 * MIB + 512 * KIB), // oversize: a 34 MiB segment, 1.5 MiB left, not split
];

#[test]
fn best_fit_picks_the_block_the_allocator_hands_out() {
    let (mut reused, mut fresh) = (0, 0);
    for script in [SMALL_SCRIPT, LARGE_SCRIPT] {
        run_script("", script, |a, rounded, _pool, before| {
            let got = newest_address(a);
            match best_fit(before, rounded) {
                Some(b) => {
                    reused += 1;
                    assert_eq!(
                        got, b.addr,
                        "{rounded} B among {before:?}: the allocator took {got:#x}, not {b:?}"
                    );
                }
                None => {
                    fresh += 1;
                    assert!(
                        before
                            .iter()
                            .all(|b| !(b.addr..b.addr + b.size).contains(&got)),
                        "{rounded} B among {before:?}: the allocator reused a free block at \
                         {got:#x} where best_fit found none"
                    );
                }
            }
        });
    }
    // The scripts must exercise both answers, or the checks above prove little.
    assert!(reused >= 8 && fresh >= 4, "{reused} reused, {fresh} fresh");
}

/// The free block a request was served from, read off the allocator: the one in
/// `before` that holds the new block's address, else the new segment that starts there.
fn served_from(a: &Allocator, before: &BTreeSet<FreeBlock>, addr: u64) -> FreeBlock {
    if let Some(b) = before
        .iter()
        .find(|b| (b.addr..b.addr + b.size).contains(&addr))
    {
        return *b;
    }
    let seg = a
        .segments()
        .into_iter()
        .find(|s| s.base == addr)
        .expect("a block not taken from a free block starts a new segment");
    FreeBlock {
        size: seg.size,
        addr: seg.base,
    }
}

/// Checks `split` against each allocation of `script`; returns how many requests the
/// allocator split and how many it handed a whole block.
fn check_splits(knobs: &str, script: &[Step]) -> (usize, usize) {
    let (mut splits, mut whole) = (0, 0);
    let max_split_size = Config::parse(knobs).unwrap().max_split_size;
    run_script(knobs, script, |a, rounded, pool, before| {
        let addr = newest_address(a);
        let block = served_from(a, before, addr);
        let blocks: Vec<_> = a.segments().into_iter().flat_map(|s| s.blocks).collect();
        let handed_out = blocks.iter().find(|b| b.addr == addr).unwrap().size;
        let next = blocks.iter().find(|b| b.addr == addr + handed_out);
        let Split {
            handed_out: answer,
            remainder,
        } = split(block, rounded, pool, max_split_size);
        let context = format!("{rounded} B ({pool:?} pool) from {block:?}");
        assert_eq!(answer, handed_out, "bytes handed out for {context}");
        if handed_out < block.size {
            splits += 1;
            let rest = next.expect("a split block is followed by its remainder");
            assert_eq!(rest.state, BlockState::Free, "{context}");
            let kept = FreeBlock {
                size: rest.size,
                addr: rest.addr,
            };
            assert_eq!(remainder, Some(kept), "the remainder of {context}");
        } else {
            whole += 1;
            assert_eq!(remainder, None, "the remainder of {context}");
        }
    });
    (splits, whole)
}

#[test]
fn split_keeps_the_remainders_the_allocator_keeps() {
    let (small_splits, small_whole) = check_splits("", SMALL_SCRIPT);
    let (large_splits, large_whole) = check_splits("", LARGE_SCRIPT);
    // Both outcomes in both pools, or the rule is not really tested.
    assert!(small_splits >= 5 && small_whole >= 3);
    assert!(large_splits >= 4 && large_whole >= 3);
}

#[test]
fn split_hands_out_oversize_blocks_whole_with_max_split_size() {
    let (splits, whole) = check_splits("max_split_size_mb:32", MAX_SPLIT_SCRIPT);
    assert!(splits >= 1 && whole >= 3, "{splits} split, {whole} whole");
}
