//! What the test suites share: the device they run on and the test data they read.
//! `LABS_DEVICE=cuda` runs every test on the GPU (a missing GPU is then a failure, never
//! a skip); unset, tests use the simulated GPU.

use crate::device::{Device, DeviceId, ENV_DEVICE};

/// The device under test.
pub fn test_device() -> Device {
    let id: DeviceId = match std::env::var(ENV_DEVICE) {
        Ok(v) if !v.trim().is_empty() => v
            .parse()
            .unwrap_or_else(|e| panic!("{ENV_DEVICE}={v}: {e}")),
        _ => DeviceId::Sim(0),
    };
    Device::get(id).unwrap_or_else(|e| panic!("the device under test, {id}, is unusable: {e}"))
}

/// The environment variable that points the tests and labs at another copy of the test
/// data (the GPU bundle's, which runs where the checkout is not).
pub const ENV_DATA_DIR: &str = "LABS_DATA_DIR";
/// The variable's former name, still honoured.
const ENV_DATA_DIR_OLD: &str = "LABS_SHARED_DIR";

/// Where the test data (allocation traces, snapshots) lives: the repository's `data/`
/// folder, so that a fresh clone tests with nothing beside it; `LABS_DATA_DIR` (or the
/// older `LABS_SHARED_DIR`) when set.
pub fn data_dir() -> std::path::PathBuf {
    for var in [ENV_DATA_DIR, ENV_DATA_DIR_OLD] {
        match std::env::var_os(var) {
            Some(dir) if !dir.is_empty() => return dir.into(),
            _ => {}
        }
    }
    // labs/core -> the workspace root.
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data")
}

/// The path of a lab's binary for tests that run it: `LABS_BIN_DIR/name` when
/// `LABS_BIN_DIR` is set (a test bundle run on another machine, where the path cargo
/// built does not exist), else `built`, the path cargo gives in
/// `env!("CARGO_BIN_EXE_<name>")`.
pub fn lab_binary(name: &str, built: &str) -> std::path::PathBuf {
    match std::env::var_os("LABS_BIN_DIR") {
        Some(dir) if !dir.is_empty() => std::path::Path::new(&dir).join(name),
        _ => built.into(),
    }
}

/// The one JSON object a lab's `--json` command prints: the command must have
/// succeeded and printed exactly one line on stdout.
pub fn one_json_object(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    assert_eq!(text.trim().lines().count(), 1, "not one line: {text}");
    serde_json::from_str(&text).expect("stdout is one JSON object")
}
