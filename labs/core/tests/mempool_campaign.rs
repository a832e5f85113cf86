//! Random interleavings of allocations, frees, cross-stream uses, `empty_cache` and the
//! private pools' operations (create, begin and end a scope, release) on several pools,
//! with the allocator's invariants (the pools' among them: every segment in one pool,
//! free sets holding only their pool's blocks, the pools' figures adding up to the
//! device's) and a model of the pools checked after every step: each block in the pool
//! of the scope it was allocated in, each pool's allocated bytes its live blocks',
//! `empty_cache` leaving live pools' memory alone, a released pool with nothing alive
//! holding nothing. Deterministic from `LABS_FUZZ_SEED`.
//!
//! CI runs a few thousand operations per configuration. A long campaign:
//! `LABS_MEMPOOL_CAMPAIGN_OPS=1000000 LABS_FUZZ_SEED=random cargo test --release -p
//! labs-core --test mempool_campaign -- --nocapture`.

mod alloc_ops;

use alloc_ops::{assert_no_overlap, random_op, Op, Rng, STREAMS};
use labs_core::alloc::{Allocation, Allocator, Config, MemPoolId};
use labs_core::testing::{fuzz_seed, test_device, ENV_FUZZ_SEED};
use labs_core::Stream;

const ENV_OPS: &str = "LABS_MEMPOOL_CAMPAIGN_OPS";
const DEFAULT_OPS: u64 = 3_000;
const MIB: u64 = 1 << 20;
/// Live blocks at most: an allocation beyond them is a free instead.
const MAX_LIVE: usize = 64;
/// Pools a step may name: the most recent ones.
const RECENT: usize = 6;
/// Pools not released at most: a new pool waits for a release beyond them.
const MAX_LIVE_POOLS: usize = 4;

/// (name, `LABS_ALLOC_CONF`, limit in bytes).
const CONFIGURATIONS: [(&str, &str, Option<u64>); 5] = [
    ("PyTorch's defaults (fixed segments)", "", None),
    ("preset labs", "preset:labs", None),
    (
        "PyTorch's expandable segments",
        "expandable_segments:True",
        None,
    ),
    ("preset labs, 96 MiB limit", "preset:labs", Some(96 * MIB)),
    (
        "fixed, 96 MiB limit, gc 0.6",
        "expandable_segments:False,garbage_collection_threshold:0.6",
        Some(96 * MIB),
    ),
];

fn ops_per_configuration() -> u64 {
    alloc_ops::ops_from_env(ENV_OPS, DEFAULT_OPS)
}

#[derive(Debug, Clone)]
enum Step {
    Plain(Op),
    NewPool,
    Begin(usize),
    /// Ends the scope at this index of the thread's scopes (modulo their number).
    End(usize),
    Release(usize),
}

fn random_step(rng: &mut Rng, live: usize) -> Step {
    match rng.index(18) {
        0..=12 => match random_op(rng) {
            Op::Alloc { .. } if live >= MAX_LIVE => Step::Plain(Op::Free(rng.index(MAX_LIVE))),
            op => Step::Plain(op),
        },
        13 => Step::NewPool,
        14 => Step::Begin(rng.index(RECENT)),
        15 | 16 => Step::End(rng.index(8)),
        _ => Step::Release(rng.index(RECENT)),
    }
}

/// A live block, the pool it must belong to, and whether another stream used it.
struct Live {
    block: Allocation,
    pool: MemPoolId,
    shared: bool,
}

struct Campaign {
    a: Allocator,
    streams: Vec<Stream>,
    limited: bool,
    live: Vec<Live>,
    pools: Vec<MemPoolId>,
    released: Vec<bool>,
    /// Released pools checked to hold nothing, and so no longer checked.
    done: Vec<bool>,
    /// Released pools that freed a block other streams used since the last
    /// `empty_cache`: its segment waits for those streams' work.
    waiting: Vec<bool>,
    /// The thread's scopes, innermost last.
    scopes: Vec<MemPoolId>,
    allocs: u64,
    /// Allocations in private pools, and pools released with blocks still alive.
    pooled: u64,
    draining_releases: u64,
    ooms: u64,
}

impl Campaign {
    fn index(&self, pool: MemPoolId) -> usize {
        pool.0 as usize - 1
    }

    /// The index of the pool a step names: one of the [`RECENT`] most recent.
    fn named(&self, k: usize) -> usize {
        let n = self.pools.len();
        n - 1 - k % n.min(RECENT)
    }

    fn apply(&mut self, step: &Step) {
        let a = &self.a;
        match *step {
            Step::Plain(Op::Alloc { size, stream }) => {
                match a.malloc(size as usize, &self.streams[stream]) {
                    Ok(block) => {
                        let pool = self.scopes.last().copied().unwrap_or(MemPoolId::DEFAULT);
                        assert_eq!(a.pool_of(&block).unwrap(), pool, "{step:?}");
                        self.live.push(Live {
                            block,
                            pool,
                            shared: false,
                        });
                        self.allocs += 1;
                        self.pooled += (pool != MemPoolId::DEFAULT) as u64;
                    }
                    Err(e) if e.is_out_of_memory() => self.ooms += 1,
                    Err(e) => panic!("{step:?}: {e}"),
                }
            }
            Step::Plain(Op::Free(i)) if !self.live.is_empty() => {
                let l = self.live.swap_remove(i % self.live.len());
                if l.pool != MemPoolId::DEFAULT && l.shared {
                    let i = self.index(l.pool);
                    self.waiting[i] = true;
                }
                a.free(l.block).unwrap();
            }
            Step::Plain(Op::RecordStream { block, stream }) if !self.live.is_empty() => {
                let n = self.live.len();
                let l = &mut self.live[block % n];
                a.record_stream(&l.block, &self.streams[stream]).unwrap();
                l.shared |= l.block.stream() != self.streams[stream].handle();
            }
            Step::Plain(Op::EmptyCache) => {
                let before = self.live_pools_reserved();
                a.empty_cache().unwrap();
                assert_eq!(
                    self.live_pools_reserved(),
                    before,
                    "empty_cache changed a live pool"
                );
                self.waiting.iter_mut().for_each(|w| *w = false);
            }
            Step::NewPool if self.released.iter().filter(|r| !**r).count() < MAX_LIVE_POOLS => {
                let pool = a.create_pool();
                assert_eq!(self.index(pool), self.pools.len());
                self.pools.push(pool);
                self.released.push(false);
                self.done.push(false);
                self.waiting.push(false);
            }
            Step::Begin(k) if !self.pools.is_empty() => {
                // Mostly a live pool; now and then any recent one, released or not.
                let live: Vec<usize> = (0..self.pools.len())
                    .filter(|&i| !self.released[i])
                    .collect();
                let i = match live.len() {
                    n if n > 0 && k % 4 != 0 => live[k % n],
                    _ => self.named(k),
                };
                let result = a.begin_allocate_to_pool(self.pools[i]);
                assert_eq!(result.is_ok(), !self.released[i], "{step:?}: {result:?}");
                if result.is_ok() {
                    self.scopes.push(self.pools[i]);
                }
            }
            Step::End(k) if !self.scopes.is_empty() => {
                let pool = self.scopes[k % self.scopes.len()];
                a.end_allocate_to_pool(pool).unwrap();
                let last = self.scopes.iter().rposition(|&p| p == pool).unwrap();
                self.scopes.remove(last);
            }
            Step::Release(k) if !self.pools.is_empty() => {
                let i = self.named(k);
                let pool = self.pools[i];
                let before = a.pool_stats(pool).unwrap().reserved;
                let result = a.release_pool(pool);
                let ok = !self.released[i] && !self.scopes.contains(&pool);
                assert_eq!(result.is_ok(), ok, "{step:?}: {result:?}");
                if let Ok(freed) = result {
                    self.released[i] = true;
                    self.draining_releases += self.live.iter().any(|l| l.pool == pool) as u64;
                    assert_eq!(before - freed, a.pool_stats(pool).unwrap().reserved);
                }
            }
            _ => {}
        }
        assert_eq!(
            a.current_pool(),
            self.scopes.last().copied().unwrap_or(MemPoolId::DEFAULT)
        );
    }

    /// The bytes each pool not released holds.
    fn live_pools_reserved(&self) -> Vec<(MemPoolId, u64)> {
        (self.pools.iter().zip(&self.released))
            .filter(|(_, &released)| !released)
            .map(|(&p, _)| (p, self.a.pool_stats(p).unwrap().reserved))
            .collect()
    }

    fn check(&mut self, after: &Step) {
        let a = &self.a;
        a.check_invariants()
            .unwrap_or_else(|e| panic!("after {after:?}: {e}"));
        let blocks: Vec<Allocation> = self.live.iter().map(|l| l.block).collect();
        assert_no_overlap(&blocks);
        let unfinished = (self.pools.iter().zip(&self.done))
            .filter(|(_, &done)| !done)
            .map(|(&p, _)| p);
        let pools: Vec<_> = std::iter::once(MemPoolId::DEFAULT)
            .chain(unfinished)
            .collect();
        for pool in pools {
            let mine = self.live.iter().filter(|l| l.pool == pool);
            let s = a.pool_stats(pool).unwrap();
            assert_eq!(
                s.allocated,
                mine.map(|l| l.block.size()).sum::<u64>(),
                "after {after:?}: {pool}"
            );
            if pool == MemPoolId::DEFAULT {
                continue;
            }
            let i = self.index(pool);
            assert_eq!(s.released, self.released[i]);
            let nothing_alive = !self.live.iter().any(|l| l.pool == pool);
            if self.released[i] && nothing_alive && !self.waiting[i] {
                assert_eq!(
                    (s.reserved, s.segments),
                    (0, 0),
                    "after {after:?}: released {pool} holds memory"
                );
                self.done[i] = true;
            }
        }
    }

    /// Ends every scope, frees every block, releases every pool and empties the cache:
    /// nothing may stay reserved.
    fn finish(&mut self) {
        for pool in self.scopes.drain(..).rev() {
            self.a.end_allocate_to_pool(pool).unwrap();
        }
        for l in self.live.drain(..) {
            self.a.free(l.block).unwrap();
        }
        for (i, &pool) in self.pools.iter().enumerate() {
            if !self.released[i] {
                self.a.release_pool(pool).unwrap();
            }
        }
        self.a.empty_cache().unwrap();
        self.a.check_invariants().unwrap();
        assert_eq!(self.a.memory_reserved(), 0);
    }
}

/// What a campaign came to: allocations, those in private pools, pools released with
/// blocks alive, allocations out of memory.
fn campaign(conf: &str, limit: Option<u64>, seed: u64, ops: u64) -> (u64, u64, u64, u64) {
    let device = test_device();
    let backend = device.backend_arc();
    let a = Allocator::new(backend.clone(), Config::parse(conf).unwrap()).unwrap();
    if let Some(bytes) = limit {
        let total = backend.mem_info().unwrap().total;
        a.set_memory_fraction(bytes as f64 / total as f64).unwrap();
    }
    let streams = (0..STREAMS)
        .map(|i| match i {
            0 => device.default_stream().unwrap(),
            _ => device.new_stream().unwrap(),
        })
        .collect();
    let mut c = Campaign {
        a,
        streams,
        limited: limit.is_some(),
        live: Vec::new(),
        pools: Vec::new(),
        released: Vec::new(),
        done: Vec::new(),
        waiting: Vec::new(),
        scopes: Vec::new(),
        allocs: 0,
        pooled: 0,
        draining_releases: 0,
        ooms: 0,
    };
    let mut rng = Rng::new(seed);
    for _ in 0..ops {
        let step = random_step(&mut rng, c.live.len());
        c.apply(&step);
        c.check(&step);
    }
    c.finish();
    assert!(
        c.limited || c.ooms == 0,
        "{} out of memory without a limit",
        c.ooms
    );
    (c.allocs, c.pooled, c.draining_releases, c.ooms)
}

#[test]
fn random_pool_operations_in_every_configuration() {
    let (ops, seed) = (ops_per_configuration(), fuzz_seed("mempool_campaign"));
    for (i, (name, conf, limit)) in CONFIGURATIONS.into_iter().enumerate() {
        let (allocs, pooled, draining, ooms) =
            campaign(conf, limit, seed.wrapping_add(i as u64), ops);
        eprintln!(
            "mempool_campaign: {name}: {ops} ops, {allocs} allocations ({pooled} in private \
             pools), {draining} pools released with blocks alive, {ooms} out of memory, \
             {ENV_FUZZ_SEED}={seed}"
        );
        // Under a limit, live pools keep memory the default pool cannot take back, as
        // in PyTorch: many requests fail there.
        let least = if limit.is_some() { ops / 20 } else { ops / 5 };
        assert!(allocs > least, "{name}: {allocs} allocations");
        if ops >= 1000 {
            assert!(
                pooled > allocs / 10,
                "{name}: {pooled} allocations in pools"
            );
            assert!(
                limit.is_some() || draining > 0,
                "{name}: no pool released with blocks alive"
            );
        }
    }
}
