//! The lab's command line: every experiment's table, on the simulated GPU.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-07", env!("CARGO_BIN_EXE_lab-07"))
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
        "1. Full against mixed precision",
        "2. Where the memory goes",
        "autocast_cache",
        "3a. Float16 gradients that underflow",
        "3b. A forced overflow",
        "no (inf found)",
        "4. Loss curves",
        "5. Matrix product throughput",
        "TF32 allowed",
        "6a. Tutorial 004's step on the training driver",
        "autocast float16 + GradScaler",
        "6b. A small GPT-2 under bfloat16",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
}
