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

const CONFS: [&str; 3] = [
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
