//! The caching allocator on simulated GPUs whose addresses need all 64 bits: random
//! operations with every check after each, as in `alloc.rs`, with the device handing
//! out addresses above 2^49 (where a real GPU's never reach, and where a simulator that
//! never reuses addresses arrives after some 400,000 segments).

mod alloc_ops;

use std::sync::Arc;

use alloc_ops::{random_op, Rng, Run};
use labs_core::sim::SimBackend;
use labs_core::DeviceId;

const MIB: u64 = 1 << 20;

const CONFS: [&str; 4] = [
    "preset:labs",
    "expandable_segments:True",
    "expandable_segments:False",
    "expandable_segments:False,max_split_size_mb:32,roundup_power2_divisions:4",
];

/// A simulated GPU of 16 GiB whose addresses start at `base`.
fn device_from(base: u64) -> Arc<SimBackend> {
    Arc::new(SimBackend::new(DeviceId::Sim(0), 16 << 30).with_addresses_from(base))
}

#[test]
fn allocators_work_at_addresses_above_2_to_49() {
    for base in [1 << 49, (1 << 56) + (5 << 30) + (3 << 20), 1 << 63] {
        for conf in CONFS {
            for limit in [None, Some(96 * MIB)] {
                let mut run = Run::new(device_from(base), conf, limit);
                let mut rng = Rng::new(base ^ conf.len() as u64);
                for i in 0..1200 {
                    let op = random_op(&mut rng);
                    run.apply(&op);
                    run.check(&op);
                    for b in &run.live {
                        assert!(
                            b.ptr() >= base,
                            "{conf} from {base:#x}: a block at {:#x}",
                            b.ptr()
                        );
                    }
                    if i % 8 == 7 {
                        run.check_stats();
                    }
                }
                assert!(
                    !run.live.is_empty() || run.peak > 0,
                    "{conf}: nothing allocated"
                );
                run.finish();
            }
        }
    }
}

/// A simulated GPU never reuses an address (so that a stale pointer is caught); near
/// the end of its 64-bit space, what does not fit is a one-line error, never a wrapped
/// address or an overflow, and the allocator above it passes the error on.
#[test]
fn the_simulator_refuses_what_passes_the_end_of_its_address_space() {
    use labs_core::backend::prelude::*;
    const GIB: u64 = 1 << 30;
    let top = u64::MAX - (u64::MAX % (2 << 20)) - 4 * GIB;
    let sim = device_from(top);
    let mut bases = Vec::new();
    let err = loop {
        match sim.vm_reserve(GIB as usize) {
            Ok(base) => {
                assert!(base >= top && base.checked_add(GIB).is_some(), "{base:#x}");
                assert!(bases.last().is_none_or(|&b| base > b), "{base:#x} reused");
                bases.push(base);
            }
            Err(e) => break e.to_string(),
        }
        assert!(bases.len() < 4, "1 GiB ranges at {bases:x?} past the end");
    };
    assert!(!bases.is_empty(), "nothing reserved below the end: {err}");
    for needle in ["address space", "sim:0"] {
        assert!(err.contains(needle), "{err}");
    }
    assert!(!err.contains('\n'), "{err}");
    assert!(sim.raw_alloc(4 << 30).is_err());
    assert!(sim.vm_reserve(usize::MAX).is_err());
    for base in bases {
        sim.vm_release(base, GIB as usize).unwrap();
    }

    // The allocator's expandable segments reserve 1 GiB each: the error reaches the
    // caller, and the allocator stays consistent.
    let mut run = Run::new(device_from(top), "expandable_segments:True", None);
    let mut refused = None;
    for stream in 0..alloc_ops::STREAMS {
        for size in [512, 64 << 20] {
            match run.allocator.malloc(size, &run.streams[stream]) {
                Ok(b) => run.live.push(b),
                Err(e) => refused = Some(e.to_string()),
            }
            run.allocator.check_invariants().unwrap();
        }
    }
    let refused = refused.expect("six 1 GiB segments fitted in 4 GiB of address space");
    assert!(refused.contains("address space"), "{refused}");
    run.finish();
}
