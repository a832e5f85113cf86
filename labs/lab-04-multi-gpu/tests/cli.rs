//! The lab's command line on simulated GPUs: every section, the device count, and the
//! staged path when the simulated GPUs' peer access is off.

use std::process::{Command, Output};

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-04", env!("CARGO_BIN_EXE_lab-04"))
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env_remove("LABS_SIM_DEVICES")
        .env_remove("LABS_SIM_PEER");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The rows of the bandwidth table whose "to() takes" cell is `path`.
fn rows_taking(text: &str, path: &str) -> usize {
    text.lines()
        .filter(|l| l.split('|').nth(2).is_some_and(|c| c.trim() == path))
        .count()
}

fn stdout(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_default_command_prints_every_section_on_two_simulated_gpus() {
    let text = stdout(run(&["--device", "sim", "--quick"], &[]));
    for expected in [
        "2 sim device(s): sim:0, sim:1",
        "(simulated GPUs:",
        "1. The devices (2)",
        "2. One caching allocator per device",
        "after sim:0's empty_cache",
        "3. An operation across devices",
        "Expected all tensors to be on the same device, but found at least two devices, \
         sim:0 and sim:1!",
        "4. Copy bandwidth from sim:0 to sim:1",
        "(simulated: the times mean nothing)",
        "5. DataParallel-style replication",
    ] {
        assert!(text.contains(expected), "missing {expected}:\n{text}");
    }
    // Sizes 1, 4 and 16 MiB, each copied by a peer copy.
    assert_eq!(rows_taking(&text, "peer"), 3, "{text}");
    assert_eq!(
        text.matches("| yes").count(),
        3,
        "every copy exact:\n{text}"
    );
}

#[test]
fn sections_run_alone_and_the_count_follows_the_environment() {
    let text = stdout(run(
        &["--device", "sim", "devices"],
        &[("LABS_SIM_DEVICES", "3")],
    ));
    assert!(
        text.contains("3 sim device(s): sim:0, sim:1, sim:2"),
        "{text}"
    );
    assert!(text.contains("1. The devices (3)"), "{text}");
    assert!(!text.contains("2. One caching allocator"), "{text}");
}

#[test]
fn without_peer_access_copies_are_staged() {
    let text = stdout(run(
        &["--device", "sim", "--quick", "bandwidth"],
        &[("LABS_SIM_PEER", "0")],
    ));
    assert_eq!(rows_taking(&text, "staged"), 3, "{text}");
    assert_eq!(
        text.matches("| yes").count(),
        3,
        "every copy exact:\n{text}"
    );
    assert!(text.contains("- (no peer access)"), "{text}");
}

#[test]
fn the_host_alone_is_refused_clearly() {
    let out = run(&["--device", "cpu", "devices"], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lab 4 needs GPUs"), "{err}");
}

#[test]
fn the_second_simulated_gpu_exists_by_default_and_a_third_does_not() {
    let text = stdout(run(&["--device", "sim:1", "devices"], &[]));
    assert!(text.contains("2 sim device(s): sim:0, sim:1"), "{text}");
    let out = run(&["--device", "sim:2", "devices"], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid device ordinal: sim:2 requested, but there are 2 sim devices"),
        "{err}"
    );
}

/// A FIFO given as PyTorch's figures is refused at once, naming it, instead of blocking
/// the lab until some program writes to it.
#[cfg(unix)]
#[test]
fn a_fifo_as_pytorchs_figures_is_refused_at_once() {
    let fifo = labs_core::testing::make_fifo("lab04-pytorch.json");
    labs_core::testing::assert_refused(
        Command::new(binary())
            .args(["collectives", "--device", "sim", "--quick", "--pytorch"])
            .arg(&fifo),
        std::time::Duration::from_secs(60),
        &[fifo.to_str().unwrap(), "FIFO"],
    );
}
