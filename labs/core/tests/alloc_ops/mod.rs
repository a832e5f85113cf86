//! Random operations on one caching allocator, with every check after each of them: the
//! property tests (`alloc.rs`), the addresses test and the long campaign
//! (`alloc_campaign.rs`) drive allocators through here.
#![allow(dead_code)]

use std::sync::Arc;

use labs_core::alloc::{Allocation, Allocator, BlockState, Category, Config, Pool};
use labs_core::backend::Backend;
use labs_core::Stream;

/// Operations per configuration of a campaign: `var`'s number (1 to 2^40), else
/// `default`; anything else in `var` stops the test with a one-line message.
pub fn ops_from_env(var: &str, default: u64) -> u64 {
    const MAX_OPS: u64 = 1 << 40;
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u64>() {
            Ok(n) if (1..=MAX_OPS).contains(&n) => n,
            _ => panic!("{var}={v}: not a number of operations from 1 to 2^40"),
        },
        _ => default,
    }
}

/// Streams an allocator is driven on: the default one and two more.
pub const STREAMS: usize = 3;

#[derive(Debug, Clone)]
pub enum Op {
    Alloc {
        size: u64,
        stream: usize,
    },
    Free(usize),
    RecordStream {
        block: usize,
        stream: usize,
    },
    EmptyCache,
    /// Counts a live block under another category.
    Categorise {
        block: usize,
        category: usize,
    },
}

/// Sizes that recur, as a training loop's do: freed small blocks are parked for exactly
/// these.
pub const RECURRING: [u64; 6] = [512, 3000, 65536, 1 << 20, 4 << 20, 20 << 20];

/// The ranges of sizes requested, beside [`RECURRING`]: tiny, small, large, huge.
pub const SIZE_RANGES: [(u64, u64); 4] = [
    (1, 4096),
    (4096, 1 << 20),
    (1 << 20, 12 << 20),
    (12 << 20, 40 << 20),
];

/// A small deterministic generator (SplitMix64): the same seed gives the same run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
    pub fn index(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One operation, with the weights of the property tests' strategy: 6 allocations, 4
/// frees, and one each of the others, in 13.
pub fn random_op(rng: &mut Rng) -> Op {
    match rng.index(13) {
        0..=5 => {
            let size = match rng.index(5) {
                0 => RECURRING[rng.index(RECURRING.len())],
                i => {
                    let (lo, hi) = SIZE_RANGES[i - 1];
                    rng.range(lo, hi)
                }
            };
            Op::Alloc {
                size,
                stream: rng.index(STREAMS),
            }
        }
        6..=9 => Op::Free(rng.index(64)),
        10 => Op::RecordStream {
            block: rng.index(64),
            stream: rng.index(STREAMS),
        },
        11 => Op::EmptyCache,
        _ => Op::Categorise {
            block: rng.index(64),
            category: rng.index(Category::ALL.len()),
        },
    }
}

/// An allocator under test, its streams and the blocks it has handed out.
pub struct Run {
    pub allocator: Arc<Allocator>,
    pub streams: Vec<Stream>,
    pub live: Vec<Allocation>,
    /// With a limit, allocations may fail: the failure paths (waiting for events,
    /// releasing the cache, undoing a half-mapped block) must leave everything
    /// consistent.
    pub limited: bool,
    /// The largest number of bytes allocated at once.
    pub peak: u64,
    pub ooms: u64,
}

impl Run {
    /// An allocator of configuration `conf` on `backend`, with a limit of about `limit`
    /// bytes when given (whatever the device's real size, so that out-of-memory cases
    /// behave the same on a 16 GiB simulator and an 80 GB GPU).
    pub fn new(backend: Arc<dyn Backend>, conf: &str, limit: Option<u64>) -> Run {
        let streams = (0..STREAMS)
            .map(|i| match i {
                0 => backend.default_stream().unwrap(),
                _ => backend.new_stream(0).unwrap(),
            })
            .collect();
        Run::sharing(backend, conf, limit, streams)
    }

    /// As [`Run::new`], on the given streams.
    pub fn sharing(
        backend: Arc<dyn Backend>,
        conf: &str,
        limit: Option<u64>,
        streams: Vec<Stream>,
    ) -> Run {
        let total = backend.mem_info().unwrap().total;
        let a = Allocator::new(backend, Config::parse(conf).unwrap()).unwrap();
        if let Some(bytes) = limit {
            a.set_memory_fraction(bytes as f64 / total as f64).unwrap();
        }
        Run::on(Arc::new(a), streams, limit.is_some())
    }

    /// Another driver of the same allocator (a thread's), with no blocks of its own yet.
    pub fn on(allocator: Arc<Allocator>, streams: Vec<Stream>, limited: bool) -> Run {
        Run {
            allocator,
            streams,
            live: Vec::new(),
            limited,
            peak: 0,
            ooms: 0,
        }
    }

    /// Applies `op`.
    pub fn apply(&mut self, op: &Op) {
        let a = &self.allocator;
        let live = &mut self.live;
        match *op {
            Op::Alloc { size, stream } => match a.malloc(size as usize, &self.streams[stream]) {
                Ok(b) => {
                    assert!(b.size() >= size && b.size() & 511 == 0, "{op:?}: {b:?}");
                    live.push(b);
                }
                Err(e) if self.limited && e.is_out_of_memory() => self.ooms += 1,
                Err(e) => panic!("{op:?}: {e}"),
            },
            Op::Free(i) if !live.is_empty() => {
                let b = live.swap_remove(i % live.len());
                a.free(b).unwrap();
            }
            Op::RecordStream { block, stream } if !live.is_empty() => {
                let b = live[block % live.len()];
                a.record_stream(&b, &self.streams[stream]).unwrap();
            }
            Op::EmptyCache => {
                a.empty_cache().unwrap();
            }
            Op::Categorise { block, category } if !live.is_empty() => {
                let b = live[block % live.len()];
                let c = Category::ALL[category];
                a.set_category(&b, c).unwrap();
                assert_eq!(a.category(&b).unwrap(), c);
            }
            _ => {}
        }
    }

    /// The checks after an operation when this run alone uses the allocator: the
    /// invariants (the parked blocks too, and every `current` statistic recounted), no
    /// overlap, the bytes allocated those of the live blocks.
    pub fn check(&mut self, after: &Op) {
        self.allocator
            .check_invariants()
            .unwrap_or_else(|e| panic!("after {after:?}: {e}"));
        assert_no_overlap(&self.live);
        let allocated = self.allocator.memory_allocated();
        assert_eq!(
            allocated,
            self.live.iter().map(|b| b.size()).sum::<u64>(),
            "after {after:?}"
        );
        self.peak = self.peak.max(allocated);
    }

    /// Frees every live block, then empties the cache: nothing may stay reserved.
    pub fn finish(&mut self) {
        for b in self.live.drain(..) {
            self.allocator.free(b).unwrap();
        }
        self.allocator.empty_cache().unwrap();
        self.allocator.check_invariants().unwrap();
        assert_eq!(self.allocator.stats().allocated.current, 0);
        assert_eq!(
            self.allocator.stats().reserved.current,
            0,
            "empty_cache with nothing live returns everything"
        );
    }

    /// The statistics against the snapshot, and the bytes requested against the live
    /// blocks'. Reading the statistics merges parked blocks, so only now and then: most
    /// requests of a recurring size must find its parked block.
    pub fn check_stats(&self) {
        assert_stats_match_snapshot(&self.allocator);
        assert_eq!(
            self.allocator.stats().requested.current,
            self.live.iter().map(|b| b.requested()).sum::<u64>()
        );
    }
}

pub fn assert_no_overlap(blocks: &[Allocation]) {
    let mut spans: Vec<(u64, u64)> = blocks
        .iter()
        .map(|b| (b.ptr(), b.ptr() + b.size()))
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "live blocks overlap: {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
}

/// Checks that each pool's statistics (`memory_stats`, PyTorch's keys) match what
/// that `snapshot()` reports, pool by pool, and checks the running totals.
pub fn assert_stats_match_snapshot(a: &Allocator) {
    let stats = a.memory_stats();
    let snapshot = a.segments();
    for (pool, key) in [(Pool::Small, "small_pool"), (Pool::Large, "large_pool")] {
        let segs: Vec<_> = snapshot.iter().filter(|s| s.pool == pool).collect();
        let blocks = || {
            segs.iter()
                .flat_map(|s| s.blocks.iter().map(|b| (s.blocks.len(), b)))
        };
        let in_state = |state| blocks().filter(move |(_, b)| b.state == state);
        let active = || blocks().filter(|(_, b)| b.state != BlockState::Free);
        // PyTorch leaves expandable segments out of `inactive_split`.
        let split_free = || {
            segs.iter()
                .filter(|s| !s.expandable && s.blocks.len() > 1)
                .flat_map(|s| s.blocks.iter())
                .filter(|b| b.state == BlockState::Free)
        };
        let expected = [
            (
                "allocated_bytes",
                in_state(BlockState::Allocated)
                    .map(|(_, b)| b.size)
                    .sum::<u64>(),
            ),
            (
                "requested_bytes",
                in_state(BlockState::Allocated)
                    .map(|(_, b)| b.requested)
                    .sum(),
            ),
            ("allocation", in_state(BlockState::Allocated).count() as u64),
            ("reserved_bytes", segs.iter().map(|s| s.mapped()).sum()),
            ("segment", segs.len() as u64),
            ("active", active().count() as u64),
            ("active_bytes", active().map(|(_, b)| b.size).sum()),
            ("inactive_split", split_free().count() as u64),
            ("inactive_split_bytes", split_free().map(|b| b.size).sum()),
        ];
        for (name, want) in expected {
            assert_eq!(
                stats[&format!("{name}.{key}.current")],
                want,
                "{name}.{key}"
            );
        }
    }
    for (k, &v) in &stats {
        if let Some(stem) = k.strip_suffix(".current") {
            let total = |f: &str| stats[&format!("{stem}.{f}")];
            assert_eq!(
                total("allocated") - total("freed"),
                v,
                "{stem}: allocated - freed"
            );
            assert!(total("peak") >= v, "{stem}: peak below current");
        }
        if let Some(stem) = k.strip_suffix(".all.current") {
            let pool = |p: &str| stats[&format!("{stem}.{p}.current")];
            assert_eq!(pool("small_pool") + pool("large_pool"), v, "{stem}: pools");
        }
    }
}

/// Runs `fuzz_cases(default)` cases of `strategy` through `test`, drawn from
/// `fuzz_seed(name)` (fixed in CI; `LABS_FUZZ_SEED=random` prints the seed it drew), with
/// proptest's shrinking and its record of past failures beside `source_file`; says how
/// many cases ran, from which seed.
pub fn property<S: proptest::strategy::Strategy>(
    name: &str,
    source_file: &'static str,
    default: u32,
    strategy: S,
    test: impl Fn(S::Value),
) {
    use labs_core::testing::{fuzz_cases, fuzz_seed, ENV_FUZZ_CASES, ENV_FUZZ_SEED};
    use proptest::test_runner::{Config, RngSeed, TestRunner};
    let (cases, seed) = (fuzz_cases(default), fuzz_seed(name));
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        source_file: Some(source_file),
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, |value| {
        test(value);
        Ok(())
    }) {
        panic!("{name} ({ENV_FUZZ_SEED}={seed} {ENV_FUZZ_CASES}={cases}): {e}");
    }
    eprintln!("{name}: {cases} cases from {ENV_FUZZ_SEED}={seed}");
}
