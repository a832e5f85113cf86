//! What the test suites share, under one path: the device they run on, the test data
//! they read, the comparison of values with a reference, the lock of tests that read the
//! device's counters, fuzz cases and seeds, the running of a lab's binary within a time
//! limit, the PyTorch parity fixtures. Each part lives in the lowest crate that can
//! offer it (a crate's own tests use it from there); `LABS_DEVICE=cuda` runs every test
//! on the GPU (a missing GPU is then a failure, never a skip); unset, tests use the
//! simulated GPU.

pub use labs_base::testing::*;
pub use labs_device::testing::*;
pub use labs_nn::testing::*;
pub use labs_tensor::testing::*;

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
