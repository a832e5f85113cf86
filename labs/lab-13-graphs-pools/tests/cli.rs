//! The lab's command line prints every experiment.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-13", env!("CARGO_BIN_EXE_lab-13"))
}

#[test]
fn the_default_command_prints_every_experiment() {
    let out = Command::new(binary())
        .args([
            "--device",
            &labs_core::testing::test_device().to_string(),
            "--quick",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for title in [
        "A chain of small kernels",
        "what stays reserved for it",
        "What a capture on",
        "A scoped pool",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
}

#[test]
fn a_bad_flag_is_refused_with_a_message() {
    let out = Command::new(binary()).arg("--graphs").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--graphs"), "{err}");
}
