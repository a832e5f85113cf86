//! The lab's command line: every experiment's table, on the simulated GPU.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-09", env!("CARGO_BIN_EXE_lab-09"))
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
        "(no GPU in use: the simulated GPU",
        "1. The graph a running loss keeps alive",
        "2a. An evaluation pass",
        "2b. ",
        "3. What dropping frees",
        "4. c = a @ b",
        "5. The leak guard",
        "The last leaking iteration's blocks",
        "labs/lab-09-leaks/src/model.rs:",
        "Tensor::mean_all",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
}
