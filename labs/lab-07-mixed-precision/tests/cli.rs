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

/// A FIFO given as PyTorch's figures is refused at once, naming it, instead of blocking
/// the lab until some program writes to it.
#[cfg(unix)]
#[test]
fn a_fifo_as_pytorchs_figures_is_refused_at_once() {
    let fifo = labs_core::testing::make_fifo("lab07-pytorch.json");
    labs_core::testing::assert_refused(
        Command::new(binary())
            .args(["--device", "sim", "--quick", "--pytorch"])
            .arg(&fifo),
        std::time::Duration::from_secs(60),
        &[fifo.to_str().unwrap(), "FIFO"],
    );
}
