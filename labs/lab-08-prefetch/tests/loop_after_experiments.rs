//! The training loop measured where the default run measures it: after the chapter's
//! other experiments. Its timed steps must make no driver calls and it must leave the
//! shared pinned pool alone, so that its step times are the ones `bench` measures.
//! One test in its own binary: a test running beside it would add driver work of its
//! own to the counters.

use std::sync::Arc;
use std::time::Duration;

use lab_08::driver_work::Counters;
use lab_08::{bandwidth, bench, non_blocking, training};
use labs_core::host::HostAllocator;
use labs_core::testing::test_device;
use labs_core::{DType, Tensor};

#[test]
fn the_loop_after_the_other_experiments_makes_no_driver_calls_while_timed() {
    let d = test_device();
    let config = bench::loader_config(&d, true);

    // The counters see driver work when there is some: a pinned miss in a fresh pool,
    // and new device memory after the device allocator gave its cache back.
    let pool = Arc::new(HostAllocator::new(&d));
    d.allocator().unwrap().empty_cache().unwrap();
    let before = Counters::read(&d, &pool).unwrap();
    let pinned = pool.allocate(config.batch_bytes()).unwrap();
    let on_device = Tensor::zeros(&[8 << 20], DType::F32, &d).unwrap();
    let work = before.until(&Counters::read(&d, &pool).unwrap());
    assert_eq!(work.pinned_allocs, 1, "{work:?}");
    assert!(work.device_allocs >= 1, "{work:?}");
    drop((pinned, on_device, pool));

    // What `bench` and the default run do before the loop, at small sizes. The
    // non-blocking copy is of the batch's size, so that the shared pool holds a block of
    // the batch's size class, freed with an event on another experiment's stream.
    bandwidth::measure(&d, &[64 << 10, 1 << 20]).unwrap();
    non_blocking::measure(&d, config.batch_bytes(), Duration::from_millis(10)).unwrap();

    let shared = HostAllocator::get(&d);
    let shared_before = shared.stats();
    let steps = training::measure(&d, config, false).unwrap();

    assert!(
        steps.timed_driver_work.is_none(),
        "driver calls in the timed steps: {:?}",
        steps.timed_driver_work
    );
    // Every block the loop pinned was pinned while warming its pool, before any timing.
    let warmed = (3 * config.workers + 2 * config.prefetch_depth + 4) as u64;
    assert_eq!(steps.pool.host_alloc_calls, warmed, "{:?}", steps.pool);
    assert_eq!(
        steps.pool.cache_hits,
        steps.pool.alloc_calls - warmed,
        "{:?}",
        steps.pool
    );
    // The loop neither took blocks from the shared pool nor left any in it.
    let shared_after = shared.stats();
    assert_eq!(shared_after.alloc_calls, shared_before.alloc_calls);
    assert_eq!(
        shared_after.host_alloc_calls,
        shared_before.host_alloc_calls
    );
    assert!(steps.prefetch_ratio > 0.0 && steps.prefetch_step_worst_ms >= steps.prefetch_step_ms);
}
