//! Grades the workshop exercises (`src/exercises/`): the recount against a real
//! allocator's statistics on the device under test, and the snapshot readings against
//! `lab-03 summary --json` on PyTorch's own snapshot and against the allocator that
//! wrote a snapshot of ours.

use std::path::PathBuf;
use std::process::Command;

use lab_03::exercises::{largest_cached_block, peak_live_bytes, recount, Counters};
use labs_core::alloc::{Allocator, BlockState, Config};
use labs_core::snapshot::{self, Summary};
use labs_core::testing::{data_dir, lab_binary, one_json_object, test_device};
use labs_core::Device;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Fixed segments (the default, PyTorch's) and expandable ones, whose
/// reserved memory is not their size.
const CONFS: [&str; 2] = ["expandable_segments:False", "expandable_segments:True"];

fn allocator(device: &Device, conf: &str) -> Allocator {
    Allocator::new(device.backend_arc(), Config::parse(conf).unwrap()).unwrap()
}

/// The allocator's own figures, read the way a PyTorch user reads them.
fn counters_of(a: &Allocator) -> Counters {
    Counters {
        allocated: a.memory_allocated(),
        reserved: a.memory_reserved(),
        active: a.memory_stats()["active_bytes.all.current"],
    }
}

/// Runs a short script of allocations and frees on the device under test, with the
/// history recorded, and calls `check` after every step. The script ends with cached
/// blocks in both pools and, for one step, a 40 MiB block freed while another stream
/// still uses it (pending: active but not allocated), larger than any cached block.
fn run_script(conf: &str, mut check: impl FnMut(&Allocator)) -> Allocator {
    let device = test_device();
    let (s0, s1) = (
        device.default_stream().unwrap(),
        device.new_stream().unwrap(),
    );
    let a = allocator(&device, conf);
    a.record_memory_history(10_000, false);
    check(&a);
    let mut live = Vec::new();
    for size in [3000, 700 * KIB, 40 * MIB, 24 * MIB, 3 * MIB, 512] {
        live.push(a.malloc(size, &s0).unwrap());
        check(&a);
    }
    let [small, mid, pending, large, medium, scalar] = live.try_into().unwrap();
    a.free(small).unwrap();
    check(&a);
    a.free(large).unwrap();
    check(&a);
    a.record_stream(&pending, &s1).unwrap();
    a.free(pending).unwrap();
    check(&a);
    // The next request collects the pending block (the other stream has no work
    // queued) and reuses cached memory.
    let again = a.malloc(2 * MIB + 512, &s0).unwrap();
    check(&a);
    for block in [mid, medium, scalar, again] {
        a.free(block).unwrap();
    }
    check(&a);
    a
}

#[test]
fn recount_matches_the_allocators_statistics() {
    for conf in CONFS {
        let (mut steps, mut apart) = (0, false);
        run_script(conf, |a| {
            let want = counters_of(a);
            assert_eq!(recount(&a.segments()), want, "{conf}, step {steps}");
            // The script must tell the three figures apart (a pending block makes
            // active exceed allocated), or a recount that confuses them would pass.
            apart |= want.allocated < want.active && want.active < want.reserved;
            steps += 1;
        });
        assert!(apart, "{conf}: allocated < active < reserved at no step");
    }
}

/// A snapshot of the script's allocator after every step, each with the allocator's
/// largest free block and its peak of requested bytes.
fn our_snapshots(conf: &str) -> Vec<(snapshot::Snapshot, u64, u64)> {
    let mut out = Vec::new();
    run_script(conf, |a| {
        let largest_free = a
            .segments()
            .iter()
            .flat_map(|s| s.blocks.clone())
            .filter(|b| b.state == BlockState::Free)
            .map(|b| b.size)
            .max()
            .unwrap_or(0);
        out.push((a.snapshot(), largest_free, a.stats().requested.all.peak));
    });
    out
}

#[test]
fn largest_cached_block_matches_the_allocator_and_the_summary() {
    for conf in CONFS {
        let snapshots = our_snapshots(conf);
        assert!(
            snapshots.len() >= 8,
            "{conf}: {} snapshots",
            snapshots.len()
        );
        let mut nonzero = false;
        for (i, (snap, largest_free, _)) in snapshots.iter().enumerate() {
            let answer = largest_cached_block(snap);
            assert_eq!(
                answer,
                Summary::of(snap).largest_inactive_block,
                "{conf}, snapshot {i}"
            );
            if conf == "expandable_segments:False" {
                // With fixed segments the snapshot's blocks are the allocator's (with
                // expandable ones, a free block's unmapped pages are left out).
                assert_eq!(answer, *largest_free, "{conf}, snapshot {i}");
            }
            nonzero |= answer > 0;
        }
        assert!(nonzero, "{conf}: never a cached block");
    }
}

#[test]
fn peak_live_bytes_matches_the_allocators_peak_requested() {
    for conf in CONFS {
        for (i, (snap, _, peak_requested)) in our_snapshots(conf).iter().enumerate() {
            // The history was recorded from the allocator's first request, so the
            // trace's peak is the allocator's own peak of requested bytes.
            assert_eq!(
                peak_live_bytes(snap),
                *peak_requested,
                "{conf}, snapshot {i}"
            );
            assert_eq!(
                peak_live_bytes(snap),
                Summary::of(snap).trace_peak_requested_bytes,
                "{conf}, snapshot {i}"
            );
        }
    }
}

/// A history switched on mid-run, as a ring buffer that dropped its oldest events
/// looks: the trace frees a block it never saw allocated.
#[test]
fn peak_live_bytes_ignores_frees_of_blocks_allocated_before_the_trace() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "");
    let early = a.malloc(8 * MIB, &stream).unwrap();
    a.record_memory_history(10_000, false);
    let first = a.malloc(MIB, &stream).unwrap();
    a.free(early).unwrap();
    let second = a.malloc(2 * MIB, &stream).unwrap();
    let snap = a.snapshot();
    assert_eq!(
        peak_live_bytes(&snap),
        Summary::of(&snap).trace_peak_requested_bytes
    );
    // Only what the trace saw allocated: the early block is not in it.
    assert_eq!(peak_live_bytes(&snap), (3 * MIB) as u64);
    a.free(first).unwrap();
    a.free(second).unwrap();
}

fn mlp_path() -> PathBuf {
    data_dir().join("snapshots/mlp_adam.pickle")
}

/// `lab-03 summary --json` of PyTorch's snapshot.
fn mlp_summary_json() -> serde_json::Value {
    let out = Command::new(lab_binary("lab-03", env!("CARGO_BIN_EXE_lab-03")))
        .arg("summary")
        .arg(mlp_path())
        .arg("--json")
        .output()
        .expect("the lab binary runs");
    one_json_object(out)
}

#[test]
fn the_exercises_read_pytorchs_snapshot_as_lab_03_summary_does() {
    let (snap, _) = snapshot::load_file(mlp_path()).unwrap();
    let v = mlp_summary_json();
    let largest = largest_cached_block(&snap);
    let peak = peak_live_bytes(&snap);
    assert_eq!(Some(largest), v["largest_inactive_block"].as_u64());
    assert_eq!(Some(peak), v["trace_peak_requested_bytes"].as_u64());
    // What the figures mean: a cached block is part of reserved memory, and the live
    // peak is at least what is allocated at the end.
    assert!(largest > 0 && largest <= v["reserved_bytes"].as_u64().unwrap());
    assert!(peak >= v["requested_bytes"].as_u64().unwrap());
}
