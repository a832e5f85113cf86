//! Lab 5's experiments and exercises on the device under test (the simulated GPU here,
//! the GPU with `LABS_DEVICE=cuda`). Experiments that cap the device's own allocator
//! run one at a time.

use std::time::Duration;

use lab_05::exercises::{fits_on, largest_fitting, step_or_halve};
use lab_05::model::{train_run, MlpSpec, Trainer};
use lab_05::{explain, finder, fit, fragmentation, pending_free, recovery};
use labs_core::oom_report::Suggestion;
use labs_core::testing::{serial, test_device};
use labs_core::Device;

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
