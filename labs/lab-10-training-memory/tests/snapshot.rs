//! `train --snapshot FILE`: the whole run's allocator history as a memory snapshot,
//! from before the model is built, with each allocation's category; one file per rank
//! of a data-parallel run; and the dry run's trace the same as the device's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use labs_core::compare::{self, Side};
use labs_core::snapshot::{self, Snapshot, TraceAction};
use labs_core::testing::test_device;

mod common;
use common::{binary, device, small};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lab10-snapshot-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn train(device: &str, file: &Path, extra: &[&str]) -> Output {
    Command::new(binary())
        .args(["train", "--device", device, "--json", "--snapshot"])
        .arg(file)
        .args(small(2))
        .args(extra)
        .output()
        .unwrap()
}

fn trained(device: &str, file: &Path, extra: &[&str]) -> (serde_json::Value, Snapshot) {
    let report = labs_core::testing::one_json_object(train(device, file, extra));
    let (snap, _) = snapshot::load_file(file).expect("train --snapshot wrote a snapshot");
    (report, snap)
}

fn side<'a>(name: &str, snapshot: &'a Snapshot) -> Side<'a> {
    Side {
        name: name.into(),
        snapshot,
        device: snapshot.pick_device(None).unwrap(),
    }
}

#[test]
fn the_snapshot_holds_the_whole_run_with_categories() {
    let dir = scratch("whole");
    let file = dir.join("run.json");
    let (report, snap) = trained(&device(), &file, &[]);
    let allocs: Vec<_> = (snap.trace.iter())
        .filter(|e| e.action == TraceAction::Alloc)
        .collect();
    // Recorded from before the model is built: the first allocation is the matrix
    // products' workspace where the device has one (cuBLAS's, lent by the allocator),
    // and then a parameter.
    let workspace = test_device().gemm_workspace_bytes().unwrap() as u64;
    let model = match workspace {
        0 => &allocs[..],
        bytes => {
            assert_eq!(allocs[0].category.as_deref(), Some("other"));
            assert_eq!(allocs[0].size, bytes);
            &allocs[1..]
        }
    };
    assert_eq!(model[0].category.as_deref(), Some("parameter"));
    for c in ["parameter", "optimizer_state", "activation", "input"] {
        assert!(
            allocs.iter().any(|e| e.category.as_deref() == Some(c)),
            "no {c} in the trace"
        );
    }
    assert!(allocs.iter().any(|e| e.saved_by.is_some()));
    // The run frees all it allocated (the model too, before the snapshot is written),
    // but the workspace, which the device keeps as long as it lives.
    let frees = (snap.trace.iter())
        .filter(|e| e.action == TraceAction::FreeRequested)
        .count();
    assert_eq!(allocs.len() - usize::from(workspace > 0), frees);
    // The model's blocks are all small ones, split to 512 bytes: the trace's allocated
    // peak is the allocator's, which the report measured.
    let c = compare::compare(&side("run", &snap), &side("run", &snap), 0);
    assert_eq!(c.totals_a.peak_allocated, report["peak_allocated"]);
    assert_eq!(c.totals_a.peak_reserved, report["peak_reserved"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_dry_run_traces_what_the_device_does() {
    let dir = scratch("dry");
    let (on_device, on_dry) = (dir.join("device.json"), dir.join("dry.json"));
    let (_, a) = trained(&device(), &on_device, &[]);
    // The dry run takes the device's matrix-product workspace (32 MiB on an H100).
    let workspace = test_device().gemm_workspace_bytes().unwrap().to_string();
    let (_, b) = trained("dry", &on_dry, &["--gemm-workspace", &workspace]);
    let c = compare::compare(&side("device", &a), &side("dry", &b), 4);
    assert!(
        c.same_sequence,
        "{:?} vs {:?} after {} steps",
        c.first_step_a, c.first_step_b, c.same_steps
    );
    assert_eq!(c.segment_divergence, None);
    assert_eq!(c.totals_a, c.totals_b);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn data_parallel_ranks_write_one_snapshot_each() {
    let dir = scratch("ranks");
    let file = dir.join("ddp.json");
    let out = train("dry", &file, &["--nproc", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!file.exists());
    for rank in 0..2 {
        let (snap, _) = snapshot::load_file(dir.join(format!("ddp.json.rank{rank}"))).unwrap();
        assert!(snap.trace.iter().any(|e| e.action == TraceAction::Alloc));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn call_sites_are_recorded_on_request() {
    let dir = scratch("stacks");
    let file = dir.join("stacks.json");
    let (_, snap) = trained("dry", &file, &["--snapshot-stacks", "--steps", "1"]);
    let first = (snap.trace.iter())
        .find(|e| e.action == TraceAction::Alloc)
        .unwrap();
    let origin = labs_core::alloc::origin_of(&first.frames);
    assert!(
        origin.op.is_some() || origin.at.is_some(),
        "{:?}",
        first.frames
    );
    // Without --snapshot, --snapshot-stacks is refused.
    let out = Command::new(binary())
        .args(["train", "--device", "dry", "--snapshot-stacks"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--snapshot"));
    std::fs::remove_dir_all(dir).unwrap();
}
