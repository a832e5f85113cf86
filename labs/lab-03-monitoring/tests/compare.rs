//! `compare A B`: totals, blocks at the peak and the first different segment event, on
//! snapshots built here with known answers, on PyTorch's pickle against our JSON of it,
//! and on one program traced on the device under test and on the dry-run device.

use std::path::Path;

use labs_core::compare::{self, Side, Step};
use labs_core::snapshot::{self, Frame, Snapshot, TraceAction, TraceEvent};
use labs_core::testing::{data_dir, test_device};
use labs_core::{DType, Device, Tensor};
use serde_json::Value;

mod common;
use common::{lab, scratch};

const MIB: u64 = 1 << 20;

fn compare_json(a: &Path, b: &Path) -> Value {
    let out = lab(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("compare --json prints one JSON object")
}

/// A trace written event by event: addresses handed out in order, frees by address.
#[derive(Default)]
struct Trace {
    events: Vec<TraceEvent>,
    next: u64,
}

impl Trace {
    fn push(&mut self, action: TraceAction, addr: u64, size: u64) -> &mut TraceEvent {
        self.events.push(TraceEvent {
            device: 0,
            action,
            addr,
            size,
            stream: 0,
            time_us: self.events.len() as i64,
            frames: Default::default(),
            category: None,
            saved_by: None,
        });
        self.events.last_mut().unwrap()
    }
    fn map(&mut self, size: u64) {
        self.push(TraceAction::SegmentMap, 0, size);
    }
    fn alloc(&mut self, size: u64) -> u64 {
        self.next += 1 << 32;
        let addr = self.next;
        self.push(TraceAction::Alloc, addr, size);
        addr
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.push(TraceAction::FreeRequested, addr, size);
        self.push(TraceAction::FreeCompleted, addr, size);
    }
    fn snapshot(self) -> Snapshot {
        Snapshot {
            trace: self.events,
            ..Default::default()
        }
    }
}

/// The same program of allocations; `b` maps 4 MiB more before its third step and
/// keeps one more 4 MiB block (labelled by its Python frame) at its peak.
fn program(b: bool) -> Snapshot {
    let mut t = Trace::default();
    t.map(2 * MIB);
    let x = t.alloc(MIB);
    t.events.last_mut().unwrap().category = Some("parameter".into());
    let y = t.alloc(512 * 1024);
    if b {
        t.map(4 * MIB);
    } else {
        t.map(2 * MIB);
    }
    let z = t.alloc(2 * MIB);
    t.events.last_mut().unwrap().category = Some("activation".into());
    t.events.last_mut().unwrap().saved_by = Some("MmBackward".into());
    if b {
        t.alloc(4 * MIB);
        t.events.last_mut().unwrap().frames = vec![
            Frame {
                name: "forward".into(),
                filename: "/usr/lib/python3/site-packages/torch/nn/modules/linear.py".into(),
                line: 125,
            },
            Frame {
                name: "step".into(),
                filename: "ci/pytorch-train.py".into(),
                line: 480,
            },
        ]
        .into();
    }
    t.free(y, 512 * 1024);
    t.free(z, 2 * MIB);
    t.free(x, MIB);
    t.snapshot()
}

#[test]
fn the_first_different_segment_event_is_found_with_the_events_around_it() {
    let (a, b) = (program(false), program(true));
    let side = |name: &str, s| Side {
        name: name.into(),
        snapshot: s,
        device: 0,
    };
    let c = compare::compare(&side("a", &a), &side("b", &b), 2);
    // B's extra 4 MiB block makes its sequence differ at the fourth step.
    assert_eq!(c.same_steps, 3);
    assert!(!c.same_sequence);
    assert_eq!(c.first_step_a, Some(Step::Free(512 * 1024)));
    assert_eq!(c.first_step_b, Some(Step::Alloc(4 * MIB)));
    let d = c.segment_divergence.expect("the second map differs");
    assert_eq!(d.matched, 1);
    let (ea, eb) = (d.a.unwrap(), d.b.unwrap());
    assert_eq!((ea.position, ea.size, ea.event), (2, 2 * MIB, 3));
    assert_eq!((eb.position, eb.size, eb.event), (2, 4 * MIB, 3));
    assert_eq!(ea.action, "segment_map");
    let events: Vec<usize> = d.context_a.iter().map(|l| l.event).collect();
    assert_eq!(events, [1, 2, 3, 4, 5]);
    assert_eq!(d.context_a[0].label.as_deref(), Some("parameter"));
    assert_eq!(
        d.context_a[3].label.as_deref(),
        Some("activation (MmBackward)")
    );
    // Totals: 3.5 MiB live at A's peak, 7.5 MiB at B's; reserved 4 and 6 MiB.
    assert_eq!(c.totals_a.peak_requested, 3 * MIB + MIB / 2);
    assert_eq!(c.totals_b.peak_allocated, 7 * MIB + MIB / 2);
    assert_eq!(c.totals_a.peak_reserved, 4 * MIB);
    assert_eq!(c.totals_b.peak_reserved, 6 * MIB);
    assert_eq!((c.totals_a.allocs, c.totals_a.frees), (3, 3));
    assert_eq!((c.totals_b.allocs, c.totals_b.frees), (4, 3));
    // At the peaks: the one difference is B's 4 MiB block, first, with its call site
    // (the program's frame, not PyTorch's).
    let first = &c.at_peak[0];
    assert_eq!((first.size, first.count_a, first.count_b), (4 * MIB, 0, 1));
    assert_eq!(first.difference, 4 * MIB as i64);
    assert_eq!(
        first.labels_b,
        [("pytorch-train.py:480 step".to_string(), 1)]
    );
    assert!(c.at_peak[1..].iter().all(|g| g.difference == 0));
    assert_eq!(c.at_peak.len(), 4);
}

#[test]
fn the_command_prints_the_tables_and_the_json() {
    let dir = scratch("cli");
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    snapshot::dump_to_file(&program(false), &a).unwrap();
    snapshot::dump_to_file(&program(true), &b).unwrap();
    let v = compare_json(&a, &b);
    assert_eq!(v["a"], "a.json");
    assert_eq!(v["same_steps"], 3);
    assert_eq!(v["segment_divergence"]["b"]["size"], 4 * MIB);
    assert_eq!(v["at_peak"][0]["difference"], 4 * MIB);
    let out = lab(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "Totals over each trace",
        "+4.00 MiB",
        "pytorch-train.py:480 step x1",
        "first different segment event, B",
        "segment_map 4.00 MiB after step 2 (event 3)",
        "Around the first different segment event: b.json",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn pytorchs_pickle_and_our_json_of_it_compare_as_the_same() {
    let dir = scratch("pickle");
    let pickle = data_dir().join("snapshots/mlp_adam.pickle");
    let (snap, _) = snapshot::load_file(&pickle).unwrap();
    let json = dir.join("mlp.json");
    snapshot::dump_to_file(&snap, &json).unwrap();
    let v = compare_json(&pickle, &json);
    assert_eq!(v["same_sequence"], true);
    assert_eq!(v["segment_divergence"], Value::Null);
    for side in ["totals_a", "totals_b"] {
        // The 16 segments of 236 MiB are all allocated within the trace.
        assert_eq!(v[side]["peak_reserved"], 247_463_936u64);
        assert_eq!(v[side]["reserved_at_start"], 0);
        assert_eq!(v[side]["final_segments"], 16);
        assert_eq!(v[side]["allocs"], 89);
    }
    let groups = v["at_peak"].as_array().unwrap();
    assert!(groups.iter().all(|g| g["difference"] == 0));
    let live: u64 = groups.iter().map(|g| g["count_a"].as_u64().unwrap()).sum();
    assert!(live > 0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_snapshot_without_a_trace_is_refused() {
    let dir = scratch("empty");
    let empty = dir.join("empty.json");
    snapshot::dump_to_file(&Snapshot::default(), &empty).unwrap();
    let out = lab(&["compare", empty.to_str().unwrap(), empty.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("has no trace to compare"), "{err}");
    let out = lab(&["compare", "/nonexistent/a.json", empty.to_str().unwrap()]);
    assert!(!out.status.success());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Small and large tensors made and dropped in an order that reuses, splits and grows
/// segments: returns what the program asks for at its busiest.
fn tensors(device: &Device) -> u64 {
    let make = |n: usize| Tensor::zeros(&[n], DType::F32, device).unwrap();
    let mut keep = Vec::new();
    for i in 0..6 {
        keep.push(make(30_000 + 1000 * i)); // small pool
        keep.push(make((3 << 20) / 4 + 4096 * i)); // large pool, 3 MiB and up
    }
    let busiest: u64 = keep.iter().map(|t| t.numel() as u64 * 4).sum();
    let mut i = 0;
    keep.retain(|_| {
        i += 1;
        i % 3 != 0 // every third goes: holes between live blocks
    });
    keep.push(make(12 << 20 >> 2)); // 12 MiB: a segment of its own
    keep.clear();
    busiest.max(12 << 20)
}

fn traced(device: &Device, file: &Path) -> u64 {
    let a = device.allocator().unwrap();
    a.empty_cache().unwrap();
    a.record_memory_history(100_000, false);
    let busiest = tensors(device);
    device.synchronize().unwrap();
    a.dump_snapshot(file).unwrap();
    a.record_memory_history(0, false);
    busiest
}

// ANCHOR: dry_vs_device
#[test]
fn the_dry_run_traces_the_device_under_tests_segment_events() {
    let dir = scratch("dry");
    let (on_device, on_dry) = (dir.join("device.json"), dir.join("dry.json"));
    let device = test_device();
    let busiest = traced(&device, &on_device);
    // The dry twin has the device's matrix-product workspace (32 MiB of its allocator
    // on an H100), so that both traces begin with the same segments.
    traced(&device.dry_twin(8 << 30).unwrap(), &on_dry);
    let v = compare_json(&on_dry, &on_device);
    assert_eq!(v["same_sequence"], true, "{v:#}");
    assert_eq!(v["segment_divergence"], Value::Null, "{v:#}");
    let (a, b) = (&v["totals_a"], &v["totals_b"]);
    for key in [
        "peak_requested",
        "peak_allocated",
        "peak_reserved",
        "allocs",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert!(a["peak_requested"].as_u64().unwrap() >= busiest);
    std::fs::remove_dir_all(dir).unwrap();
}
// ANCHOR_END: dry_vs_device
