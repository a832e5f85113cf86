//! The lab's data-parallel commands: `collectives` (nccl-tests' table, PyTorch's
//! figures beside), `ddp` (one training step three ways) and `launch`. On two simulated
//! GPUs by default; under `LABS_DEVICE=cuda` on every GPU of the machine.

use std::process::{Command, Output};

fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-04", env!("CARGO_BIN_EXE_lab-04"))
}

/// The device under test and how many of its kind the lab uses.
fn device() -> (String, usize) {
    let d = std::env::var("LABS_DEVICE")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| "sim".into());
    let n = if d.starts_with("cuda") {
        labs_core::cuda::device_count().unwrap()
    } else {
        2
    };
    (d, n)
}

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env_remove("LABS_SIM_DEVICES")
        .output()
        .unwrap()
}

fn stdout(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The cells of the table rows that start with `first`.
fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .find(|cells| cells.get(1) == Some(&first))
        .unwrap_or_else(|| panic!("no row {first}:\n{text}"))
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn collectives_print_nccl_tests_table_with_pytorch_beside() {
    let (d, n) = device();
    let json = format!(
        r#"{{"op": "all_reduce", "dtype": "f32", "world_size": {n}, "device": "X",
            "nccl": "2.21.5", "results": [
            {{"bytes": 8, "count": 2, "time_us": 12.5, "algbw_gbps": 0.0, "busbw_gbps": 0.25,
              "correct": true}},
            {{"bytes": 16, "count": 4, "time_us": 13.0, "algbw_gbps": 0.0, "busbw_gbps": 0.5,
              "correct": false}}]}}"#
    )
    .replace('\n', " ");
    let path = std::env::temp_dir().join(format!("lab04-pytorch-{}.json", std::process::id()));
    std::fs::write(&path, format!("some torchrun chatter\n{json}\n")).unwrap();
    let p = path.to_string_lossy().to_string();
    let args = [
        "--device",
        &d,
        "collectives",
        "--maxbytes",
        "64",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--pytorch",
        &p,
    ];
    let text = stdout(run(&args));
    assert!(
        text.contains(&format!("all_reduce of f32 over {n} device(s)")),
        "{text}"
    );
    assert!(text.contains("PyTorch busbw (GB/s)"), "{text}");
    // 8 B to 64 B: four sizes, each with our time and PyTorch's where it measured one.
    assert_eq!(row(&text, "8")[1..2], ["2"]);
    assert_eq!(row(&text, "8")[5..], ["12.50", "0.25"]);
    assert_eq!(row(&text, "16")[5..], ["13.00", "0.50 (wrong)"]);
    assert_eq!(row(&text, "64")[5..], ["-", "-"]);
    assert!(row(&text, "32")[2].parse::<f64>().unwrap() > 0.0);
    // Another op than PyTorch measured is refused: the columns would not compare.
    let mut other = args.to_vec();
    other.extend(["--op", "all-gather"]);
    let out = run(&other);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("it measured all_reduce of f32"), "{err}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn reduce_scatter_sizes_are_whole_shares() {
    let (d, n) = device();
    let text = stdout(run(&[
        "--device",
        &d,
        "collectives",
        "--op",
        "reduce-scatter",
        "--minbytes",
        "4",
        "--maxbytes",
        "4",
        "--iters",
        "1",
    ]));
    // One float32 per rank at least: 4 bytes round up to n elements.
    let cells = row(&text, &(4 * n).to_string());
    assert_eq!(cells[1], n.to_string(), "{text}");
}

#[test]
fn one_training_step_three_ways() {
    let (d, n) = device();
    let text = stdout(run(&["--device", &d, "ddp", "--quick"]));
    assert!(text.contains("7. One training step three ways"), "{text}");
    let mib = |line: &str, col: usize| -> f64 {
        line.split('|')
            .map(str::trim)
            .nth(col)
            .unwrap()
            .parse()
            .unwrap()
    };
    let rows = |mode: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.split('|').nth(1).is_some_and(|c| c.trim() == mode))
            .map(String::from)
            .collect()
    };
    let (dp, ddp, zero) = (rows("DataParallel-style"), rows("DDP"), rows("ZeRO-1"));
    assert_eq!((dp.len(), ddp.len(), zero.len()), (n, n, n), "{text}");
    // DataParallel: the optimizer on the first device only. DDP: on every device.
    // ZeRO-1: a share of it on each.
    let state = mib(&ddp[0], 4);
    assert!(state > 0.0);
    assert_eq!(mib(&dp[0], 4), state);
    for r in 0..n {
        assert_eq!(mib(&ddp[r], 4), state);
        assert!(mib(&zero[r], 4) <= state / n as f64 + 0.01, "{text}");
        if r > 0 {
            assert_eq!(mib(&dp[r], 4), 0.0);
        }
    }
    if n > 1 {
        assert!(mib(&zero[0], 3) < mib(&ddp[0], 3), "{text}");
    }
}

#[test]
fn launch_runs_a_command_per_rank() {
    let text = stdout(run(&[
        "launch",
        "--nproc",
        "3",
        "--",
        "sh",
        "-c",
        "echo rank $RANK of $WORLD_SIZE",
    ]));
    for r in 0..3 {
        assert!(
            text.contains(&format!("[rank {r}] rank {r} of 3")),
            "{text}"
        );
    }
    let out = run(&["launch", "--nproc", "2", "--", "sh", "-c", "exit $RANK"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 of 2 exited with code 1"), "{err}");
}

/// `lab-04 launch … | head -1`: the reader of the ranks' output goes away; the launcher
/// stops and reaps its ranks and says why, rather than dying and leaving them running.
#[test]
fn launch_stops_its_ranks_when_its_output_is_closed() {
    use std::io::{BufRead, BufReader, Read};
    let dir = std::env::temp_dir().join(format!("lab04-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Each rank notes its pid, prints a line, and again a second later.
    let script = "echo $$ > \"$PIDS/$RANK\"; echo $$; sleep 1; echo later; exec sleep 60";
    let mut child = Command::new(binary())
        .args(["launch", "--nproc", "2", "--", "sh", "-c", script])
        .env("PIDS", &dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("[rank "), "{first}");
    // The reader is gone: stdout is closed.
    let started = std::time::Instant::now();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{stderr}"
    );
    let pids: Vec<u32> = (0..2)
        .filter_map(|rank| std::fs::read_to_string(dir.join(rank.to_string())).ok())
        .map(|p| p.trim().parse().unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(pids.len(), 2, "{stderr}");
    for pid in pids {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        assert!(
            !alive,
            "rank process {pid} outlived lab-04 launch ({status})"
        );
    }
    assert!(!status.success());
    assert!(
        stderr.contains("stopped") && stderr.contains("stdout"),
        "{stderr}"
    );
}

/// `lab-04 launch --nnodes 2`, one launcher per "machine" on loopback: the ranks are
/// numbered across the nodes and see one job; what is missing is named.
#[test]
fn launch_spans_nodes_with_one_token() {
    let port = labs_core::dist::free_loopback_port().unwrap().to_string();
    let node = |rank: &str| {
        Command::new(binary())
            .args([
                "launch",
                "--nproc",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                rank,
            ])
            .args(["--master-addr", "127.0.0.1", "--master-port", &port])
            .args([
                "--",
                "sh",
                "-c",
                "echo rank $RANK of $WORLD_SIZE local $LOCAL_RANK node $GROUP_RANK",
            ])
            .env("LABS_JOB_TOKEN", "one-token")
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| node("0"));
        let b = s.spawn(|| node("1"));
        (stdout(a.join().unwrap()), stdout(b.join().unwrap()))
    });
    for (text, n) in [(a, 0), (b, 1)] {
        for local in 0..2 {
            let rank = 2 * n + local;
            assert!(
                text.contains(&format!(
                    "[rank {rank}] rank {rank} of 4 local {local} node {n}"
                )),
                "{text}"
            );
        }
    }
    // Without a token, or without node 0's address, nothing starts.
    let out = Command::new(binary())
        .args([
            "launch",
            "--nproc",
            "1",
            "--nnodes",
            "2",
            "--master-addr",
            "127.0.0.1",
        ])
        .args(["--", "true"])
        .env_remove("LABS_JOB_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("LABS_JOB_TOKEN"), "{err}");
    let out = run(&["launch", "--nproc", "1", "--nnodes", "2", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--master-addr"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}
