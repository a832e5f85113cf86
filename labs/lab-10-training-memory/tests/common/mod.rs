//! What the command-line tests share: the binary, the device under test, and a model
//! small enough to train in a fraction of a second.

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
pub fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-10", env!("CARGO_BIN_EXE_lab-10"))
}

/// The device under test: `LABS_DEVICE`, else the simulated GPU.
pub fn device() -> String {
    std::env::var("LABS_DEVICE")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| "sim".into())
}

/// A one-layer Transformer of width 32 on a batch of 2 × 16, trained `steps` steps.
pub fn small(steps: usize) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--d-model",
        "32",
        "--nhead",
        "2",
        "--layers",
        "1",
        "--ffn",
        "64",
        "--batch",
        "2",
        "--seq",
        "16",
        "--steps",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.push(steps.to_string());
    flags
}
