//! The lab's command line: every experiment in the default run, the JSON contract of
//! `--json`, and one-line errors for bad sizes.

use std::process::Command;
use std::time::Duration;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-11", env!("CARGO_BIN_EXE_lab-11"))
}

fn lab() -> Command {
    let mut c = Command::new(binary());
    c.args(["--device", "sim", "--quick"]);
    c
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
        "Device sim:0",
        "Copy bandwidth between host memory and sim:0",
        "At the largest size, 1.00 MiB: pinned ",
        "Getting host memory for copies to sim:0",
        "A kernel reading 4.00 MiB on sim:0",
        "Managed memory: a kernel reading 4.00 MiB on sim:0",
        "Asking sim:0 for more than it has",
        "no fallback to host memory",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
    // Each experiment says what the simulated GPU does not model.
    assert_eq!(text.matches("(On sim:0: ").count(), 5, "{text}");
}

#[test]
fn json_is_one_object_with_every_experiment() {
    let v = labs_core::testing::one_json_object(lab().arg("--json").output().unwrap());
    assert_eq!(v["device"], "sim:0");
    let rows = v["bandwidth"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for key in [
        "pageable_htod_gbps",
        "pinned_htod_gbps",
        "pageable_dtoh_gbps",
        "pinned_dtoh_gbps",
    ] {
        assert!(rows[1][key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    assert_eq!(v["pin_cost"].as_array().unwrap().len(), 2, "{v}");
    for (object, keys) in [
        (
            "mapped",
            ["device_memory_ms", "mapped_host_ms", "copy_then_kernel_ms"],
        ),
        (
            "managed",
            ["pages_on_host_ms", "prefetched_ms", "preferred_host_ms"],
        ),
    ] {
        assert_eq!(v[object]["bytes"], 4 << 20, "{v}");
        for key in keys {
            assert!(
                v[object][key].as_f64().is_some_and(|x| x > 0.0),
                "{key}: {v}"
            );
        }
    }
    let beyond = v["beyond_device"].as_array().unwrap();
    assert!(beyond.iter().all(|r| r["refused"].is_string()), "{v}");
}

#[test]
fn a_subcommand_runs_its_experiment_alone() {
    let v = labs_core::testing::one_json_object(
        lab()
            .args(["pin-cost", "--max-size", "64KiB", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(v["pin_cost"].as_array().unwrap().len(), 1, "{v}");
    assert!(
        v.get("bandwidth").is_none() && v.get("mapped").is_none(),
        "{v}"
    );

    let out = lab().args(["mapped", "--size", "1MiB"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("A kernel reading 1.00 MiB on sim:0"),
        "{text}"
    );
    assert!(!text.contains("Copy bandwidth"), "{text}");
}

#[test]
fn bad_sizes_are_one_line_errors_that_name_the_flag() {
    let limit = Duration::from_secs(60);
    for (args, words) in [
        (
            &["mapped", "--size", "0"][..],
            &["--size", "more than 0 bytes"][..],
        ),
        (
            &["mapped", "--size", "6"],
            &["--size", "multiple of 4 bytes"],
        ),
        (&["managed", "--size", "1PiB"], &["--size", "free"]),
        (&["mapped", "--size", "lots"], &["--size", "not a size"]),
        (
            &["bandwidth", "--max-size", "1KiB"],
            &["--max-size", "smallest size"],
        ),
        (
            &["pin-cost", "--max-size", "0"],
            &["--max-size", "more than 0 bytes"],
        ),
    ] {
        labs_core::testing::assert_refused(lab().args(args), limit, words);
    }
}

#[test]
fn an_unknown_subcommand_or_flag_is_refused() {
    for args in [&["remap"][..], &["mapped", "--max-size", "1MiB"]] {
        let out = lab().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
