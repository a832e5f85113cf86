//! The lab's command line prints every experiment.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    match std::env::var_os("LABS_BIN_DIR") {
        Some(dir) => std::path::Path::new(&dir).join("lab-06"),
        None => env!("CARGO_BIN_EXE_lab-06").into(),
    }
}

#[test]
fn the_default_command_prints_every_experiment() {
    let out = Command::new(binary())
        .args(["--device", "sim", "--quick"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for title in [
        "An event recorded after a kernel",
        "Timing 10 kernels",
        "one stream or two",
        "A consumer stream",
        "An urgent kernel",
        "record_stream",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
}
