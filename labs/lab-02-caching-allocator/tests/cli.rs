//! The lab's command line: the JSON contracts of `replay` and `bench`, and errors.

use std::process::Command;

fn lab() -> Command {
    let mut c = Command::new(labs_core::testing::lab_binary(
        "lab-02",
        env!("CARGO_BIN_EXE_lab-02"),
    ));
    c.args(["--device", "sim"]);
    c
}

fn trace(name: &str) -> std::path::PathBuf {
    labs_core::testing::data_dir()
        .join("traces")
        .join(format!("{name}.trace.csv.gz"))
}

#[test]
fn replay_json_is_one_object_with_the_documented_keys() {
    let out = lab()
        .args(["replay", "--json"])
        .arg(trace("seed_transformer_b64"))
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    for key in [
        "trace",
        "conf",
        "ops",
        "peak_requested",
        "peak_allocated",
        "peak_reserved",
        "device_allocs",
        "num_maps",
        "num_unmaps",
        "num_sync_all_streams",
        "ns_per_op",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["trace"], "seed_transformer_b64");
    let ratio =
        v["peak_reserved"].as_u64().unwrap() as f64 / v["peak_requested"].as_u64().unwrap() as f64;
    assert!(ratio <= 1.037, "{ratio}");
    // Driver calls on sim are exact: few syncs, no more mappings than pages at the peak.
    let pages = v["peak_reserved"].as_u64().unwrap().div_ceil(2 << 20);
    assert!(v["num_maps"].as_u64().unwrap() <= pages, "{v}");
    assert!(v["num_sync_all_streams"].as_u64().unwrap() <= 24, "{v}");
}

#[test]
fn replay_of_a_malformed_file_fails_naming_the_line() {
    let path = std::env::temp_dir().join(format!("lab02-bad-{}.csv", std::process::id()));
    std::fs::write(&path, "action,addr,size,stream\nalloc,1,512\n").unwrap();
    let out = lab().arg("replay").arg(&path).output().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn a_bad_conf_is_a_clear_error() {
    let out = lab()
        .args(["replay", "--conf", "max_split_size_mb:5"])
        .arg(trace("seed_transformer_b64"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_split_size_mb"));
}
