//! Lab 3 through its command line and its library: the figures PyTorch's own snapshot
//! holds, the pictures, the exported trace, and the errors users get for bad input.

use std::path::Path;
use std::process::Command;

use labs_core::plot;
use labs_core::snapshot::{self, read_trace_csv, TraceAction};

mod common;
use common::{lab, mlp_path, scratch, stderr, stdout};

fn summary_json(file: &Path) -> serde_json::Value {
    let out = lab(&["summary", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text.trim().lines().count(),
        1,
        "one object on one line: {text}"
    );
    serde_json::from_str(text.trim()).expect("summary --json prints JSON")
}

fn assert_mlp_figures(v: &serde_json::Value) {
    assert_eq!(v["segments"], 16);
    assert_eq!(v["reserved_bytes"], 247_463_936u64);
    assert_eq!(v["allocated_bytes"], 190_902_784u64);
    assert_eq!(v["active_blocks"], 22);
    assert_eq!(v["trace_events"], 239);
    assert_eq!(v["trace_allocs"], 89);
}

#[test]
fn summary_json_of_the_pytorch_pickle_has_pytorchs_figures() {
    let v = summary_json(&mlp_path());
    assert_mlp_figures(&v);
    assert_eq!(v["source"], "pytorch-pickle");
}

#[test]
fn summary_of_our_json_dump_gives_the_same_figures() {
    let dir = scratch("json");
    let (snap, _) = snapshot::load_file(mlp_path()).unwrap();
    let path = dir.join("mlp.json");
    snapshot::dump_to_file(&snap, &path).unwrap();
    let v = summary_json(&path);
    assert_mlp_figures(&v);
    assert_eq!(v["source"], "labs-json");
    let tables = lab(&["summary", path.to_str().unwrap()]);
    assert!(tables.status.success());
    assert!(
        stdout(&tables).contains("236.00 MiB"),
        "{}",
        stdout(&tables)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn plot_writes_legible_svgs() {
    let dir = scratch("plot");
    let out = lab(&[
        "plot",
        mlp_path().to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    for (name, title) in plot::PICTURES {
        let svg = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{name}"
        );
        assert!(svg.contains(title), "{name} lacks its title");
        assert!(svg.contains("MiB"), "{name} lacks its unit");
        assert!(!svg.contains("<module>"), "{name} has raw markup in text");
    }
    let bands = std::fs::read_to_string(dir.join("active_memory.svg")).unwrap();
    assert!(bands.contains("all other allocations"));
    assert!(bands.contains("linear.py:134 forward"));
    let map = std::fs::read_to_string(dir.join("segments.svg")).unwrap();
    assert!(map.contains("active_pending_free") && map.contains("16 segments"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn export_trace_reads_back_with_the_snapshots_sums() {
    let dir = scratch("export");
    let path = dir.join("mlp.trace.csv.gz");
    let out = lab(&[
        "export-trace",
        mlp_path().to_str().unwrap(),
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let events = read_trace_csv(std::fs::File::open(&path).unwrap()).unwrap();
    let (snap, _) = snapshot::load_file(mlp_path()).unwrap();
    assert_eq!(events.len(), snap.trace.len());
    for action in [TraceAction::Alloc, TraceAction::FreeRequested] {
        let csv: u64 = events
            .iter()
            .filter(|e| e.action == action)
            .map(|e| e.size)
            .sum();
        let ours: u64 = snap
            .trace
            .iter()
            .filter(|e| e.action == action)
            .map(|e| e.size)
            .sum();
        assert_eq!(csv, ours, "{action}");
    }
    // Every freed address was allocated before: the file replays as it stands.
    let mut live = std::collections::HashSet::new();
    for e in &events {
        match e.action {
            TraceAction::Alloc => assert!(live.insert(e.addr)),
            TraceAction::FreeRequested => assert!(live.remove(&e.addr)),
            _ => {}
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_input_is_a_clear_error_with_a_non_zero_exit() {
    let dir = scratch("errors");
    let garbage = dir.join("garbage.bin");
    std::fs::write(&garbage, b"\x00\x01not a snapshot").unwrap();
    let truncated = dir.join("truncated.pickle");
    let bytes = std::fs::read(mlp_path()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let foreign = dir.join("foreign.json");
    std::fs::write(&foreign, br#"{"hello": "world"}"#).unwrap();
    let missing = dir.join("nope.pickle");
    let p = |p: &Path| p.to_str().unwrap().to_string();

    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["summary".into(), p(&missing)], "nope.pickle"),
        (vec!["summary".into(), p(&garbage)], "not a memory snapshot"),
        (vec!["summary".into(), p(&truncated)], "truncated"),
        (vec!["summary".into(), p(&foreign)], "labs-memory-snapshot"),
        (
            vec!["plot".into(), p(&truncated), "-o".into(), p(&dir)],
            "not a readable pickle",
        ),
        (
            vec![
                "export-trace".into(),
                p(&garbage),
                "-o".into(),
                p(&dir.join("x.gz")),
            ],
            "not a memory snapshot",
        ),
        (vec!["summary".into(), "--bogus".into()], "--bogus"),
        (
            vec![
                "demo".into(),
                "--device".into(),
                "tpu".into(),
                "-o".into(),
                p(&dir),
            ],
            "tpu",
        ),
    ];
    for (args, expect) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = lab(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The chapter's experiments, on the device under test: the readings of the loop, the
/// recorded history replayed to the same peaks, the pictures, and the planted leak.
#[test]
fn demo_runs_the_chapters_experiments() {
    let dir = scratch("demo");
    let out = lab(&["demo", "--quick", "--json", "-o", dir.to_str().unwrap()]);
    let v = labs_core::testing::one_json_object(out);
    let readings = v["readings"].as_array().unwrap();
    let at = |step: u64, phase: &str, key: &str| {
        readings
            .iter()
            .find(|r| r["step"] == step && r["phase"] == phase)
            .unwrap_or_else(|| panic!("no reading for step {step} {phase}"))[key]
            .as_u64()
            .unwrap()
    };
    for r in readings {
        assert!(r["reserved"].as_u64() >= r["allocated"].as_u64(), "{r}");
    }
    // Four weights of 512 x 512 f32; the first step adds Adam's two moments for each,
    // and the step's loss (256 f32) is alive until the caller drops it.
    let weights = 4 * 512 * 512 * 4;
    assert_eq!(at(0, "weights made", "allocated"), weights);
    assert_eq!(
        at(1, "after optimizer step", "allocated"),
        3 * weights + 1024
    );
    // From then on every step ends where the last one did.
    assert_eq!(
        at(3, "after optimizer step", "allocated"),
        at(2, "after optimizer step", "allocated")
    );
    assert_eq!(v["after_drop"]["allocated"], 0);
    assert!(
        v["after_drop"]["reserved"].as_u64().unwrap() > 0,
        "memory stays cached"
    );
    assert_eq!(v["after_empty_cache"]["reserved"], 0);

    let recorded = &v["recorded"];
    let replays = v["replays"].as_array().unwrap();
    assert_eq!(replays.len(), 2);
    for key in ["peak_requested", "peak_allocated", "peak_reserved"] {
        assert_eq!(
            replays[0][key], recorded[key],
            "{key}: the replay as recorded"
        );
    }
    assert_eq!(replays[1]["peak_requested"], recorded["peak_requested"]);

    for p in v["pictures"].as_array().unwrap() {
        let svg = std::fs::read_to_string(p.as_str().unwrap()).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("MiB"), "{p}");
    }
    let s = summary_json(Path::new(v["snapshot"].as_str().unwrap()));
    assert_eq!(s["reserved_bytes"], v["after_drop"]["reserved"]);
    assert_eq!(s["allocated_bytes"], 0);
    let mid = summary_json(Path::new(v["mid_step_snapshot"].as_str().unwrap()));
    assert_eq!(mid["allocated_bytes"], at(3, "after backward", "allocated"));
    let trace = std::fs::File::open(v["trace"].as_str().unwrap()).unwrap();
    let events = read_trace_csv(trace).unwrap();
    assert_eq!(s["trace_events"].as_u64().unwrap() as usize, events.len());

    // One loss of 256 f32 kept per step, and nothing once the values go to the host.
    assert_eq!(v["leak_blocks_per_step"], serde_json::json!([1, 1, 1]));
    assert_eq!(
        v["leak_bytes_per_step"],
        serde_json::json!([1024, 1024, 1024])
    );
    assert_eq!(v["fixed_leak_blocks"], 0);
    let report = v["leak_report"].as_str().unwrap();
    // The leaking step is named: by its path where symbols say it (debug builds, and
    // the GPU bundle's stripped ones), by its file where a release build's line tables
    // name an inlined frame by its bare name.
    assert!(
        report.contains("Trainer::step") || report.contains("lab-03-monitoring/src/training.rs"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A FIFO given as the snapshot: refused at once, naming it, rather than waiting
/// forever for a writer.
#[cfg(unix)]
#[test]
fn a_fifo_or_a_device_as_the_snapshot_is_refused_at_once() {
    let dir = scratch("fifo");
    let fifo = dir.join("snapshot.pickle");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let out_dir = dir.join("out");
    for (input, needle) in [(fifo.as_path(), "FIFO"), (Path::new("/dev/zero"), "device")] {
        let input = input.to_str().unwrap();
        for args in [
            vec!["summary", input],
            vec!["plot", input, "--out", out_dir.to_str().unwrap()],
        ] {
            let (out, in_time) = labs_core::testing::output_within(
                Command::new(labs_core::testing::lab_binary(
                    "lab-03",
                    env!("CARGO_BIN_EXE_lab-03"),
                ))
                .args(&args),
                std::time::Duration::from_secs(10),
            );
            assert!(in_time, "lab-03 {args:?} did not finish within 10 s");
            assert!(!out.status.success(), "{args:?}");
            let err = stderr(&out);
            assert!(
                err.contains(input) && err.contains(needle) && err.trim().lines().count() == 1,
                "{args:?}: {err}"
            );
        }
    }
}

/// `--max-snapshot-size` bounds the file read: a snapshot over it is refused, naming
/// the flag, and the same snapshot under a larger limit loads.
#[test]
fn max_snapshot_size_bounds_the_snapshot_read() {
    let path = mlp_path();
    let size = std::fs::metadata(&path).unwrap().len();
    let file = path.to_str().unwrap();
    let small = (size - 1).to_string();
    let out = lab(&["summary", file, "--max-snapshot-size", &small]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(file) && err.contains("--max-snapshot-size") && err.contains(&small),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let out = lab(&["summary", file, "--max-snapshot-size", &size.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = lab(&["summary", file, "--max-snapshot-size", "0"]);
    assert!(stderr(&out).contains("--max-snapshot-size: the size must be more than 0"));
}
