//! What `lab-10` writes: every output path is checked before the run starts (its
//! folder exists, no path is given twice, no output is an input), and a failed run
//! reports its cause.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use labs_core::testing::{assert_refused, output_within};

mod common;
use common::{binary, device, small};

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lab10-outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A run on the simulated GPU that takes minutes: a refusal that comes within
/// seconds came before it.
fn long_run(extra: &[&str]) -> Command {
    let mut c = Command::new(binary());
    c.args(["train", "--device", &device()])
        .args(small(100_000))
        .args(extra);
    c
}

const SOON: Duration = Duration::from_secs(10);

#[test]
fn a_snapshot_into_a_missing_folder_is_refused_before_the_run() {
    let dir = scratch("missing");
    let file = dir.join("no-such-folder").join("run.json");
    let start = Instant::now();
    assert_refused(
        &mut long_run(&["--snapshot", p(&file)]),
        SOON,
        &["--snapshot", "no-such-folder", "does not exist"],
    );
    assert!(start.elapsed() < SOON);
    let file = dir.join("no-such-folder").join("step.svg");
    assert_refused(
        &mut long_run(&["--timeline", p(&file)]),
        SOON,
        &["--timeline", "no-such-folder", "does not exist"],
    );
    // A folder where the file goes is not a file to write.
    assert_refused(
        &mut long_run(&["--snapshot", p(&dir)]),
        SOON,
        &["--snapshot", "is a folder"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_same_file_for_the_timeline_and_the_snapshot_is_refused() {
    let dir = scratch("twice");
    let file = dir.join("out");
    assert_refused(
        &mut long_run(&["--timeline", p(&file), "--snapshot", p(&file)]),
        SOON,
        &["--timeline", "--snapshot", "same file"],
    );
    assert!(!file.exists(), "the refused run wrote {}", file.display());
    // The same file by two spellings, once it exists.
    std::fs::write(&file, "kept").unwrap();
    let other = dir.join(".").join("out");
    assert_refused(
        &mut long_run(&["--timeline", p(&file), "--snapshot", p(&other)]),
        SOON,
        &["--timeline", "--snapshot", "same file"],
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_out_of_memory_run_with_a_timeline_reports_the_out_of_memory() {
    let dir = scratch("oom");
    let svg = dir.join("step.svg");
    let mut c = Command::new(binary());
    c.args(["train", "--device", "sim", "--capacity", "6MiB", "--json"])
        .args(small(2))
        .args(["--batch", "16", "--seq", "128", "--timeline", p(&svg)]);
    let (out, in_time) = output_within(&mut c, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(in_time, "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("out of memory"),
        "the cause is not reported: {stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["oom"].as_str().unwrap().contains("out of memory"), "{v}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_experiments_refuse_to_write_over_their_pytorch_figures() {
    let dir = scratch("experiments");
    let figures = dir.join("pytorch.jsonl");
    std::fs::write(&figures, "{}\n").unwrap();
    let mut c = Command::new(binary());
    c.args([
        "--device",
        "sim",
        "--quick",
        "--pytorch",
        p(&figures),
        "--out",
        p(&figures),
    ]);
    assert_refused(&mut c, SOON, &["--out", "--pytorch", "same file"]);
    assert_eq!(std::fs::read_to_string(&figures).unwrap(), "{}\n");
    let mut c = Command::new(binary());
    c.args([
        "--device",
        "sim",
        "--quick",
        "--out",
        p(&dir.join("none").join("runs.jsonl")),
    ]);
    assert_refused(&mut c, SOON, &["--out", "does not exist"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A profile covers the steps after the warm-up: with none, there is no profile to
/// report per step (the figures would be the warm-up's, compilation included).
#[test]
fn no_kernel_profile_is_reported_when_every_step_is_a_warm_up() {
    let mut c = Command::new(binary());
    c.args(["train", "--device", "sim", "--profile", "--warmup", "3"])
        .args(small(2));
    let (out, in_time) = output_within(&mut c, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(in_time && out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("per step"),
        "a profile of no timed step: {stderr}"
    );
    assert!(stderr.contains("--warmup"), "{stderr}");
}

/// A data-parallel run writes FILE.rank0, FILE.rank1, …: FILE itself may be a folder.
#[test]
fn a_data_parallel_snapshot_is_checked_as_the_files_it_writes() {
    let dir = scratch("ranks");
    let mut c = Command::new(binary());
    c.args(["train", "--dry-run", "--nproc", "2", "--snapshot", p(&dir)])
        .args(small(1));
    let (out, in_time) = output_within(&mut c, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(in_time && out.status.success(), "{stderr}");
    for rank in 0..2 {
        let mut name = dir.clone().into_os_string();
        name.push(format!(".rank{rank}"));
        let file = PathBuf::from(name);
        assert!(file.is_file(), "no {}: {stderr}", file.display());
        std::fs::remove_file(&file).unwrap();
    }
    let missing = dir.join("none").join("run.json");
    assert_refused(
        Command::new(binary())
            .args([
                "train",
                "--dry-run",
                "--nproc",
                "2",
                "--snapshot",
                p(&missing),
            ])
            .args(small(1)),
        SOON,
        &["--snapshot", "does not exist"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
