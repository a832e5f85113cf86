//! What the test suites of every crate share, short of a device: the test data they
//! read, the comparison of values with a reference, the lock of tests that read the
//! device's counters, fuzz cases and seeds, and the running of a lab's binary within a
//! time limit. The device under test is `labs-device`'s `testing::test_device`; the
//! façade's `labs_core::testing` offers all of them under one path.

mod values;

pub use values::{assert_close, max_error, serial};

/// The environment variable that points the tests and labs at another copy of the test
/// data (the GPU bundle's, which runs where the checkout is not).
pub const ENV_DATA_DIR: &str = "LABS_DATA_DIR";
/// The variable's former name, still honoured.
const ENV_DATA_DIR_OLD: &str = "LABS_SHARED_DIR";

/// Where the test data (allocation traces, snapshots) lives: the repository's `data/`
/// folder, so that a fresh clone tests with nothing beside it; `LABS_DATA_DIR` (or the
/// older `LABS_SHARED_DIR`) when set.
pub fn data_dir() -> std::path::PathBuf {
    for var in [ENV_DATA_DIR, ENV_DATA_DIR_OLD] {
        match std::env::var_os(var) {
            Some(dir) if !dir.is_empty() => return dir.into(),
            _ => {}
        }
    }
    // labs/core/base -> the workspace root.
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../data")
}

/// The path of a lab's binary for tests that run it: `LABS_BIN_DIR/name` when
/// `LABS_BIN_DIR` is set (a test bundle run on another machine, where the path cargo
/// built does not exist), else `built`, the path cargo gives in
/// `env!("CARGO_BIN_EXE_<name>")`.
pub fn lab_binary(name: &str, built: &str) -> std::path::PathBuf {
    match std::env::var_os("LABS_BIN_DIR") {
        Some(dir) if !dir.is_empty() => std::path::Path::new(&dir).join(name),
        _ => built.into(),
    }
}

/// Makes the next `count` threads the runtime starts from the calling thread (a
/// simulated stream's worker, a launcher's output readers) fail to start, as they do
/// when the system's limit on threads or memory is reached.
pub fn fail_thread_spawns(count: usize) {
    crate::threads::fail_next_spawns(count);
}

/// The number of cases a fuzz target or property test runs: `LABS_FUZZ_CASES`.
pub const ENV_FUZZ_CASES: &str = "LABS_FUZZ_CASES";
/// The seed a fuzz target or property test draws its cases from: `LABS_FUZZ_SEED`.
pub const ENV_FUZZ_SEED: &str = "LABS_FUZZ_SEED";
/// The seed when `LABS_FUZZ_SEED` is unset: fixed, so that CI runs the same cases every
/// time and a failure there is reproducible.
pub const DEFAULT_FUZZ_SEED: u64 = 0x1ab5_f022;

/// How many cases a fuzz target or property test runs: `default` (CI's), else
/// `LABS_FUZZ_CASES` (or proptest's own `PROPTEST_CASES`) for a longer campaign. A value
/// that is not a number fails the test, naming the variable.
pub fn fuzz_cases(default: u32) -> u32 {
    for var in [ENV_FUZZ_CASES, "PROPTEST_CASES"] {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => {
                return v.trim().parse().unwrap_or_else(|_| {
                    panic!("{var}={v}: not a number of cases (0 to {})", u32::MAX)
                })
            }
            _ => {}
        }
    }
    default
}

/// The seed of fuzz target `name`: [`DEFAULT_FUZZ_SEED`], or `LABS_FUZZ_SEED=N`, or, for
/// `LABS_FUZZ_SEED=random`, a new one each run, printed on stderr as
/// `name: LABS_FUZZ_SEED=N` so that a failure it finds can be run again.
pub fn fuzz_seed(name: &str) -> u64 {
    match std::env::var(ENV_FUZZ_SEED).as_deref().map(str::trim) {
        Ok("random") => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.write_u32(std::process::id());
            let seed = h.finish();
            eprintln!("{name}: {ENV_FUZZ_SEED}={seed}");
            seed
        }
        Ok("") | Err(_) => DEFAULT_FUZZ_SEED,
        Ok(v) => v.parse().unwrap_or_else(|_| {
            panic!("{ENV_FUZZ_SEED}={v}: not a number (0 to 2^64 - 1) or `random`")
        }),
    }
}

/// Runs `command` to its end, or kills it after `limit`: its output, and whether it
/// ended by itself within the limit. A command that hangs fails its test instead of
/// hanging the suite.
pub fn output_within(
    command: &mut std::process::Command,
    limit: std::time::Duration,
) -> (std::process::Output, bool) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let start = std::time::Instant::now();
    let mut in_time = true;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the command") {
            break status;
        }
        if start.elapsed() > limit {
            in_time = false;
            let _ = child.kill();
            break child.wait().expect("waiting for the killed command");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    (output, in_time)
}

/// Asserts that a lab's command refused its input as a lab should: it ended within
/// `limit` with the failure status 1 (no signal, no abort), no panic, and one line of
/// error on stderr that contains every one of `words` (a flag's name, a limit).
/// Returns that line.
pub fn assert_refused(
    command: &mut std::process::Command,
    limit: std::time::Duration,
    words: &[&str],
) -> String {
    let what = format!("{command:?}");
    let (out, in_time) = output_within(command, limit);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        in_time,
        "{what}: still running after {limit:?}; stderr: {stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: ended with {} instead of the failure status 1; stderr: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{what}: panicked: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{what}: not one error line: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().last(),
        Some(errors[0]),
        "{what}: the error is not one line: {stderr}"
    );
    for w in words {
        assert!(
            errors[0].contains(w),
            "{what}: the error does not name {w}: {stderr}"
        );
    }
    errors[0].to_string()
}

/// A new FIFO (named pipe) called `name` in a folder of this process's own under the
/// temporary folder: an input that blocks a reader which opens it without care.
#[cfg(unix)]
pub fn make_fifo(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("labs-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
    path
}
