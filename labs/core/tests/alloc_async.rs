//! `backend:cudaMallocAsync` against the device under test (`LABS_DEVICE`, default the
//! simulator): the configuration and its refusals, the statistics the driver's pool
//! gives, `empty_cache` trimming the pool, reuse on one stream and across streams,
//! peaks and their reset, out-of-memory, a trace replay, and random operations.

mod alloc_ops;

use alloc_ops::property;
use labs_core::alloc::replay::{replay, Trace, TraceEvent};
use labs_core::alloc::{AllocBackend, Allocation, Allocator, Config, MemPoolId};
use labs_core::device::FillPattern;
use labs_core::snapshot::TraceAction;
use labs_core::testing::test_device;
use labs_core::Device;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const ASYNC: &str = "backend:cudaMallocAsync";

fn allocator(device: &Device) -> Allocator {
    Allocator::new(device.backend_arc(), Config::parse(ASYNC).unwrap()).unwrap()
}

#[test]
fn the_backend_key_takes_pytorchs_names_and_refuses_caching_knobs() {
    let c = Config::parse(ASYNC).unwrap();
    assert_eq!(c.backend, AllocBackend::CudaMallocAsync);
    assert_eq!(c, Config::cuda_malloc_async());
    assert_eq!(Config::parse("backend:native").unwrap(), Config::default());
    assert_eq!(c.to_pytorch_conf_string(), ASYNC);
    assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
    assert_eq!(c.describe(), "allocator: backend:cudaMallocAsync");
    // Keys that ask nothing of a cache, or that PyTorch's async backend honours.
    let c = Config::parse(
        "backend:cudaMallocAsync,expandable_segments:False,per_process_memory_fraction:0.5",
    )
    .unwrap();
    assert_eq!(c.per_process_memory_fraction, 0.5);
    assert_eq!(
        c.to_pytorch_conf_string(),
        "backend:cudaMallocAsync,per_process_memory_fraction:0.5"
    );
    assert_eq!(Config::parse(&c.to_conf_string()).unwrap(), c);
    for (text, needle) in [
        (
            "backend:cudaMallocAsync,max_split_size_mb:128",
            "max_split_size_mb:128 conflicts",
        ),
        (
            "expandable_segments:True,backend:cudaMallocAsync",
            "expandable_segments:True conflicts",
        ),
        (
            "backend:cudaMallocAsync,garbage_collection_threshold:0.6",
            "garbage_collection_threshold:0.6 conflicts",
        ),
        (
            "backend:cudaMallocAsync,roundup_power2_divisions:4",
            "roundup_power2_divisions:4 conflicts",
        ),
        (
            "backend:cudaMallocAsync,max_mapping_mb:64",
            "max_mapping_mb:64 conflicts",
        ),
        (
            "backend:cudaMallocAsync,park_freed_blocks:False",
            "park_freed_blocks:False conflicts",
        ),
        (
            "preset:labs,backend:cudaMallocAsync",
            "preset:labs (expandable segments) conflicts",
        ),
        (
            "backend:cudaMalloc",
            "unknown backend `cudaMalloc` (known: native, cudaMallocAsync)",
        ),
    ] {
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains(needle), "{text}: {e}");
        assert!(!e.contains('\n'), "{text}: one line: {e}");
    }
}

#[test]
fn statistics_count_the_requests_and_read_the_pool() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device);
    let big = a.malloc((3 * MIB) as usize, &stream).unwrap();
    let small = a.malloc(1000, &stream).unwrap();
    // Nothing is rounded: the pool takes the sizes asked for.
    assert_eq!((big.size(), small.size()), (3 * MIB, 1000));
    let s = a.stats();
    assert_eq!(s.allocated.current, 3 * MIB + 1000);
    assert_eq!(s.requested.current, 3 * MIB + 1000);
    assert_eq!(s.allocations.current, 2);
    assert_eq!(s.device_allocs, 2);
    assert_eq!(s.segments.current, 0, "the pool gives no segments");
    assert!(s.reserved.current >= s.allocated.current, "{s:?}");
    assert_eq!(s.reserved.current % (2 * MIB), 0, "whole 2 MiB pages");
    let m = a.memory_stats();
    assert_eq!(m["allocated_bytes.all.current"], 3 * MIB + 1000);
    assert_eq!(m["reserved_bytes.all.current"], s.reserved.current);
    assert_eq!(m["num_device_alloc"], 2);
    assert_eq!(a.live_blocks().len(), 2);
    assert!(a.segments().is_empty());
    let reserved = s.reserved.current;
    a.free(big).unwrap();
    a.free(small).unwrap();
    assert!(a.free(small).is_err(), "a double free is an error");
    let s = a.stats();
    assert_eq!((s.allocated.current, s.allocations.current), (0, 0));
    assert_eq!(s.allocated.peak, 3 * MIB + 1000);
    assert_eq!(s.device_frees, 2);
    // The pool keeps what was freed (its release threshold is the maximum), even
    // across a synchronisation.
    device.synchronize().unwrap();
    assert_eq!(a.memory_reserved(), reserved);
    a.check_invariants().unwrap();
}

#[test]
fn empty_cache_trims_the_pool_to_what_is_live() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device);
    let keep = a.malloc((8 * MIB) as usize, &stream).unwrap();
    let gone = a.malloc((64 * MIB) as usize, &stream).unwrap();
    a.free(gone).unwrap();
    let before = a.memory_reserved();
    assert!(before >= 72 * MIB, "{before}");
    let released = a.empty_cache().unwrap();
    let after = a.memory_reserved();
    assert_eq!(released, before - after);
    assert!((8 * MIB..72 * MIB).contains(&after), "{after}");
    assert_eq!(a.stats().num_sync_all_streams, 1);
    a.free(keep).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn a_freed_block_serves_its_stream_again_without_growing_the_pool() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device);
    let b = a.malloc((32 * MIB) as usize, &stream).unwrap();
    let reserved = a.memory_reserved();
    a.free(b).unwrap();
    for _ in 0..8 {
        let again = a.malloc((32 * MIB) as usize, &stream).unwrap();
        a.free(again).unwrap();
    }
    let s = a.stats();
    assert_eq!(s.reserved.current, reserved);
    assert_eq!(s.reserved.peak, reserved);
    assert_eq!(s.device_allocs, 9, "each request is one call to the pool");
}

#[test]
fn a_block_used_on_another_stream_is_reused_only_after_that_streams_work() {
    let device = test_device();
    let (s0, s1) = (
        device.default_stream().unwrap(),
        device.new_stream().unwrap(),
    );
    let a = allocator(&device);
    let size = 48 * MIB;
    let block = a.malloc(size as usize, &s0).unwrap();
    let ptr = block.ptr();
    // Work on the other stream keeps the block busy for a while.
    for _ in 0..16 {
        device
            .backend()
            .fill(ptr, FillPattern::U32(1), (size / 4) as usize, &s1)
            .unwrap();
    }
    a.record_stream(&block, &s1).unwrap();
    a.free(block).unwrap();
    assert_eq!(a.stats().num_deferred_frees, 1);
    // Served from the same memory only once the other stream's work is done, or with
    // the new owner's work ordered after it (the driver may make the stream wait):
    // either way what the new owner writes is what it reads back.
    let again = a.malloc(size as usize, &s0).unwrap();
    let words = (size / 4) as usize;
    device
        .backend()
        .fill(again.ptr(), FillPattern::U32(2), words, &s0)
        .unwrap();
    device.synchronize().unwrap();
    let mut host = vec![0u8; size as usize];
    device
        .backend()
        .copy_dtoh(&mut host, again.ptr(), &s0)
        .unwrap();
    assert!(
        host.chunks_exact(4)
            .all(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]) == 2),
        "the other stream's work ran after the block was handed out again (reused at {:#x}, was {ptr:#x})",
        again.ptr()
    );
    a.free(again).unwrap();
    // Once everything is done, the memory serves any stream without growing the pool.
    device.synchronize().unwrap();
    let reserved = a.memory_reserved();
    let s2 = device.new_stream().unwrap();
    let third = a.malloc(size as usize, &s2).unwrap();
    assert_eq!(a.memory_reserved(), reserved);
    a.free(third).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn peaks_come_from_the_pool_and_reset_with_it() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device);
    let big = a.malloc((96 * MIB) as usize, &stream).unwrap();
    a.free(big).unwrap();
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(s.reserved.current, 0);
    assert!(s.reserved.peak >= 96 * MIB, "{s:?}");
    assert_eq!(s.allocated.peak, 96 * MIB);
    a.reset_peak_memory_stats();
    let small = a.malloc((4 * MIB) as usize, &stream).unwrap();
    let s = a.stats();
    assert_eq!(s.allocated.peak, 4 * MIB);
    assert_eq!(s.reserved.peak, s.reserved.current);
    assert!(
        s.reserved.peak >= 4 * MIB && s.reserved.peak < 96 * MIB,
        "{s:?}"
    );
    assert_eq!(a.max_memory_reserved(), s.reserved.peak);
    assert_eq!(a.max_memory_allocated(), 4 * MIB);
    a.free(small).unwrap();
}

#[test]
fn out_of_memory_is_a_one_line_error_and_counted() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device);
    let total = device.mem_info().unwrap().total;
    a.set_memory_fraction((64 * MIB) as f64 / total as f64)
        .unwrap();
    let held = a.malloc((48 * MIB) as usize, &stream).unwrap();
    let e = a.malloc((32 * MIB) as usize, &stream).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let text = e.to_string();
    assert!(!text.contains('\n'), "{text}");
    assert!(text.starts_with("out of memory on"), "{text}");
    assert!(
        text.contains("32.00 MiB") || text.contains("32 MiB"),
        "{text}"
    );
    assert!(
        !text.contains("expandable"),
        "no knob the backend refuses: {text}"
    );
    assert_eq!(a.stats().num_ooms, 1);
    // Within the process's limit but not in the device's free memory: the driver's pool
    // itself refuses it.
    a.set_memory_fraction(1.0).unwrap();
    let e = a.malloc((total - 16 * MIB) as usize, &stream).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(a.stats().num_ooms, 2);
    // Within the limit again, it serves.
    let fits = a.malloc((8 * MIB) as usize, &stream).unwrap();
    a.free(fits).unwrap();
    a.free(held).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn private_pools_are_refused() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device);
    let id: MemPoolId = a.create_pool();
    let e = a.begin_allocate_to_pool(id).unwrap_err().to_string();
    assert!(e.contains("conflict with backend:cudaMallocAsync"), "{e}");
    let e = a.begin_allocate_stream_to_pool(id, &stream).unwrap_err();
    assert!(e.to_string().contains("backend:cudaMallocAsync"), "{e}");
}

fn event(action: TraceAction, addr: u64, size: u64, stream: u64, line: usize) -> TraceEvent {
    TraceEvent {
        action,
        addr,
        size,
        stream,
        line,
    }
}

#[test]
fn a_trace_replays_through_the_pool() {
    use TraceAction::{Alloc, FreeRequested};
    // Two streams; a block freed on each and asked for again on the same stream.
    let events = vec![
        event(Alloc, 0x1000, 10 * MIB, 0, 2),
        event(Alloc, 0x2000, 3 * MIB, 7, 3),
        event(FreeRequested, 0x1000, 10 * MIB, 0, 4),
        event(Alloc, 0x3000, 10 * MIB, 0, 5),
        event(FreeRequested, 0x2000, 3 * MIB, 7, 6),
        event(Alloc, 0x4000, 3 * MIB, 7, 7),
        event(Alloc, 0x5000, 512, 0, 8),
        event(FreeRequested, 0x3000, 10 * MIB, 0, 9),
        event(FreeRequested, 0x4000, 3 * MIB, 7, 10),
    ];
    let trace = Trace {
        name: "two-streams".into(),
        events,
    };
    assert_eq!(trace.peak_requested(), 13 * MIB + 512);
    let device = test_device();
    let a = allocator(&device);
    let r = replay(&trace, &a).unwrap();
    assert_eq!(r.ops, 9);
    assert_eq!(r.conf, ASYNC);
    assert_eq!(r.peak_allocated, 13 * MIB + 512);
    assert_eq!(r.peak_requested, 13 * MIB + 512);
    assert!(r.peak_reserved >= r.peak_allocated, "{r:?}");
    assert_eq!(r.device_allocs, 5);
    assert_eq!(a.stats().allocated.current, 0, "what was live is freed");
    a.check_invariants().unwrap();
    // Same-stream reuse: the second 10 MiB and 3 MiB need no more memory than the
    // first ones did, so the trace reserves what its peak set alone reserves (on a
    // new pool of the same device, whatever the driver's chunk size).
    let peak_set = Trace {
        name: "the peak set".into(),
        events: vec![
            event(Alloc, 0x1000, 10 * MIB, 0, 2),
            event(Alloc, 0x2000, 3 * MIB, 7, 3),
            event(Alloc, 0x5000, 512, 0, 4),
            event(FreeRequested, 0x1000, 10 * MIB, 0, 5),
            event(FreeRequested, 0x2000, 3 * MIB, 7, 6),
            event(FreeRequested, 0x5000, 512, 0, 7),
        ],
    };
    let alone = replay(&peak_set, &allocator(&device)).unwrap();
    assert_eq!(r.peak_reserved, alone.peak_reserved, "{r:?}\n{alone:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, stream: usize },
    Free(usize),
    RecordStream { block: usize, stream: usize },
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1u64..4096, 4096u64..(2 << 20), (2u64 << 20)..(40 << 20)];
    prop_oneof![
        6 => (size, 0usize..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => (0usize..64).prop_map(Op::Free),
        1 => (0usize..64, 0usize..3).prop_map(|(block, stream)| Op::RecordStream { block, stream }),
        1 => Just(Op::EmptyCache),
    ]
}

#[test]
fn random_operations_keep_allocated_equal_to_the_live_sizes() {
    let device = test_device();
    let streams = [
        device.default_stream().unwrap(),
        device.new_stream().unwrap(),
        device.new_stream().unwrap(),
    ];
    let ops = prop::collection::vec(op(), 1..60);
    property("async random operations", file!(), 24, ops, |ops| {
        let a = allocator(&device);
        let mut live: Vec<Allocation> = Vec::new();
        for op in &ops {
            match *op {
                Op::Alloc { size, stream } => {
                    live.push(a.malloc(size as usize, &streams[stream]).unwrap());
                }
                Op::Free(i) if !live.is_empty() => {
                    a.free(live.swap_remove(i % live.len())).unwrap();
                }
                Op::RecordStream { block, stream } if !live.is_empty() => {
                    a.record_stream(&live[block % live.len()], &streams[stream])
                        .unwrap();
                }
                Op::EmptyCache => {
                    a.empty_cache().unwrap();
                }
                _ => {}
            }
            let s = a.stats();
            let sizes: u64 = live.iter().map(|b| b.size()).sum();
            assert_eq!(s.allocated.current, sizes, "{op:?}");
            assert_eq!(s.allocations.current, live.len() as u64, "{op:?}");
            assert!(s.reserved.current >= s.allocated.current, "{op:?}: {s:?}");
            assert!(s.reserved.peak >= s.reserved.current, "{op:?}: {s:?}");
            a.check_invariants().unwrap();
        }
        for b in live {
            a.free(b).unwrap();
        }
        a.empty_cache().unwrap();
        assert_eq!(a.memory_reserved(), 0);
    });
}
