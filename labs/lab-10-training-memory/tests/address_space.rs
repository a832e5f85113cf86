//! Data-parallel training on simulated GPUs inside a 4 GB address space
//! (`ulimit -v 4000000`): the simulated GPUs' memory is host memory, so eight ranks of
//! the default model need more than the cap. The run reports that in one line (the
//! host memory behind the simulated GPUs, or the limit that stopped a rank's thread) and
//! exits with an error; it never aborts, nor hangs (`timeout` ends it after 300 s with
//! status 124).

use std::process::Command;

/// The cap, in KiB as `ulimit -v` takes it.
const ADDRESS_SPACE_KIB: u64 = 4_000_000;

#[test]
fn eight_ranks_past_the_address_space_end_in_a_clear_error() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB} && exec timeout 300 \"$0\" --device sim train \
             --nproc 8 --steps 2"
        ))
        .arg(labs_core::testing::lab_binary(
            "lab-10",
            env!("CARGO_BIN_EXE_lab-10"),
        ))
        .env_remove("WORLD_SIZE")
        .output()
        .expect("running lab-10 through sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
    // Success is as good (a host with a larger cap); an abort or a signal is not.
    if out.status.success() {
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(1),
        "lab-10 --device sim train --nproc 8 under ulimit -v {ADDRESS_SPACE_KIB}: {}\n{}",
        out.status,
        tail.join("\n")
    );
    // Which runs out first, the simulated GPUs' host memory or the room for a rank's
    // threads, depends on how the allocator takes memory; either is named.
    assert!(
        (stderr.contains("the host has no")
            || stderr.contains("the system's limit on threads or on memory"))
            && !stderr.contains("stack backtrace"),
        "the error names the host's memory behind the simulated GPU or its limit: {}",
        tail.join("\n")
    );
}
