//! Grades exercise 4 (`Segment::malloc` and `Segment::free` in `src/exercises/`): a
//! script worked by hand, then random requests and two real training traces, each
//! run through the exercise's segment and through the labs' allocator side by side.
//! With `expandable_segments:True` (PyTorch's mode, no page recycling) the allocator
//! keeps one segment per stream and pool and carves it by best fit, split and merge
//! and nothing else, so the two must hand out every block at the same place and grow
//! to the same size.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use lab_02::exercises::{FreeBlock, Segment};
use labs_core::alloc::replay::read_trace;
use labs_core::alloc::{pool_of, round_size, Allocation, Allocator, BlockState, Config, Pool};
use labs_core::snapshot::TraceAction;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The driver's mapping granularity, the unit in which an expandable segment grows.
const PAGE: u64 = 2 * MIB;

/// Checks that `s`'s fields agree: its blocks tile it from 0 with no gap or overlap,
/// no two free blocks touch, the free set holds exactly the free blocks, and the high
/// water mark is within the segment.
fn check(s: &Segment, context: &str) {
    let mut end = 0;
    let mut previous_free = false;
    let mut free = BTreeSet::new();
    for (addr, block) in s.blocks() {
        assert_eq!(
            addr, end,
            "{context}: a block at {addr} where one should start at {end}"
        );
        assert!(block.size > 0, "{context}: an empty block at {addr}");
        assert!(
            !(block.free && previous_free),
            "{context}: the free block at {addr} touches the free block before it (not merged)"
        );
        if block.free {
            free.insert(FreeBlock {
                size: block.size,
                addr,
            });
        }
        previous_free = block.free;
        end = addr + block.size;
    }
    assert_eq!(end, s.capacity(), "{context}: the blocks end at {end}");
    assert_eq!(
        s.free_blocks(),
        &free,
        "{context}: the free set is not the set of free blocks"
    );
    assert!(s.high_water() <= s.capacity(), "{context}");
}

/// The blocks of `s`, as (address, size, free).
fn layout(s: &Segment) -> Vec<(u64, u64, bool)> {
    s.blocks().map(|(a, b)| (a, b.size, b.free)).collect()
}

#[test]
fn segment_splits_and_merges_a_script_worked_by_hand() {
    let mut s = Segment::new(64 * KIB);
    check(&s, "a new segment");
    let a = s.malloc(4 * KIB).unwrap();
    let b = s.malloc(8 * KIB).unwrap();
    let c = s.malloc(4 * KIB).unwrap();
    let d = s.malloc(2 * KIB).unwrap();
    assert_eq!(
        (a, b, c, d),
        (0, 4 * KIB, 12 * KIB, 16 * KIB),
        "carved in order"
    );
    assert_eq!(s.high_water(), 18 * KIB);
    check(&s, "after four requests");

    assert!(s.free(a), "freeing the block at 0");
    assert!(!s.free(a), "a second free of the same block is refused");
    assert!(!s.free(5 * KIB), "an address inside a block is not a block");
    assert!(!s.free(40 * KIB), "nor is one inside a free block");
    assert!(s.free(c), "freeing the block at 12 KiB");
    check(&s, "after two frees between live blocks");
    assert_eq!(
        layout(&s),
        [
            (0, 4 * KIB, true),
            (4 * KIB, 8 * KIB, false),
            (12 * KIB, 4 * KIB, true),
            (16 * KIB, 2 * KIB, false),
            (18 * KIB, 46 * KIB, true),
        ],
        "neither freed block has a free neighbour"
    );

    // Two 4 KiB blocks fit 3 KiB exactly as well: the lower one, split.
    assert_eq!(s.malloc(3 * KIB), Some(0));
    // 4 KiB: the block at 12 KiB fits exactly, where the one at 3 KiB is too small.
    assert_eq!(s.malloc(4 * KIB), Some(12 * KIB));
    assert_eq!(s.high_water(), 18 * KIB, "nothing new was carved");
    check(&s, "after two reuses");

    assert!(s.free(d), "d merges with the free tail after it");
    assert!(s.free(b), "b merges with the 1 KiB left before it");
    check(&s, "after merges on one side");
    assert_eq!(
        layout(&s),
        [
            (0, 3 * KIB, false),
            (3 * KIB, 9 * KIB, true),
            (12 * KIB, 4 * KIB, false),
            (16 * KIB, 48 * KIB, true),
        ]
    );
    assert!(s.free(12 * KIB), "a block between two free ones joins both");
    assert_eq!(layout(&s), [(0, 3 * KIB, false), (3 * KIB, 61 * KIB, true)]);
    assert!(s.free(0));
    assert_eq!(
        layout(&s),
        [(0, 64 * KIB, true)],
        "a segment all free is one block"
    );
    check(&s, "after every free");

    assert_eq!(s.malloc(64 * KIB), Some(0), "the whole segment");
    assert_eq!(s.malloc(512), None, "a full segment has nothing to give");
    assert_eq!(s.high_water(), 64 * KIB);
    assert!(s.free(0));
    assert_eq!(s.malloc(64 * KIB + 512), None, "larger than the segment");
    assert_eq!(
        layout(&s),
        [(0, 64 * KIB, true)],
        "a refused request changes nothing"
    );
    check(&s, "at the end");
}

#[test]
fn segment_takes_the_smallest_block_that_fits_not_the_first() {
    let mut s = Segment::new(64 * KIB);
    let blocks: Vec<u64> = [8 * KIB, KIB, 2 * KIB, KIB]
        .iter()
        .map(|&size| s.malloc(size).unwrap())
        .collect();
    assert_eq!(blocks, [0, 8 * KIB, 9 * KIB, 11 * KIB]);
    assert!(s.free(0) && s.free(9 * KIB));
    // Free: 8 KiB at 0, 2 KiB at 9 KiB, 52 KiB at 12 KiB. The first that fits is at
    // 0; the best fit is the 2 KiB block, which leaves the 8 KiB one whole.
    assert_eq!(s.malloc(2 * KIB), Some(9 * KIB));
    assert_eq!(s.malloc(6 * KIB), Some(0));
    assert_eq!(s.malloc(12 * KIB), Some(12 * KIB));
    check(&s, "after three best fits");
    assert_eq!(
        layout(&s),
        [
            (0, 6 * KIB, false),
            (6 * KIB, 2 * KIB, true),
            (8 * KIB, KIB, false),
            (9 * KIB, 2 * KIB, false),
            (11 * KIB, KIB, false),
            (12 * KIB, 12 * KIB, false),
            (24 * KIB, 40 * KIB, true),
        ]
    );
}

/// PyTorch's expandable segments in the labs' allocator, on a fresh simulated GPU of
/// `capacity` bytes. Parking is off: it changes how fast a block is found, never
/// which, but the comparison is of the mechanism alone.
fn expandable_allocator(capacity: u64) -> Allocator {
    let mut conf = Config::parse("expandable_segments:True").unwrap();
    conf.recycle_idle_pages = false;
    conf.park_freed_blocks = false;
    Allocator::new(labs_core::device::sim_backend(capacity), conf).unwrap()
}

/// One exercise segment per pool beside the allocator's, with the base address of the
/// allocator's segment, learnt from its first block.
#[derive(Default)]
struct Twin {
    segments: HashMap<Pool, (u64, Segment)>,
}

impl Twin {
    /// Allocates `size` bytes on both sides and checks that they agree on the place.
    fn malloc(&mut self, a: &Allocator, size: u64, context: &str) -> (Allocation, Pool, u64) {
        let rounded = round_size(size, 0);
        let pool = pool_of(rounded);
        let block = a.malloc_on(size, 0).unwrap();
        let (base, segment) = self.segments.entry(pool).or_insert_with(|| {
            let seg = (a.segments().into_iter())
                .find(|s| s.pool == pool)
                .expect("the allocator has a segment for the pool it used");
            (seg.base, Segment::new(seg.size))
        });
        let offset = block.ptr() - *base;
        assert_eq!(
            segment.malloc(rounded),
            Some(offset),
            "{context}: {rounded} B in the {pool:?} pool: the allocator put it at offset \
             {offset:#x} of its segment"
        );
        (block, pool, offset)
    }

    fn free(&mut self, a: &Allocator, block: Allocation, pool: Pool, offset: u64) {
        a.free(block).unwrap();
        let segment = &mut self.segments.get_mut(&pool).unwrap().1;
        assert!(segment.free(offset), "freeing the block at {offset:#x}");
    }

    /// What the exercise's segments have grown to, in whole pages: what the allocator
    /// has mapped.
    fn reserved(&self) -> u64 {
        (self.segments.values())
            .map(|(_, s)| s.high_water().div_ceil(PAGE) * PAGE)
            .sum()
    }

    /// Checks each segment's fields, and that its blocks are the allocator's.
    fn check_against(&self, a: &Allocator, context: &str) {
        for seg in a.segments() {
            let (base, segment) = &self.segments[&seg.pool];
            assert_eq!(seg.base, *base, "{context}: one segment per pool");
            check(segment, context);
            let theirs: Vec<_> = (seg.blocks.iter())
                .map(|b| (b.addr - base, b.size, b.state == BlockState::Free))
                .collect();
            assert_eq!(
                layout(segment),
                theirs,
                "{context}: the {:?} pool's blocks",
                seg.pool
            );
        }
    }
}

#[test]
fn segment_carves_random_requests_as_the_allocator_does() {
    let a = expandable_allocator(8 << 30);
    let mut twin = Twin::default();
    let mut live: Vec<(Allocation, Pool, u64)> = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let (mut frees, mut reused) = (0, 0);
    for step in 0..3000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let context = format!("step {step}");
        // Frees and allocations in about equal numbers, so that the segments fill
        // with holes of every size; no more than 300 blocks live.
        if !live.is_empty() && (x.is_multiple_of(2) || live.len() >= 300) {
            let (block, pool, offset) = live.swap_remove((x >> 8) as usize % live.len());
            twin.free(&a, block, pool, offset);
            frees += 1;
        } else {
            // A few sizes recur, as a training step's do; the rest are anything up
            // to 4 MiB in either pool.
            let size = match (x >> 8) % 4 {
                0 => [512, 4 * KIB, 96 * KIB, 3 * MIB][(x >> 16) as usize % 4],
                _ => 1 + (x >> 20) % (4 * MIB),
            };
            let high = twin.reserved();
            let entry = twin.malloc(&a, size, &context);
            if twin.reserved() == high {
                reused += 1;
            }
            live.push(entry);
        }
        assert_eq!(
            a.stats().reserved.current,
            twin.reserved(),
            "{context}: memory mapped against the exercise's high water marks"
        );
        if step.is_multiple_of(50) {
            twin.check_against(&a, &context);
        }
    }
    for (block, pool, offset) in live {
        twin.free(&a, block, pool, offset);
    }
    twin.check_against(&a, "at the end");
    assert!(
        frees > 1000 && reused > 500,
        "{frees} frees, {reused} reuses"
    );
}

/// Replays a shared trace through the allocator and the exercise's segments, as
/// `lab-02 replay --conf expandable_segments:True` replays it.
fn replay_both(name: &str) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "../../data/traces"]
        .iter()
        .collect::<PathBuf>()
        .join(format!("{name}.trace.csv.gz"));
    let trace = read_trace(&path).unwrap();
    // The simulated GPU of `lab-02 replay`: the size of the GPU the traces came from.
    let a = expandable_allocator(80 << 30);
    let mut twin = Twin::default();
    let mut live: HashMap<u64, (Allocation, Pool, u64)> = HashMap::new();
    let mut ops = 0u64;
    for e in &trace.events {
        match e.action {
            TraceAction::Alloc => {
                let context = format!("{name}, line {}", e.line);
                let entry = twin.malloc(&a, e.size, &context);
                assert!(live.insert(e.addr, entry).is_none(), "{context}");
            }
            TraceAction::FreeRequested => {
                let (block, pool, offset) = live.remove(&e.addr).unwrap();
                twin.free(&a, block, pool, offset);
            }
            _ => continue,
        }
        ops += 1;
        if ops.is_multiple_of(2000) {
            twin.check_against(&a, &format!("{name}, line {}", e.line));
        }
    }
    twin.check_against(&a, &format!("{name}, at its end"));
    assert_eq!(
        a.stats().reserved.peak,
        twin.reserved(),
        "{name}: peak reserved against the exercise's high water marks"
    );
    assert!(ops > 10_000, "{name}: {ops} operations");
}

#[test]
fn segment_replays_the_accumulation_trace_as_the_allocator_does() {
    replay_both("seed_transformer_accum4x16");
}

#[test]
fn segment_replays_the_variable_length_gpt2_trace_as_the_allocator_does() {
    replay_both("gpt2_varlen");
}
