//! The lab's command line: the JSON contract of `bench`, and the default tables.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-08", env!("CARGO_BIN_EXE_lab-08"))
}

fn lab() -> Command {
    let mut c = Command::new(binary());
    c.args(["--device", "sim", "--quick"]);
    c
}

#[test]
fn bench_json_is_one_object_with_the_documented_keys() {
    let out = lab().args(["bench", "--json"]).output().unwrap();
    let v = labs_core::testing::one_json_object(out);
    for key in [
        "naive_step_ms",
        "prefetch_step_ms",
        "copy_ms",
        "compute_ms",
        "prefetch_ratio",
        "pinned_htod_gbps",
        "pinned_dtoh_gbps",
        "pageable_htod_gbps",
        "pageable_dtoh_gbps",
        "prefetch_step_worst_ms",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    for key in [
        "pinned_allocs",
        "pinned_frees",
        "device_allocs",
        "device_frees",
        "device_syncs",
    ] {
        assert!(v["timed_driver_work"][key].is_u64(), "{key}: {v}");
    }
    assert!(!v["bandwidth"].as_array().unwrap().is_empty());
}

#[test]
fn the_default_command_prints_every_experiment() {
    let out = lab().output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for title in [
        "Getting host memory",
        "Copy bandwidth",
        "non_blocking=True",
        "where its input lives",
        "Training-like loop",
        // The same ratio as bench's, so that the two runs compare directly.
        "prefetched / max(copy, compute) = ",
        "driver calls in the timed steps: ",
        "pinned-memory pool",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
}
