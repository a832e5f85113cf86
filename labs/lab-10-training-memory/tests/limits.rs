//! Sizes from the command line are checked before any memory is taken in proportion to
//! them: a size whose products overflow or exceed what any device holds is refused at
//! once with one line naming the flag and the limit, never a panic, an abort or a hang.

use std::process::Command;
use std::time::Duration;

fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-10", env!("CARGO_BIN_EXE_lab-10"))
}

const MAX: &str = "18446744073709551615";

/// `lab-10 train` on the dry-run device with `flags`.
fn train(flags: &[&str]) -> Command {
    let mut c = Command::new(binary());
    c.args(["train", "--dry-run", "--steps", "1"]).args(flags);
    c
}

fn refused(flags: &[&str], words: &[&str]) -> String {
    labs_core::testing::assert_refused(&mut train(flags), Duration::from_secs(20), words)
}

#[test]
fn a_gpt2_width_whose_feed_forward_overflows_is_refused() {
    // 4 x d_model wraps to 4 in 64 bits.
    refused(
        &[
            "--model",
            "gpt2",
            "--d-model",
            "4611686018427387905",
            "--nhead",
            "1",
        ],
        &["--d-model", "4611686018427387905"],
    );
}

#[test]
fn sizes_at_the_largest_integer_are_refused_with_their_flag() {
    for (flags, flag) in [
        (vec!["--model", "gpt2", "--vocab", MAX], "--vocab"),
        (vec!["--model", "gpt2", "--seq", MAX], "--seq"),
        (vec!["--model", "transformer", "--seq", MAX], "--seq"),
        (vec!["--model", "transformer", "--ffn", MAX], "--ffn"),
        (vec!["--model", "transformer", "--batch", MAX], "--batch"),
        (vec!["--model", "gpt2", "--batch", MAX], "--batch"),
        (vec!["--model", "transformer", "--layers", MAX], "--layers"),
        (
            vec!["--model", "transformer", "--d-model", MAX, "--nhead", "1"],
            "--d-model",
        ),
        (vec!["--model", "transformer", "--accum", MAX], "--accum"),
        (vec!["--model", "transformer", "--steps", MAX], "--steps"),
        (vec!["--model", "transformer", "--nproc", MAX], "--nproc"),
        (
            vec!["--model", "gpt2", "--vocab-multiple", MAX],
            "--vocab-multiple",
        ),
    ] {
        let line = refused(&flags, &[flag]);
        assert!(
            ["at most", "exceed", "more than"]
                .iter()
                .any(|w| line.contains(w)),
            "{line}"
        );
    }
}

#[test]
fn a_model_larger_than_the_device_is_an_out_of_memory_report_not_an_abort() {
    // A vocabulary table of 2^34 x 64 floats (4 TiB): representable, far more than the
    // 1 GiB device; the run reports the out-of-memory error without taking host memory
    // for it.
    let mut c = train(&[
        "--model",
        "gpt2",
        "--d-model",
        "64",
        "--nhead",
        "1",
        "--layers",
        "1",
        "--seq",
        "16",
        "--vocab",
        "17179869184",
        "--capacity",
        "1GiB",
        "--json",
    ]);
    let (out, in_time) = labs_core::testing::output_within(&mut c, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(in_time, "still running: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("out of memory"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the report");
    assert!(
        report["oom"]
            .as_str()
            .is_some_and(|o| o.contains("out of memory")),
        "{report}"
    );
}

/// A dry run holds no values: a parameter that fits the device but not the host's
/// memory (a vocabulary table of 4e6 x 768 floats, 12 GB, under a 4 GB address-space
/// cap) is allocated on the dry device without drawing its values on the host.
#[cfg(unix)]
#[test]
fn a_dry_run_draws_no_host_values_for_its_parameters() {
    let script = format!(
        "ulimit -v 4000000 && exec {} train --dry-run --steps 1 --model gpt2 --layers 1 \
         --seq 16 --vocab 4000000 --json",
        binary().display()
    );
    let mut c = Command::new("sh");
    c.args(["-c", &script]);
    let (out, in_time) = labs_core::testing::output_within(&mut c, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(in_time, "still running: {stderr}");
    assert!(!stderr.contains("memory allocation of"), "{stderr}");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}: {stderr}",
        out.status
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the report");
    assert!(
        report["params"].as_u64().unwrap() > 3_000_000_000,
        "{report}"
    );
}
