//! `lab-03`'s outputs are checked before any work: `export-trace -o` never writes over
//! the snapshot it reads, and an output into a missing folder is refused.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use labs_core::testing::{assert_refused, data_dir};

fn lab() -> Command {
    Command::new(labs_core::testing::lab_binary(
        "lab-03",
        env!("CARGO_BIN_EXE_lab-03"),
    ))
}

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lab03-outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn export_trace_onto_its_own_input_is_refused_and_keeps_the_input() {
    let dir = scratch("same");
    let snapshot = dir.join("mlp.pickle");
    std::fs::copy(data_dir().join("snapshots/mlp_adam.pickle"), &snapshot).unwrap();
    let before = std::fs::read(&snapshot).unwrap();
    let s = snapshot.to_str().unwrap();
    let mut c = lab();
    c.args(["export-trace", s, "-o", s]);
    assert_refused(&mut c, Duration::from_secs(20), &["--out", "same file"]);
    assert_eq!(
        std::fs::read(&snapshot).unwrap(),
        before,
        "the input changed"
    );
    // The same file by another spelling.
    let other = dir.join(".").join("mlp.pickle");
    let mut c = lab();
    c.args(["export-trace", s, "-o", other.to_str().unwrap()]);
    assert_refused(&mut c, Duration::from_secs(20), &["--out", "same file"]);
    assert_eq!(
        std::fs::read(&snapshot).unwrap(),
        before,
        "the input changed"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn export_trace_into_a_missing_folder_is_refused() {
    let dir = scratch("missing");
    let out = dir.join("none").join("mlp.trace.csv.gz");
    let mut c = lab();
    c.args(["export-trace"])
        .arg(data_dir().join("snapshots/mlp_adam.pickle"))
        .args(["-o", out.to_str().unwrap()]);
    assert_refused(
        &mut c,
        Duration::from_secs(20),
        &["--out", "does not exist"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
