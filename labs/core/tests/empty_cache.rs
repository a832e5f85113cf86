//! `empty_cache` starts the allocator afresh: after it, a workload reserves what it
//! reserves on a new allocator. With the labs' preset, memory grows freely only up
//! to the most ever reserved (the high-water mark) and past it recycles idle pages
//! first; a mark left over from an earlier, larger workload would let a later one
//! grow without recycling, so its peak would depend on what ran before it (as when
//! one process measures several training configurations in turn).

use labs_core::alloc::{Allocator, Config};
use labs_core::testing::test_device;
use labs_core::{Device, Stream};

const MIB: usize = 1 << 20;

fn allocator(device: &Device) -> Allocator {
    Allocator::new(device.backend_arc(), Config::labs()).unwrap()
}

/// A workload whose second request finds only idle memory of the wrong shape: 8 MiB
/// freed in front of a live 2 MiB block, then 16 MiB asked for. Returns peak reserved.
fn fragmenting(a: &Allocator, stream: &Stream) -> u64 {
    a.reset_peak_memory_stats();
    let front = a.malloc(8 * MIB, stream).unwrap();
    let keep = a.malloc(2 * MIB, stream).unwrap();
    a.free(front).unwrap();
    let big = a.malloc(16 * MIB, stream).unwrap();
    a.free(big).unwrap();
    a.free(keep).unwrap();
    a.max_memory_reserved()
}

#[test]
fn after_empty_cache_a_workload_reserves_what_it_does_on_a_new_allocator() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let fresh = fragmenting(&allocator(&device), &stream);
    // Past the mark of 10 MiB, the idle 8 MiB are recycled: 2 + 16 MiB at most.
    assert_eq!(fresh, 18 * MIB as u64);

    let a = allocator(&device);
    let earlier = a.malloc(64 * MIB, &stream).unwrap();
    a.free(earlier).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(fragmenting(&a, &stream), fresh);
    a.empty_cache().unwrap();
}
