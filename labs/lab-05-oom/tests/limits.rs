//! `lab-05 fit`'s sizes are checked before any memory is taken in proportion to them,
//! and it reports only what it measured.

use std::process::Command;
use std::time::Duration;

fn fit(flags: &[&str]) -> Command {
    let mut c = Command::new(labs_core::testing::lab_binary(
        "lab-05",
        env!("CARGO_BIN_EXE_lab-05"),
    ));
    c.args(["fit", "--device", "dry", "--capacity", "256MiB"])
        .args(flags);
    c
}

fn refused(flags: &[&str], words: &[&str]) -> String {
    labs_core::testing::assert_refused(&mut fit(flags), Duration::from_secs(20), words)
}

#[test]
fn an_input_too_large_for_any_device_is_refused() {
    // 2^32 inputs x 2048 floats: a first layer of 32 TiB, and a largest batch's input
    // of 2^22 x 2^32 floats.
    refused(
        &["--input", "4294967296"],
        &["--input", "4294967296", "exceed"],
    );
}

#[test]
fn a_model_larger_than_the_device_does_not_fit_and_takes_no_host_memory_for_it() {
    // A first layer of 2^24 x 2048 floats (128 GiB) on a device of 256 MiB.
    let mut c = fit(&["--input", "16777216", "--max-batch", "4"]);
    let (out, in_time) = labs_core::testing::output_within(&mut c, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(in_time, "still running: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("not even a batch of 1 fits"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "a result for nothing that ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn sizes_at_the_largest_integer_are_refused_with_their_flag() {
    let max = "18446744073709551615";
    for flag in ["--input", "--width", "--depth", "--max-batch"] {
        refused(&[flag, max], &[flag]);
    }
    for flag in ["--d-model", "--layers", "--seq", "--accum"] {
        refused(&["--model", "transformer", flag, max], &[flag]);
    }
    refused(
        &["--model", "gpt2", "--d-model", "4611686018427387905"],
        &["--d-model"],
    );
}

#[test]
fn zero_where_zero_means_nothing_is_refused() {
    for flag in ["--max-batch", "--steps", "--input", "--width"] {
        refused(&[flag, "0"], &[flag, "at least 1"]);
    }
    refused(
        &["--model", "gpt2", "--max-batch", "0"],
        &["--max-batch", "at least 1"],
    );
}
