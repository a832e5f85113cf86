//! What the command-line tests share: the binary, the snapshot in the repository's
//! data, the output of a run, and a scratch folder per test.

// Each test file uses some of these.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// PyTorch's snapshot of a small MLP trained with Adam.
pub fn mlp_path() -> PathBuf {
    labs_core::testing::data_dir().join("snapshots/mlp_adam.pickle")
}

/// Runs the lab (where cargo built it, or the GPU bundle's, `LABS_BIN_DIR`) with `args`.
pub fn lab(args: &[&str]) -> Output {
    Command::new(labs_core::testing::lab_binary(
        "lab-03",
        env!("CARGO_BIN_EXE_lab-03"),
    ))
    .args(args)
    .env_remove("LABS_DEVICE")
    .output()
    .expect("the lab binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh folder for one test, named after the test file and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let file = module_path!().split("::").next().unwrap_or("tests");
    let dir = std::env::temp_dir().join(format!("lab03-{file}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
