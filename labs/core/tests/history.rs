//! The memory history, snapshots of our allocator, the trace they export and the leak
//! guard, on the device under test (`LABS_DEVICE`, default the simulator).

use labs_core::alloc::replay::read_trace;
use labs_core::alloc::{Allocator, Config, LeakGuard};
use labs_core::device::replay_on_sim;
use labs_core::snapshot::{self, BlockState, Summary, TraceAction};
use labs_core::testing::test_device;
use labs_core::Device;

const MIB: u64 = 1 << 20;

fn allocator(device: &Device, conf: &str) -> Allocator {
    Allocator::new(device.backend_arc(), Config::parse(conf).unwrap()).unwrap()
}

fn actions(a: &Allocator) -> Vec<TraceAction> {
    a.history().0.iter().map(|e| e.action.clone()).collect()
}

#[test]
fn the_history_records_what_happened_in_order() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "expandable_segments:False");
    let before = a.malloc(1000, &stream).unwrap();
    assert!(a.history().0.is_empty(), "nothing is recorded until asked");
    a.record_memory_history(100, false);
    let b = a.malloc(3 * MIB as usize, &stream).unwrap();
    a.free(b).unwrap();
    a.free(before).unwrap();
    a.empty_cache().unwrap();
    use TraceAction::*;
    assert_eq!(
        actions(&a),
        [
            SegmentAlloc,
            Alloc,
            FreeRequested,
            FreeCompleted,
            FreeRequested,
            FreeCompleted,
            SegmentFree,
            SegmentFree
        ]
    );
    let (events, dropped) = a.history();
    assert_eq!(dropped, 0);
    assert_eq!((events[1].addr, events[1].size), (b.ptr(), 3 * MIB));
    assert_eq!(
        events[0].size,
        20 * MIB,
        "a 3 MiB request gets a 20 MiB segment"
    );
    assert!(events.iter().all(|e| e.stream == stream.handle()));
    assert!(events.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    a.record_memory_history(0, false);
    assert!(a.history().0.is_empty(), "stopping drops the history");
}

#[test]
fn the_ring_buffer_keeps_the_newest_events() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "");
    a.record_memory_history(6, false);
    let mut sizes = Vec::new();
    for i in 1..=10u64 {
        let b = a.malloc((i * 4096) as usize, &stream).unwrap();
        sizes.push(b.requested());
        a.free(b).unwrap();
    }
    let (events, dropped) = a.history();
    assert_eq!(events.len(), 6);
    assert!(dropped >= 24, "{dropped}");
    let allocs: Vec<u64> = events
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| e.size)
        .collect();
    // Each iteration records alloc, free_requested, free_completed.
    assert_eq!(allocs, [9 * 4096, 10 * 4096]);
}

#[test]
fn expandable_segments_record_mappings_and_failures() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "expandable_segments:True");
    let total = device.mem_info().unwrap().total;
    a.set_memory_fraction((64 * MIB) as f64 / total as f64)
        .unwrap();
    a.record_memory_history(1000, false);
    let b = a.malloc(5 * MIB as usize, &stream).unwrap();
    assert!(a.malloc(200 * MIB as usize, &stream).is_err());
    a.free(b).unwrap();
    a.empty_cache().unwrap();
    let (events, _) = a.history();
    let map = events
        .iter()
        .find(|e| e.action == TraceAction::SegmentMap)
        .unwrap();
    assert_eq!(map.addr, b.ptr());
    assert_eq!(map.size, 6 * MIB, "three 2 MiB pages");
    let oom = events
        .iter()
        .find(|e| e.action == TraceAction::Oom)
        .unwrap();
    assert_eq!(oom.size, 200 * MIB);
    // The request that could not fit mapped nothing before failing.
    let maps: Vec<_> = events
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .collect();
    assert_eq!(maps.len(), 1, "{maps:?}");
    let unmapped: u64 = events
        .iter()
        .filter(|e| e.action == TraceAction::SegmentUnmap)
        .map(|e| e.size)
        .sum();
    assert_eq!(unmapped, 6 * MIB);
    assert_eq!(a.memory_reserved(), 0);
}

/// `max_mapping_mb` bounds each driver mapping of an expandable segment: a 40 MiB
/// block is mapped as 16 + 16 + 8 MiB by default, whole under 64 MiB, and a page at a
/// time under 3 MiB (rounded down to whole 2 MiB pages).
#[test]
fn max_mapping_mb_bounds_each_driver_mapping() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    for (conf, want) in [
        ("expandable_segments:True", vec![16, 16, 8]),
        ("expandable_segments:True,max_mapping_mb:64", vec![40]),
        ("expandable_segments:True,max_mapping_mb:3", vec![2; 20]),
    ] {
        let a = allocator(&device, conf);
        a.record_memory_history(1000, false);
        let b = a.malloc(40 * MIB as usize, &stream).unwrap();
        let (events, _) = a.history();
        let maps: Vec<u64> = (events.iter())
            .filter(|e| e.action == TraceAction::SegmentMap)
            .map(|e| e.size / MIB)
            .collect();
        assert_eq!(maps, want, "{conf}");
        assert_eq!(a.memory_reserved(), 40 * MIB, "{conf}");
        a.free(b).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.memory_reserved(), 0, "{conf}");
    }
}

#[test]
fn a_free_on_another_streams_work_completes_later() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let other = device.new_stream().unwrap();
    let a = allocator(&device, "");
    a.record_memory_history(100, false);
    let b = a.malloc(4096, &stream).unwrap();
    a.record_stream(&b, &other).unwrap();
    a.free(b).unwrap();
    let blocks_only = |a: &Allocator| -> Vec<TraceAction> {
        actions(a)
            .into_iter()
            .filter(|x| {
                !matches!(
                    x,
                    TraceAction::SegmentMap
                        | TraceAction::SegmentUnmap
                        | TraceAction::SegmentAlloc
                        | TraceAction::SegmentFree
                )
            })
            .collect()
    };
    assert_eq!(
        blocks_only(&a),
        [TraceAction::Alloc, TraceAction::FreeRequested]
    );
    other.synchronize().unwrap();
    a.empty_cache().unwrap();
    let (events, _) = a.history();
    let done = events
        .iter()
        .find(|e| e.action == TraceAction::FreeCompleted)
        .unwrap();
    assert_eq!((done.addr, done.stream), (b.ptr(), stream.handle()));
}

/// A snapshot adds up to the allocator's own figures: segments to memory_reserved
/// (an expandable segment counts only its memory-backed pages), active blocks to
/// memory_allocated; it survives JSON.
#[test]
fn a_snapshot_adds_up_to_the_statistics() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    for conf in ["expandable_segments:True", "expandable_segments:False"] {
        let a = allocator(&device, conf);
        a.record_memory_history(10_000, false);
        let mut live = Vec::new();
        for i in 0..60u64 {
            let size = [700, 300_000, 3 * MIB + 12_345, 25 * MIB][i as usize % 4];
            live.push(a.malloc(size as usize, &stream).unwrap());
            if i % 3 == 0 {
                a.free(live.swap_remove((i as usize * 7) % live.len()))
                    .unwrap();
            }
        }
        let snap = a.snapshot();
        let s = Summary::of(&snap);
        assert_eq!(s.reserved_bytes, a.memory_reserved(), "{conf}");
        assert_eq!(s.allocated_bytes, a.memory_allocated(), "{conf}");
        assert_eq!(s.active_blocks, live.len(), "{conf}");
        assert_eq!(s.trace_allocs, 60);
        assert_eq!(snap.settings.expandable_segments, conf.ends_with("True"));
        for seg in &snap.segments {
            let covered: u64 = seg.blocks.iter().map(|b| b.size).sum();
            assert_eq!(covered, seg.total_size, "{conf}: blocks cover the segment");
        }
        let text = snapshot::dump(&snap);
        let (back, format) = snapshot::load(text.as_bytes()).unwrap();
        assert_eq!(format, snapshot::SourceFormat::Json);
        assert_eq!(back, snap);
        for b in live {
            a.free(b).unwrap();
        }
    }
}

/// Any run of ours can be replayed: its history exports to the CSV of the shared
/// traces, and a replay with the same settings reaches the same peaks.
#[test]
fn a_replay_of_an_exported_trace_reaches_the_recorded_peaks() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let dir = std::env::temp_dir().join(format!("labs-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for conf in ["expandable_segments:True", "expandable_segments:False"] {
        let a = allocator(&device, conf);
        a.record_memory_history(1 << 20, false);
        // Three iterations of a training-like loop: weights kept, activations made
        // and freed in reverse, a gradient per weight kept until the step.
        let weights: Vec<_> = (0..4)
            .map(|i| a.malloc((6 * MIB + i * 4096) as usize, &stream).unwrap())
            .collect();
        for step in 0..3u64 {
            let acts: Vec<_> = (0..12u64)
                .map(|i| {
                    let size = (1 + (i * 7 + step * 3) % 11) * MIB + i * 512;
                    a.malloc(size as usize, &stream).unwrap()
                })
                .collect();
            let mut grads = Vec::new();
            for (i, act) in acts.into_iter().rev().enumerate() {
                a.free(act).unwrap();
                if i % 3 == 0 {
                    grads.push(a.malloc((6 * MIB) as usize, &stream).unwrap());
                }
                let tmp = a.malloc(300_000 + i * 1000, &stream).unwrap();
                a.free(tmp).unwrap();
            }
            for g in grads {
                a.free(g).unwrap();
            }
        }
        for w in weights {
            a.free(w).unwrap();
        }
        let recorded = a.stats();
        let json = dir.join("run.json");
        a.dump_snapshot(&json).unwrap();
        let (snap, _) = snapshot::load_file(&json).unwrap();
        let csv = dir.join("run.trace.csv.gz");
        let n = snapshot::export_trace(&snap, snap.pick_device(None).unwrap(), &csv).unwrap();
        assert_eq!(n, snap.trace.len());
        let trace = read_trace(&csv).unwrap();
        let report = replay_on_sim(&trace, Config::parse(conf).unwrap(), 16 << 30).unwrap();
        assert_eq!(report.unknown_frees, 0);
        assert_eq!(
            (
                report.peak_requested,
                report.peak_allocated,
                report.peak_reserved
            ),
            (
                recorded.requested.peak,
                recorded.allocated.peak,
                recorded.reserved.peak
            ),
            "{conf}"
        );
        assert_eq!(report.peak_requested, trace.peak_requested());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[inline(never)]
fn allocate_for_the_test(a: &Allocator, device: &Device) -> labs_core::alloc::Allocation {
    a.malloc(12_345, &device.default_stream().unwrap()).unwrap()
}

#[test]
fn backtraces_name_the_caller() {
    let device = test_device();
    let a = allocator(&device, "");
    a.record_memory_history(100, true);
    let b = allocate_for_the_test(&a, &device);
    let snap = a.snapshot();
    let alloc = snap
        .trace
        .iter()
        .find(|e| e.action == TraceAction::Alloc)
        .unwrap();
    let named = |frames: &[snapshot::Frame]| {
        frames
            .iter()
            .any(|f| f.name.contains("allocate_for_the_test"))
    };
    assert!(named(&alloc.frames), "{:?}", alloc.frames);
    let block = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.state == BlockState::ActiveAllocated)
        .unwrap();
    assert!(named(&block.frames), "a live block keeps where it was made");
    a.free(b).unwrap();
}

/// The classic leak: every iteration keeps one tensor alive (a loss appended to a
/// list). The guard reports it at the end of each iteration, and nothing else.
#[test]
fn the_leak_guard_finds_a_block_kept_every_iteration() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "");
    a.record_memory_history(10_000, true);
    let state = a.malloc(8 << 20, &stream).unwrap();
    let mut kept = Vec::new();
    let mut guard = LeakGuard::new(&a);
    for step in 0..4 {
        let tmp: Vec<_> = (0..8)
            .map(|i| a.malloc(100_000 * (i + 1), &stream).unwrap())
            .collect();
        let loss = allocate_for_the_test(&a, &device);
        for t in tmp {
            a.free(t).unwrap();
        }
        if step == 2 {
            a.free(loss).unwrap();
        } else {
            kept.push(loss);
        }
        let report = guard.end_iteration();
        if step == 2 {
            assert!(report.is_clean(), "{report}");
            continue;
        }
        assert_eq!(report.blocks.len(), 1, "{report}");
        let leak = &report.blocks[0];
        assert_eq!(
            (leak.addr, leak.requested),
            (kept.last().unwrap().ptr(), 12_345)
        );
        let text = report.to_string();
        assert!(text.contains("allocate_for_the_test"), "{text}");
        assert!(text.contains("12345 B"), "{text}");
    }
    for b in kept.into_iter().chain([state]) {
        a.free(b).unwrap();
    }
}

#[test]
fn an_allocs_event_carries_the_blocks_category_and_the_op_that_saved_it() {
    use labs_core::alloc::Category;
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "expandable_segments:True");
    a.record_memory_history(3, false);
    let weight = a.malloc_as(4096, &stream, Category::Temporary).unwrap();
    let saved = a.malloc_as(4096, &stream, Category::Temporary).unwrap();
    // Roles change while the blocks live: the events follow.
    a.set_category(&weight, Category::Parameter).unwrap();
    a.mark_saved(&saved, || "MmBackward".to_string()).unwrap();
    let snap = a.snapshot();
    let allocs: Vec<_> = (snap.trace.iter())
        .filter(|e| e.action == TraceAction::Alloc)
        .collect();
    assert_eq!(allocs[0].category.as_deref(), Some("parameter"));
    assert_eq!(allocs[0].saved_by, None);
    assert_eq!(allocs[1].category.as_deref(), Some("activation"));
    assert_eq!(allocs[1].saved_by.as_deref(), Some("MmBackward"));
    // An event the ring let go is not looked for: the newer ones are still right.
    let third = a.malloc_as(8192, &stream, Category::Input).unwrap();
    let fourth = a.malloc_as(8192, &stream, Category::Temporary).unwrap();
    a.set_category(&weight, Category::Gradient).unwrap();
    a.set_category(&fourth, Category::OptimizerState).unwrap();
    let (events, dropped) = a.history();
    assert!(dropped > 0);
    let categories: Vec<_> = (events.iter())
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| e.category.map(|c| c.name()))
        .collect();
    assert_eq!(
        categories.last(),
        Some(&Some(Category::OptimizerState.name()))
    );
    for b in [weight, saved, third, fourth] {
        a.free(b).unwrap();
    }
    a.record_memory_history(0, false);
    a.empty_cache().unwrap();
}

// Here rather than beside `frames_of`: a test inside the allocator's own folder has its
// frames taken for the allocator's in a release build, whose inlined frames carry only
// their file. Never inlined: a binary stripped of its debug info (the GPU bundle's) has
// no frame for a function inlined into its caller, only symbols.
#[test]
#[inline(never)]
fn frames_start_at_the_caller() {
    let frames = labs_core::alloc::frames_of(&std::backtrace::Backtrace::force_capture());
    assert!(
        frames[0].name.contains("frames_start_at_the_caller"),
        "{frames:?}"
    );
    // File and line come from debug info, which a stripped binary no longer has.
    let f = &frames[0];
    assert!(
        f.filename.is_empty() || (f.filename.ends_with("history.rs") && f.line > 0),
        "{f:?}"
    );
    assert!(!frames.iter().any(|f| f.name.starts_with("std::rt::")));
}
