//! Lab 1 on the simulated GPU inside a 4 GB address space (`ulimit -v 4000000`): the
//! simulator backs only the memory kernels touch, so a segment of a gigabyte costs a
//! few chunks of host memory, not a gigabyte of address space.

use std::process::Command;

/// The cap, in KiB as `ulimit -v` takes it.
const ADDRESS_SPACE_KIB: u64 = 4_000_000;

#[test]
fn the_quick_run_on_sim_fits_in_four_gigabytes_of_address_space() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" --quick --device sim"
        ))
        .arg(labs_core::testing::lab_binary(
            "lab-01",
            env!("CARGO_BIN_EXE_lab-01"),
        ))
        .output()
        .expect("running lab-01 through sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "lab-01 --quick --device sim under ulimit -v {ADDRESS_SPACE_KIB}: {}\n{}",
        out.status,
        stderr.lines().rev().take(10).collect::<Vec<_>>().join("\n")
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Simulated GPU"),
        "the run reports its device: {stdout}"
    );
}
