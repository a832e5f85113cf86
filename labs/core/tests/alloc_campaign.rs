//! A long campaign of random operations on the caching allocator, on the simulated GPU:
//! malloc, free, record_stream, empty_cache and categories on three streams, in each
//! configuration the property tests use (PyTorch's defaults, the labs' preset, PyTorch's
//! expandable segments, the knobs, a device near its limit, no parking), every check of
//! `alloc_ops` after each operation; and threads sharing one allocator, its invariants
//! checked after each of their operations. Deterministic from `LABS_FUZZ_SEED` (the
//! threads' operations are; how they interleave is not). Prints its progress and a
//! summary per configuration.
//!
//! CI runs a few thousand operations per configuration. A long campaign:
//! `LABS_ALLOC_CAMPAIGN_OPS=1000000 LABS_FUZZ_SEED=random cargo test --release -p
//! labs-core --test alloc_campaign -- --nocapture`.

mod alloc_ops;

use std::sync::Arc;
use std::time::Instant;

use alloc_ops::{assert_no_overlap, random_op, Op, Rng, Run};
use labs_core::backend::prelude::*;
use labs_core::sim::SimBackend;
use labs_core::testing::{fuzz_seed, ENV_FUZZ_SEED};
use labs_core::DeviceId;

/// Operations per configuration (all threads together, in the threaded campaign).
const ENV_OPS: &str = "LABS_ALLOC_CAMPAIGN_OPS";
const DEFAULT_OPS: u64 = 20_000;

const MIB: u64 = 1 << 20;

/// Live blocks one driver keeps at most: an allocation beyond them is a free instead,
/// so that a long campaign stays within the device (64 blocks of up to 40 MiB).
const MAX_LIVE: usize = 64;

/// (name, `LABS_ALLOC_CONF`, limit in bytes).
const CONFIGURATIONS: [(&str, &str, Option<u64>); 8] = [
    ("PyTorch's defaults (fixed segments)", "", None),
    ("preset labs", "preset:labs", None),
    (
        "fixed, max_split 32 MiB, 4 divisions",
        "expandable_segments:False,max_split_size_mb:32,roundup_power2_divisions:4",
        None,
    ),
    (
        "PyTorch's expandable segments",
        "expandable_segments:True",
        None,
    ),
    ("preset labs, 96 MiB limit", "preset:labs", Some(96 * MIB)),
    (
        "PyTorch's expandable segments, max_split 32 MiB, 96 MiB limit",
        "expandable_segments:True,max_split_size_mb:32",
        Some(96 * MIB),
    ),
    (
        "fixed, 96 MiB limit, gc 0.6",
        "expandable_segments:False,garbage_collection_threshold:0.6",
        Some(96 * MIB),
    ),
    (
        "preset labs, no parking",
        "preset:labs,park_freed_blocks:False",
        None,
    ),
];

fn ops_per_configuration() -> u64 {
    alloc_ops::ops_from_env(ENV_OPS, DEFAULT_OPS)
}

/// A fresh simulated GPU of 16 GiB.
fn sim() -> Arc<dyn Backend> {
    Arc::new(SimBackend::new(DeviceId::Sim(0), 16 << 30))
}

/// The next operation of a driver: a random one, a free in place of an allocation once
/// it holds [`MAX_LIVE`] blocks.
fn next_op(rng: &mut Rng, live: usize) -> Op {
    match random_op(rng) {
        Op::Alloc { .. } if live >= MAX_LIVE => Op::Free(rng.index(MAX_LIVE)),
        op => op,
    }
}

/// What a campaign came to, for its summary line.
struct Summary {
    ops: u64,
    allocs: u64,
    ooms: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    driver_allocs: u64,
    seconds: f64,
}

fn report(name: &str, seed: u64, s: &Summary) {
    eprintln!(
        "alloc_campaign: {name}: {} ops ({} allocations, {} out of memory) in {:.2} s, \
         peak {:.1} MiB allocated, {:.1} MiB reserved, {} driver allocations, \
         {ENV_FUZZ_SEED}={seed}",
        s.ops,
        s.allocs,
        s.ooms,
        s.seconds,
        s.peak_allocated as f64 / MIB as f64,
        s.peak_reserved as f64 / MIB as f64,
        s.driver_allocs,
    );
}

fn campaign(name: &str, conf: &str, limit: Option<u64>, seed: u64, ops: u64) -> Summary {
    let start = Instant::now();
    let mut run = Run::new(sim(), conf, limit);
    let mut rng = Rng::new(seed);
    let mut allocs = 0;
    let every = (ops / 10).max(1);
    for i in 0..ops {
        let op = next_op(&mut rng, run.live.len());
        let before = run.live.len();
        run.apply(&op);
        allocs += (run.live.len() > before) as u64;
        run.check(&op);
        if i % 64 == 63 {
            run.check_stats();
        }
        if (i + 1) % every == 0 && ops >= 100_000 {
            eprintln!(
                "alloc_campaign: {name}: {} ops, {} live, {:.1} s",
                i + 1,
                run.live.len(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    let stats = run.allocator.stats();
    let summary = Summary {
        ops,
        allocs,
        ooms: run.ooms,
        peak_allocated: run.peak,
        peak_reserved: stats.reserved.peak,
        driver_allocs: stats.device_allocs,
        seconds: 0.0,
    };
    run.finish();
    Summary {
        seconds: start.elapsed().as_secs_f64(),
        ..summary
    }
}

#[test]
fn random_operations_in_every_configuration() {
    let (ops, seed) = (ops_per_configuration(), fuzz_seed("alloc_campaign"));
    for (i, (name, conf, limit)) in CONFIGURATIONS.into_iter().enumerate() {
        let s = campaign(name, conf, limit, seed.wrapping_add(i as u64), ops);
        report(name, seed, &s);
        assert!(s.allocs > ops / 5, "{name}: {} allocations", s.allocs);
        if limit.is_none() {
            assert_eq!(s.ooms, 0, "{name}");
        }
    }
}

/// One thread's part of the threaded campaign: after each operation, the invariants
/// of the whole allocator, and that its own blocks do not overlap and are counted.
fn thread_part(run: &mut Run, seed: u64, ops: u64) -> u64 {
    let mut rng = Rng::new(seed);
    let mut allocs = 0;
    for _ in 0..ops {
        let op = next_op(&mut rng, run.live.len());
        let before = run.live.len();
        run.apply(&op);
        allocs += (run.live.len() > before) as u64;
        run.allocator
            .check_invariants()
            .unwrap_or_else(|e| panic!("after {op:?}: {e}"));
        assert_no_overlap(&run.live);
        let own: u64 = run.live.iter().map(|b| b.size()).sum();
        assert!(run.allocator.memory_allocated() >= own, "after {op:?}");
    }
    allocs
}

#[test]
fn threads_sharing_one_allocator() {
    const THREADS: u64 = 4;
    let (ops, seed) = (
        ops_per_configuration(),
        fuzz_seed("alloc_campaign: threads"),
    );
    let confs = [CONFIGURATIONS[0], CONFIGURATIONS[1], CONFIGURATIONS[3]];
    for (i, (name, conf, limit)) in confs.into_iter().enumerate() {
        let start = Instant::now();
        let shared = Run::new(sim(), conf, limit.map(|l| l * THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let mut run = Run::on(
                    shared.allocator.clone(),
                    shared.streams.clone(),
                    limit.is_some(),
                );
                let seed = seed.wrapping_add((i as u64) << 32 | t);
                std::thread::spawn(move || {
                    let allocs = thread_part(&mut run, seed, ops / THREADS);
                    (run, allocs)
                })
            })
            .collect();
        let mut all = Run::on(shared.allocator.clone(), shared.streams.clone(), false);
        let (mut allocs, mut ooms) = (0, 0);
        for h in handles {
            let (run, n) = h.join().unwrap();
            all.live.extend(run.live);
            allocs += n;
            ooms += run.ooms;
        }
        all.check(&Op::EmptyCache);
        let stats = all.allocator.stats();
        let summary = Summary {
            ops: ops / THREADS * THREADS,
            allocs,
            ooms,
            peak_allocated: stats.allocated.peak,
            peak_reserved: stats.reserved.peak,
            driver_allocs: stats.device_allocs,
            seconds: start.elapsed().as_secs_f64(),
        };
        all.finish();
        report(&format!("{name}, {THREADS} threads"), seed, &summary);
        assert!(allocs > ops / 5, "{name}: {allocs} allocations");
    }
}
