//! Out-of-memory failures that explain themselves: the report's figures against the
//! allocator's state, the suggestion each cause gets, the observers and the snapshot
//! taken at the failure. Runs on the simulated GPU by default and on the GPU with
//! `LABS_DEVICE=cuda`; each test uses a private allocator capped at a few hundred MiB,
//! so that it fails the same way on a 16 GiB simulator and an 80 GB GPU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use labs_core::alloc::{Allocation, Allocator, Category, Config};
use labs_core::oom_report::{OomReport, Suggestion};
use labs_core::testing::test_device;
use labs_core::{Device, Error};

const MIB: u64 = 1 << 20;

/// A private allocator of `conf` allowed about `bytes`.
fn capped(device: &Device, bytes: u64, conf: &str) -> Allocator {
    let a = Allocator::new(device.backend_arc(), Config::parse(conf).unwrap()).unwrap();
    let total = device.mem_info().unwrap().total;
    a.set_memory_fraction(bytes as f64 / total as f64).unwrap();
    a
}

fn report_of(e: &Error) -> &OomReport {
    match e {
        Error::OutOfMemory {
            report: Some(r), ..
        } => r,
        other => panic!("expected an out-of-memory error with a report, got {other}"),
    }
}

/// Fills `a` with 40 MiB blocks until it fails, returning them.
fn fill(a: &Allocator, device: &Device, size: u64) -> Vec<Allocation> {
    let stream = device.default_stream().unwrap();
    let mut live = Vec::new();
    loop {
        match a.malloc(size as usize, &stream) {
            Ok(b) => live.push(b),
            Err(e) if e.is_out_of_memory() => return live,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn the_reports_figures_match_the_allocator() {
    let d = test_device();
    // Fixed segments of exactly 40 MiB each (large requests get their own segment).
    let a = capped(&d, 400 * MIB, "expandable_segments:False");
    let stream = d.default_stream().unwrap();
    let mut live = fill(&a, &d, 40 * MIB);
    assert!(live.len() >= 8, "only {} blocks fit", live.len());
    // Free every other block: half the memory is cached, in 40 MiB pieces.
    let kept: Vec<Allocation> = live
        .drain(..)
        .enumerate()
        .filter_map(|(i, b)| {
            if i % 2 == 0 {
                a.free(b).unwrap();
                None
            } else {
                Some(b)
            }
        })
        .collect();
    // More than the limit leaves once the cache is released (the retry ladder
    // releases it before failing).
    let err = a.malloc(300 * MIB as usize, &stream).unwrap_err();
    let r = report_of(&err);
    assert_eq!(r.allocated, a.memory_allocated());
    assert_eq!(r.reserved, a.memory_reserved());
    assert_eq!(r.allocated, kept.iter().map(|b| b.size()).sum::<u64>());
    assert!(r.fraction < 1.0);
    assert!(r.reserved <= r.limit);
    // The largest live allocations are the kept 40 MiB blocks, largest first.
    assert_eq!(r.largest_live.len(), kept.len().min(5));
    assert!(r
        .largest_live
        .iter()
        .all(|l| l.size == 40 * MIB && l.category == "other"));
    let text = err.to_string();
    assert!(text.contains("Tried to allocate 300.00 MiB."), "{text}");
    assert!(text.contains("Largest live allocations:"), "{text}");
    assert!(text.contains("Suggestion: "), "{text}");
    // Filling failed once, this request once.
    assert_eq!(a.stats().num_ooms, 2);
    let (history, _) = a.history();
    assert!(history.is_empty(), "no history was asked for");
    for b in kept {
        a.free(b).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn cached_pieces_too_small_suggest_expandable_segments() {
    let d = test_device();
    let a = capped(&d, 200 * MIB, "expandable_segments:False");
    let stream = d.default_stream().unwrap();
    // Small blocks share 2 MiB segments; free all but one per segment so no segment
    // can be released, then ask for more than any piece while less than what is cached.
    let mut live = fill(&a, &d, 512 * 1024);
    let segment_blocks = 4; // four 512 KiB blocks per 2 MiB small segment
    let kept: Vec<Allocation> = live
        .drain(..)
        .enumerate()
        .filter_map(|(i, b)| {
            if i % segment_blocks == 0 {
                Some(b)
            } else {
                a.free(b).unwrap();
                None
            }
        })
        .collect();
    let cached = a.memory_reserved() - a.memory_allocated();
    assert!(cached >= 100 * MIB, "cached {cached}");
    // Large requests cannot use small-pool pieces, and the limit leaves no room for a
    // new segment: the request fails with most of the memory cached.
    let err = a.malloc(20 * MIB as usize, &stream).unwrap_err();
    let r = report_of(&err);
    assert_eq!(r.free_pieces, kept.len() as u64);
    assert_eq!(r.largest_free, 3 * 512 * 1024);
    assert_eq!(r.suggestion, Suggestion::ExpandableSegments, "{err}");
    assert!(err.to_string().contains("expandable_segments:True"));
    for b in kept {
        a.free(b).unwrap();
    }
}

#[test]
fn a_memory_fraction_is_named_when_it_is_the_limit() {
    let d = test_device();
    let a = capped(&d, 256 * MIB, "expandable_segments:True");
    let live = fill(&a, &d, 32 * MIB);
    let err = a
        .malloc(32 * MIB as usize, &d.default_stream().unwrap())
        .unwrap_err();
    let r = report_of(&err);
    assert_eq!(r.suggestion, Suggestion::RaiseMemoryFraction, "{err}");
    let text = err.to_string();
    assert!(text.contains("The memory fraction"), "{text}");
    assert!(text.contains("set_per_process_memory_fraction"), "{text}");
    for b in live {
        a.free(b).unwrap();
    }
}

#[test]
fn a_request_larger_than_the_device_says_so() {
    let d = test_device();
    let a = Allocator::new(d.backend_arc(), Config::default()).unwrap();
    let total = d.mem_info().unwrap().total;
    let err = a
        .malloc((total + total / 2) as usize, &d.default_stream().unwrap())
        .unwrap_err();
    assert_eq!(report_of(&err).suggestion, Suggestion::RequestExceedsDevice);
    assert!(err.to_string().contains("fits under no setting"), "{err}");
}

#[test]
fn live_allocations_carry_their_category_and_site() {
    let d = test_device();
    let a = capped(&d, 128 * MIB, "expandable_segments:True");
    a.record_memory_history(1000, true);
    let stream = d.default_stream().unwrap();
    let big = {
        let _c = Category::Activation.scope();
        a.malloc(64 * MIB as usize, &stream).unwrap()
    };
    let err = a.malloc(100 * MIB as usize, &stream).unwrap_err();
    let r = report_of(&err);
    let first = &r.largest_live[0];
    assert_eq!((first.size, first.category), (64 * MIB, "activation"));
    let site = first
        .site
        .as_deref()
        .expect("the history records backtraces");
    assert!(site.contains("oom"), "site {site:?} is not in this test");
    a.free(big).unwrap();
}

#[test]
fn observers_run_before_the_error_returns_and_a_snapshot_is_written() {
    let d = test_device();
    let dir = std::env::temp_dir().join(format!("labs-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("oom.json");
    let conf = format!("expandable_segments:True,oom_snapshot:{}", path.display());
    let a = capped(&d, 64 * MIB, &conf);
    let seen = Arc::new(AtomicU64::new(0));
    let count = seen.clone();
    a.attach_out_of_memory_observer(move |alloc, e| {
        // The lock is not held: the observer may read the allocator.
        assert!(alloc.memory_allocated() > 0);
        assert!(e.is_out_of_memory());
        count.fetch_add(1, Ordering::SeqCst);
    });
    let stream = d.default_stream().unwrap();
    let held = a.malloc(48 * MIB as usize, &stream).unwrap();
    assert!(a.malloc(48 * MIB as usize, &stream).is_err());
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    let (snapshot, _) = labs_core::snapshot::load_file(&path).unwrap();
    assert!(!snapshot.segments.is_empty());
    // A request that succeeds runs no observer.
    a.free(held).unwrap();
    let again = a.malloc(48 * MIB as usize, &stream).unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    a.free(again).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
