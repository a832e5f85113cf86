//! Lab 5's experiments and exercises on the device under test (the simulated GPU here,
//! the GPU with `LABS_DEVICE=cuda`). Experiments that cap the device's own allocator
//! run one at a time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lab_05::exercises::{account, diagnose, fits_on, largest_fitting, step_or_halve, Accounting};
use lab_05::model::{train_run, MlpSpec, Trainer};
use lab_05::{capped, explain, finder, fit, fragmentation, pending_free, recovery};
use labs_core::alloc::{Allocation, Allocator, Category, Config};
use labs_core::oom_report::{OomReport, Suggestion};
use labs_core::snapshot::{self, BlockState, SegmentType, Snapshot};
use labs_core::testing::{fuzz_cases, fuzz_seed, serial, test_device};
use labs_core::{Device, Error};

const MIB: u64 = 1 << 20;

/// A small model, quick on the simulated GPU.
const SPEC: MlpSpec = MlpSpec {
    input: 64,
    hidden: 128,
    layers: 2,
    output: 16,
};

#[test]
fn the_provoked_error_reports_what_was_held_and_the_right_cause() {
    let _g = serial();
    let d = test_device();
    let whole = explain::provoke(&d, 1.0).unwrap();
    let r = &whole.report;
    // One parameter block and four activations; nothing cached.
    assert_eq!(r.largest_live.len(), 5);
    assert_eq!(
        r.largest_live
            .iter()
            .filter(|l| l.category == "activation")
            .count(),
        4
    );
    assert_eq!(r.activations, 4 * r.largest_live[0].size);
    assert_eq!(r.allocated, r.activations + r.largest_live[4].size);
    assert_eq!(r.reserved, r.allocated);
    assert_eq!(
        r.suggestion,
        Suggestion::CheckpointOrSmallerBatch,
        "{}",
        whole.error
    );
    assert_eq!(whole.observer_calls, 1);
    assert_eq!(whole.observer_saw_allocated, r.allocated);
    assert!(r.largest_live[0]
        .site
        .as_deref()
        .is_some_and(|s| s.contains("explain.rs") || s.contains("allocate_activations")));

    let capped = explain::provoke(&d, 0.25).unwrap();
    assert_eq!(capped.report.suggestion, Suggestion::RaiseMemoryFraction);
    assert!(capped
        .error
        .to_string()
        .contains("The memory fraction 0.25 allows"));
}

#[test]
fn fixed_segments_fragment_where_expandable_segments_serve_the_request() {
    let _g = serial();
    let d = test_device();
    let fixed = fragmentation::run(&d, false).unwrap();
    let expandable = fragmentation::run(&d, true).unwrap();
    // The same sequence: as many 5 MiB blocks before the cap under both settings.
    assert_eq!(fixed.blocks, expandable.blocks);
    assert_eq!(
        fixed.blocks as u64,
        fragmentation::CAP / fragmentation::BLOCK
    );
    assert_eq!(fixed.allocated, expandable.allocated);
    let (pieces, largest, suggestion) = fixed.pieces.expect("fixed segments fail");
    // One free run of three blocks in each 20 MiB segment.
    assert_eq!(pieces, fixed.blocks as u64 / 4);
    assert_eq!(largest, 3 * fragmentation::BLOCK);
    assert_eq!(suggestion, Suggestion::ExpandableSegments);
    assert!(expandable.error.is_none(), "{:?}", expandable.error);
    assert!(expandable.unmaps > 0);
}

#[test]
fn a_pending_cross_stream_free_is_waited_for_not_reported_as_out_of_memory() {
    let _g = serial();
    let d = test_device();
    let busy = Duration::from_millis(200);
    let p = pending_free::run(&d, busy).unwrap();
    assert_eq!(p.deferred_before, 1);
    assert!(p.served && p.same_block, "{p:?}");
    assert_eq!((p.num_ooms, p.num_alloc_retries), (0, 0));
    // It waited for the side stream's work, most of which was still queued.
    assert!(p.waited >= busy / 4, "{p:?}");
}

#[test]
fn recovery_halves_the_batch_and_returns_to_the_baseline_after_each_failure() {
    let _g = serial();
    let d = test_device();
    let spec = MlpSpec::for_device(&d);
    let r = recovery::run(&d, spec).unwrap();
    let (last, failed) = r.attempts.split_last().unwrap();
    assert!(last.ok);
    assert!(!failed.is_empty(), "the first batch must not fit: {r:?}");
    for a in failed {
        assert!(!a.ok);
        assert_eq!(a.allocated, r.baseline, "{r:?}");
    }
    assert_eq!(last.allocated, r.baseline);
    for w in r.attempts.windows(2) {
        assert_eq!(w[1].batch, w[0].batch / 2);
    }
    assert_eq!(
        d.allocator().unwrap().config().per_process_memory_fraction,
        1.0
    );
}

/// Caps the device's allocator at `bytes` above what it holds now, for `f`.
fn under_cap<T>(d: &Device, bytes: u64, f: impl FnOnce() -> T) -> T {
    let a = d.allocator().unwrap();
    a.empty_cache().unwrap();
    let total = d.mem_info().unwrap().total;
    a.set_memory_fraction((a.memory_reserved() + bytes) as f64 / total as f64)
        .unwrap();
    let out = f();
    a.set_memory_fraction(1.0).unwrap();
    out
}

#[test]
fn the_finder_finds_a_batch_that_runs_where_one_more_does_not_and_leaves_the_allocator_clean() {
    let _g = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    a.empty_cache().unwrap();
    let before = (a.memory_allocated(), a.memory_reserved());
    let (search, found_runs, one_more) = under_cap(&d, 8 * MIB, || {
        let search = finder::find_for_training(&d, SPEC, 2, 1 << 16).unwrap();
        let runs = train_run(&d, SPEC, search.batch, 2);
        a.empty_cache().unwrap();
        let more = train_run(&d, SPEC, search.batch + 1, 2);
        a.empty_cache().unwrap();
        (search, runs, more)
    });
    assert!(search.batch > 1, "{search:?}");
    found_runs.unwrap();
    assert!(one_more.unwrap_err().is_out_of_memory());
    assert_eq!((a.memory_allocated(), a.memory_reserved()), before);
    // Doubling, then a binary search: about 2 log2 of the batch.
    let log = usize::BITS - search.batch.leading_zeros();
    assert!(search.trials.len() <= 2 * log as usize + 2, "{search:?}");
}

#[test]
fn the_dry_run_predicts_the_peaks_of_a_real_run_on_a_simulated_gpu_of_that_size() {
    let _g = serial();
    let capacity = 64 * MIB;
    // A real run on a simulated GPU of the same capacity: the same peaks.
    let sim = Device::new_sim(capacity);
    let p = fit::predict(&sim, capacity, SPEC, 2, 1 << 16).unwrap();
    assert_eq!(p.one_more_fits(), Some(false));
    assert!(p.max_reserved <= capacity);
    let c = fit::check(&sim, &p, SPEC, 2).unwrap();
    assert_eq!(
        (c.max_allocated, c.max_reserved),
        (p.max_allocated, p.max_reserved)
    );
    assert!(!c.one_more_fits);
}

#[test]
fn exercise_step_or_halve_recovers_to_the_baseline() {
    let _g = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    let mut t = Trainer::new(&d, SPEC).unwrap();
    t.step(4).unwrap();
    a.empty_cache().unwrap();
    let baseline = a.memory_allocated();
    let ran = under_cap(&d, 4 * MIB, || step_or_halve(&mut t, 1 << 14)).unwrap();
    assert!((1..1 << 14).contains(&ran), "{ran}");
    assert_eq!(a.memory_allocated(), baseline);
    assert!(t.model_device().same(&d));
    for p in t.optimizer_params() {
        assert!(p.grad().is_none());
    }
}

#[test]
fn exercise_largest_fitting_searches_like_the_finder() {
    for limit in [1usize, 2, 3, 37, 64, 65, 1000] {
        let mut calls = 0;
        let got = largest_fitting(1 << 12, |b| {
            calls += 1;
            b <= limit
        });
        assert_eq!(got, limit);
        let log = (usize::BITS - limit.leading_zeros()) as usize;
        assert!(calls <= 2 * log + 2, "{limit}: {calls} calls");
    }
    assert_eq!(largest_fitting(100, |_| true), 100);
    assert_eq!(largest_fitting(100, |_| false), 0);
}

#[test]
fn exercise_fits_on_decides_on_a_dry_run() {
    let capacity = 64 * MIB;
    let p = fit::predict(&Device::new_dry(capacity), capacity, SPEC, 1, 1 << 16).unwrap();
    assert!(fits_on(capacity, SPEC, p.search.batch, 1).unwrap());
    assert!(!fits_on(capacity, SPEC, p.search.batch + 1, 1).unwrap());
}

// Exercise 4: the out-of-memory report rebuilt from a snapshot. Each failure below is
// a real one, on a private allocator of the device under test; an observer takes the
// snapshot when the request fails for good, and the student's figures and suggestion
// must be the allocator's own report's.

/// An observer on `a` that keeps the snapshot of the last failure.
fn snapshot_on_oom(a: &Allocator) -> Arc<Mutex<Option<Snapshot>>> {
    let slot = Arc::new(Mutex::new(None));
    let s = slot.clone();
    a.attach_out_of_memory_observer(move |alloc, _| {
        *s.lock().unwrap() = Some(alloc.snapshot());
    });
    slot
}

/// Grades one failure: the student's figures and suggestion against the report's.
fn graded(what: &str, error: &Error, slot: &Mutex<Option<Snapshot>>) -> Suggestion {
    let Error::OutOfMemory {
        requested,
        total,
        report: Some(r),
        ..
    } = error
    else {
        panic!("{what}: not an out-of-memory error with a report: {error}");
    };
    let snapshot = slot
        .lock()
        .unwrap()
        .take()
        .expect("the observer took a snapshot");
    let want = Accounting {
        allocated: r.allocated,
        reserved: r.reserved,
        free_pieces: r.free_pieces,
        largest_free: r.largest_free,
        activations: r.activations,
    };
    let got = account(&snapshot);
    assert_eq!(got, want, "{what}: the figures of\n{error}");
    assert_eq!(
        diagnose(&got, *requested, *total, r.fraction),
        r.suggestion,
        "{what}: the suggestion of\n{error}"
    );
    r.suggestion
}

/// A private allocator on `d` with the memory fraction `fraction`.
fn private(d: &Device, conf: &str, fraction: f64) -> Allocator {
    let a = Allocator::new(d.backend_arc(), Config::parse(conf).unwrap()).unwrap();
    a.set_memory_fraction(fraction).unwrap();
    a
}

/// `bytes` on `a` under `category`.
fn malloc_as(a: &Allocator, bytes: u64, category: Category) -> Result<Allocation, Error> {
    let _c = category.scope();
    a.malloc(bytes as usize, &a_stream())
}

/// The default stream of the device under test, on which every private allocator here
/// allocates.
fn a_stream() -> labs_core::Stream {
    test_device().default_stream().unwrap()
}

/// The first experiment's failure: parameters of an eighth of the limit, four blocks of
/// a sixth each under `held`, then a quarter more.
fn provoke(d: &Device, fraction: f64, held: Category) -> Suggestion {
    let a = private(d, "expandable_segments:False", fraction);
    let slot = snapshot_on_oom(&a);
    let limit = (d.mem_info().unwrap().total as f64 * fraction) as u64;
    let unit = |n: u64| (limit / n) >> 21 << 21;
    let mut live = vec![malloc_as(&a, unit(8), Category::Parameter).unwrap()];
    for _ in 0..4 {
        live.push(malloc_as(&a, unit(6), held).unwrap());
    }
    let error = a.malloc(unit(4) as usize, &a_stream()).unwrap_err();
    // Everything is freed before grading, so that a failed grade leaves the device as
    // the other tests expect it.
    for b in live {
        a.free(b).unwrap();
    }
    graded(
        &format!("fraction {fraction}, four blocks of {held}"),
        &error,
        &slot,
    )
}

/// The fragmentation experiment's requests, then a request of `request` bytes.
fn fragment(d: &Device, expandable: bool, request: u64) -> Suggestion {
    let conf = format!(
        "expandable_segments:{}",
        if expandable { "True" } else { "False" }
    );
    let a = capped(d, fragmentation::CAP, &conf).unwrap();
    let slot = snapshot_on_oom(&a);
    let mut live = Vec::new();
    while let Ok(b) = a.malloc(fragmentation::BLOCK as usize, &a_stream()) {
        live.push(b);
    }
    *slot.lock().unwrap() = None;
    let mut kept = Vec::new();
    for (i, b) in live.into_iter().enumerate() {
        if i % 4 == 0 {
            kept.push(b);
        } else {
            a.free(b).unwrap();
        }
    }
    let error = a.malloc(request as usize, &a_stream()).unwrap_err();
    for b in kept {
        a.free(b).unwrap();
    }
    let what = format!("fragmentation, expandable_segments:{expandable}, {request} bytes");
    graded(&what, &error, &slot)
}

#[test]
fn exercise_report_explains_the_chapters_failures() {
    let _g = serial();
    let d = test_device();
    let mut seen = vec![
        provoke(&d, 1.0, Category::Activation),
        provoke(&d, 1.0, Category::Other),
        provoke(&d, 0.25, Category::Activation),
        fragment(&d, false, fragmentation::REQUEST),
        fragment(&d, true, fragmentation::CAP),
    ];
    let a = private(&d, "expandable_segments:False", 1.0);
    let slot = snapshot_on_oom(&a);
    let too_large = d.mem_info().unwrap().total * 3 / 2;
    let error = a.malloc(too_large as usize, &a_stream()).unwrap_err();
    seen.push(graded("1.5 x the device", &error, &slot));
    for s in [
        Suggestion::RequestExceedsDevice,
        Suggestion::ExpandableSegments,
        Suggestion::RaiseMemoryFraction,
        Suggestion::CheckpointOrSmallerBatch,
        Suggestion::FreeOrSmallerBatch,
    ] {
        assert!(seen.contains(&s), "no failure called for {s:?}: {seen:?}");
    }
}

#[test]
fn exercise_report_accounts_for_random_traces() {
    let _g = serial();
    let d = test_device();
    let mut rng = fuzz_seed("exercise_report") | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let cases = fuzz_cases(12);
    for case in 0..cases {
        let expandable = case % 2 == 1;
        let conf = format!(
            "expandable_segments:{}",
            if expandable { "True" } else { "False" }
        );
        let a = capped(&d, 64 * MIB, &conf).unwrap();
        let slot = snapshot_on_oom(&a);
        let mut live: Vec<Allocation> = Vec::new();
        let error = loop {
            if !live.is_empty() && next(5) < 2 {
                let b = live.swap_remove(next(live.len() as u64) as usize);
                a.free(b).unwrap();
                continue;
            }
            // Small-pool blocks and large ones, some of them activations.
            let bytes = match next(3) {
                0 => 1 + next(MIB),
                _ => MIB + next(12 * MIB),
            };
            let category = if next(2) == 0 {
                Category::Activation
            } else {
                Category::Other
            };
            match malloc_as(&a, bytes, category) {
                Ok(b) => live.push(b),
                Err(e) if e.is_out_of_memory() => break e,
                Err(e) => panic!("{e}"),
            }
        };
        for b in live {
            a.free(b).unwrap();
        }
        graded(
            &format!("random trace {case} (expandable: {expandable})"),
            &error,
            &slot,
        );
    }
}

#[test]
fn exercise_report_counts_a_pending_free_as_cached_and_an_unmapped_range_as_nothing() {
    let block =
        |address: u64, size: u64, state: BlockState, category: Option<&str>| snapshot::Block {
            address,
            size,
            requested_size: if state == BlockState::Inactive {
                0
            } else {
                size
            },
            state,
            frames: Vec::new().into(),
            category: category.map(str::to_string),
        };
    let segment = |address: u64, expandable: bool, ty: SegmentType, blocks: Vec<_>| {
        let blocks: Vec<snapshot::Block> = blocks;
        snapshot::Segment {
            device: 0,
            address,
            total_size: blocks.iter().map(|b| b.size).sum(),
            stream: 0,
            segment_type: ty,
            is_expandable: expandable,
            segment_pool_id: (0, 0),
            blocks,
        }
    };
    let (large, small) = (SegmentType::Large, SegmentType::Small);
    let s = Snapshot {
        segments: vec![
            // A fixed segment: an activation, a block another stream still reads, and
            // a free piece.
            segment(
                0,
                false,
                large,
                vec![
                    block(0, 5 * MIB, BlockState::ActiveAllocated, Some("activation")),
                    block(5 * MIB, 5 * MIB, BlockState::ActivePendingFree, None),
                    block(10 * MIB, 10 * MIB, BlockState::Inactive, None),
                ],
            ),
            // One expandable segment with an unmapped range in the middle: two runs
            // of mapped pages, so two segments in the snapshot.
            segment(
                1 << 40,
                true,
                large,
                vec![
                    block(
                        1 << 40,
                        2 * MIB,
                        BlockState::ActiveAllocated,
                        Some("parameter"),
                    ),
                    block((1 << 40) + 2 * MIB, 2 * MIB, BlockState::Inactive, None),
                ],
            ),
            segment(
                (1 << 40) + 32 * MIB,
                true,
                large,
                vec![block(
                    (1 << 40) + 32 * MIB,
                    6 * MIB,
                    BlockState::Inactive,
                    None,
                )],
            ),
            segment(
                64 * MIB,
                false,
                small,
                vec![
                    block(
                        64 * MIB,
                        512 << 10,
                        BlockState::ActiveAllocated,
                        Some("other"),
                    ),
                    block(
                        (64 * MIB) + (512 << 10),
                        1536 << 10,
                        BlockState::Inactive,
                        None,
                    ),
                ],
            ),
        ],
        trace: Vec::new(),
        settings: Default::default(),
    };
    let got = account(&s);
    assert_eq!(
        got,
        Accounting {
            allocated: 7 * MIB + (512 << 10),
            reserved: 32 * MIB,
            free_pieces: 4,
            largest_free: 10 * MIB,
            activations: 5 * MIB,
        }
    );
    // 24.5 MiB cached, in pieces of at most 10 MiB.
    assert_eq!(
        diagnose(&got, 12 * MIB, 1 << 34, 1.0),
        Suggestion::ExpandableSegments
    );
    assert_eq!(
        diagnose(&got, 8 * MIB, 1 << 34, 1.0),
        Suggestion::CheckpointOrSmallerBatch
    );
}

#[test]
fn exercise_report_diagnoses_as_the_allocator_does() {
    let mut rng = fuzz_seed("exercise_diagnose") | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let capacity = 1024 * MIB;
    for _ in 0..fuzz_cases(2000) {
        // Figures in whole MiB, so that the boundaries of every rule are hit.
        let allocated = next(1100) * MIB;
        let reserved = allocated + next(300) * MIB;
        let largest_free = next(reserved - allocated + 1);
        let figures = Accounting {
            allocated,
            reserved,
            free_pieces: u64::from(largest_free > 0) + next(4),
            largest_free,
            activations: next(allocated / MIB + 1) * MIB,
        };
        let requested = next(1300) * MIB + next(2);
        let fraction = [1.0, 0.25, 0.5][next(3) as usize];
        let report = OomReport {
            allocated,
            private_pools_allocated: 0,
            reserved,
            limit: (capacity as f64 * fraction) as u64,
            fraction,
            expandable: false,
            free_pieces: figures.free_pieces,
            largest_free,
            activations: figures.activations,
            largest_live: Vec::new(),
            suggestion: Suggestion::FreeOrSmallerBatch,
        };
        assert_eq!(
            diagnose(&figures, requested, capacity, fraction),
            report.suggest(requested, capacity),
            "{figures:?}, a request of {requested} bytes, fraction {fraction}"
        );
    }
}
