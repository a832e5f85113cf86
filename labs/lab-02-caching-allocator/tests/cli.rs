//! The lab's command line: the JSON contracts of `replay` and `bench`, and errors.

use std::process::Command;

fn lab() -> Command {
    let mut c = Command::new(labs_core::testing::lab_binary(
        "lab-02",
        env!("CARGO_BIN_EXE_lab-02"),
    ));
    c.args(["--device", "sim"]);
    c
}

fn trace(name: &str) -> std::path::PathBuf {
    labs_core::testing::data_dir()
        .join("traces")
        .join(format!("{name}.trace.csv.gz"))
}

#[test]
fn replay_json_is_one_object_with_the_documented_keys() {
    // PyTorch's defaults unless told otherwise: fixed segments, PyTorch's peak.
    let out = lab()
        .args(["replay", "--json"])
        .arg(trace("seed_transformer_b64"))
        .env_remove("LABS_ALLOC_CONF")
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    assert_eq!(v["conf"], "expandable_segments:False", "{v}");
    assert_eq!(v["peak_reserved"], 2_927_624_192u64, "{v}");
    assert_eq!(v["num_maps"], 0, "{v}");
    let out = lab()
        .args(["replay", "--json", "--conf", "preset:labs"])
        .arg(trace("seed_transformer_b64"))
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    for key in [
        "trace",
        "conf",
        "ops",
        "peak_requested",
        "peak_allocated",
        "peak_reserved",
        "device_allocs",
        "num_maps",
        "num_unmaps",
        "num_sync_all_streams",
        "driver_calls_per_quarter",
        "steady_driver_calls",
        "ns_per_op",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["trace"], "seed_transformer_b64");
    let ratio =
        v["peak_reserved"].as_u64().unwrap() as f64 / v["peak_requested"].as_u64().unwrap() as f64;
    assert!(ratio <= 1.037, "{ratio}");
    // The quarters add up to every call that took, gave back or remapped memory.
    let quarters: Vec<u64> = (v["driver_calls_per_quarter"].as_array().unwrap().iter())
        .map(|q| q.as_u64().unwrap())
        .collect();
    let d = &v["driver_ns"];
    let calls: u64 = [
        "segment_alloc",
        "segment_free",
        "create",
        "map",
        "access",
        "unmap",
        "release",
    ]
    .iter()
    .map(|k| d[k]["calls"].as_u64().unwrap())
    .sum();
    assert_eq!(
        (quarters.len(), quarters.iter().sum::<u64>()),
        (4, calls),
        "{v}"
    );
    assert_eq!(v["steady_driver_calls"], quarters[3], "{v}");
    // Driver calls on sim are exact: few syncs, no more mappings than pages at the peak.
    let pages = v["peak_reserved"].as_u64().unwrap().div_ceil(2 << 20);
    assert!(v["num_maps"].as_u64().unwrap() <= pages, "{v}");
    assert!(v["num_sync_all_streams"].as_u64().unwrap() <= 24, "{v}");
}

#[test]
fn bench_json_is_one_object_with_the_documented_keys() {
    let out = lab().args(["bench", "--json"]).output().unwrap();
    let v = labs_core::testing::one_json_object(out);
    let positive = |x: &serde_json::Value| x.as_f64().is_some_and(|x| x > 0.0);
    assert!(positive(&v["alloc_free_pair_ns"]), "{v}");
    for key in [
        "cached_pair_ns",
        "cached_pair_1000_live_ns",
        "raw_driver_pair_ns",
    ] {
        let per_size = v[key].as_object().unwrap_or_else(|| panic!("{key}: {v}"));
        assert_eq!(per_size.len(), 3, "{key}: {v}");
        assert!(per_size.values().all(positive), "{key}: {v}");
    }
    let vm = v["vm_call_ns"].as_object().unwrap();
    assert_eq!(vm.len(), 4, "{v}");
    for calls in vm.values() {
        for call in ["create", "map", "access", "unmap", "release"] {
            assert!(positive(&calls[call]), "{call}: {v}");
        }
    }
    let by_mappings = v["access_32_pages_ns_by_mappings"].as_object().unwrap();
    assert_eq!(by_mappings.len(), 3, "{v}");
    // One access among 0, 4 and 16 live mappings on the simulated GPU.
    let among = v["access_16_mib_ns_by_live_mappings"].as_object().unwrap();
    let counts: Vec<&str> = among.keys().map(String::as_str).collect();
    assert_eq!(counts, ["0", "16", "4"], "{v}");
    assert!(among.values().all(positive), "{v}");
}

#[test]
fn replay_of_a_malformed_file_fails_naming_the_line() {
    let path = std::env::temp_dir().join(format!("lab02-bad-{}.csv", std::process::id()));
    std::fs::write(&path, "action,addr,size,stream\nalloc,1,512\n").unwrap();
    let out = lab().arg("replay").arg(&path).output().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn a_bad_conf_is_a_clear_error() {
    let out = lab()
        .args(["replay", "--conf", "max_split_size_mb:5"])
        .arg(trace("seed_transformer_b64"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_split_size_mb"));
}

/// A trace file of `body` after the header, in a fresh temporary directory.
fn temp_trace(name: &str, body: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lab02-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("action,addr,size,stream\n{body}")).unwrap();
    path
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_closed_pipe_ends_the_lab_quietly() {
    use std::io::{BufRead, BufReader};
    let mut child = lab()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader has gone (as `| head -1`): the lab's next writes meet a closed pipe.
    let out = child.wait_with_output().unwrap();
    assert!(!first.is_empty());
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert!(
            out.status.success() || out.status.signal() == Some(13),
            "{:?}: {}",
            out.status,
            stderr(&out)
        );
    }
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn frees_of_unallocated_addresses_fail_unless_lenient_and_are_counted() {
    let path = temp_trace(
        "double-free.trace.csv",
        "alloc,4096,512,0\nfree_requested,4096,512,0\nfree_requested,4096,512,0\nfree_requested,8192,512,0\n",
    );
    let out = lab().arg("replay").arg(&path).output().unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("line 4"), "{}", stderr(&out));
    let out = lab()
        .args(["replay", "--json", "--lenient"])
        .arg(&path)
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    assert_eq!(v["unknown_frees"], 2, "{v}");
    assert_eq!(v["ops"], 2, "{v}");
}

#[test]
fn replay_honours_the_environment() {
    let t = trace("seed_transformer_b64");
    let out = lab()
        .env("LABS_ALLOC_CONF", "garbage")
        .arg("replay")
        .arg(&t)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("LABS_ALLOC_CONF"), "{}", stderr(&out));
    let out = lab()
        .env("LABS_ALLOC_CONF", "expandable_segments:False")
        .args(["replay", "--json"])
        .arg(&t)
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    assert!(
        v["conf"]
            .as_str()
            .unwrap()
            .contains("expandable_segments:False"),
        "{v}"
    );
    // A simulated GPU too small for the trace: the capacity was applied.
    let out = lab()
        .env("LABS_SIM_CAPACITY", "64MiB")
        .arg("replay")
        .arg(&t)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("out of memory"), "{}", stderr(&out));
}

#[test]
fn sizes_on_the_command_line_are_exact() {
    for capacity in ["0.5", "0", "1e30", "18446744073709551616"] {
        let out = lab()
            .args(["replay", "--capacity", capacity])
            .arg(trace("seed_transformer_b64"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "--capacity {capacity} was accepted");
        let err = stderr(&out);
        assert!(
            err.contains("--capacity") && !err.contains("is not a size unit"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn trace_errors_name_the_file_once_and_limits_can_be_set() {
    let path = temp_trace("named-once.trace.csv", "alloc,1,x,0\n");
    let out = lab().arg("replay").arg(&path).output().unwrap();
    assert_eq!(
        stderr(&out).matches("named-once.trace.csv").count(),
        1,
        "{}",
        stderr(&out)
    );
    let out = lab()
        .args(["replay", "--max-trace-size", "1KiB"])
        .arg(trace("seed_transformer_b64"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    // The gzip'd file alone is over 1 KiB: refused before it is decompressed.
    assert!(
        stderr(&out).contains("more than the 1.00 KiB (1024 bytes) a trace may be")
            && stderr(&out).contains("--max-trace-size"),
        "{}",
        stderr(&out)
    );
}

/// `mappings` prints one table per shared trace: PyTorch's defaults, PyTorch's
/// expandable segments, then the labs' preset at 2, 16 (its default), 64 MiB and one
/// mapping per block, each with fewer driver mappings than the one before, and all
/// below fixed segments, then the driver's stream-ordered pool, one call per request;
/// each of ours with its calls by quarter of the trace.
#[test]
fn mappings_prints_a_table_per_trace_with_every_mapping_size() {
    let out = lab().arg("mappings").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let tables: Vec<&str> = text
        .split("\n\n")
        .filter(|t| t.contains("allocator"))
        .collect();
    assert_eq!(tables.len(), 5, "{text}");
    for table in tables {
        // Columns from the right: x fixed, ns/op, calls by quarter, calls, ratio.
        let rows: Vec<(f64, u64, u64)> = (table.lines())
            .filter(|l| l.trim_start().starts_with("ours"))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().rev().take(5).collect();
                let quarters: u64 = f[2].split('/').map(|q| q.parse::<u64>().unwrap()).sum();
                (f[4].parse().unwrap(), f[3].parse().unwrap(), quarters)
            })
            .collect();
        assert_eq!(rows.len(), 7, "{table}");
        assert!(
            table.contains("preset labs, mappings of up to 16 MiB (its default)"),
            "{table}"
        );
        // Fixed segments make one call per segment; every expandable row calls more.
        assert!(rows[0].2 >= rows[0].1 && rows[0].1 > 0, "{table}");
        let preset = &rows[2..6];
        assert!(preset.windows(2).all(|w| w[0].1 >= w[1].1), "{table}");
        assert!(preset.iter().all(|r| r.0 <= rows[0].0), "{table}");
        assert!(rows[1].0 <= rows[0].0, "{table}");
        // The pool: a call per request, more than fixed segments' calls, and every
        // request and free in the quarters; it reserves at least what is live.
        let pool = rows[6];
        assert!(table.contains("ours, backend:cudaMallocAsync"), "{table}");
        assert!(pool.1 > rows[0].1 && pool.2 >= pool.1, "{table}");
        assert!(pool.0 >= 1.0, "{table}");
    }
    let one = lab().args(["mappings", "gpt2_fp32"]).output().unwrap();
    let text = String::from_utf8(one.stdout).unwrap();
    assert_eq!(
        text.matches("operations, peak requested").count(),
        1,
        "{text}"
    );
    assert!(text.starts_with("gpt2_fp32: "), "{text}");
    let bad = lab().args(["mappings", "gpt3"]).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        err.contains("no trace gpt3") && err.contains("gpt2_varlen"),
        "{err}"
    );
}

/// PyTorch's twin runs on the GPU, beside ours on the same GPU: asked for beside the
/// simulated GPU, both commands refuse, saying what to add.
#[test]
fn a_pytorch_comparison_needs_a_gpu() {
    for args in [
        vec!["mappings", "--pytorch", "ci/pytorch-replay.py"],
        vec!["replay", "--pytorch", "ci/pytorch-replay.py"],
    ] {
        let mut cmd = lab();
        cmd.args(&args);
        if args[0] == "replay" {
            cmd.arg(trace("seed_transformer_b64"));
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("add --device cuda"), "{args:?}: {err}");
    }
}

/// A FIFO given as the trace: refused at once, naming it, rather than waiting forever
/// for a writer.
#[cfg(unix)]
#[test]
fn a_fifo_as_the_trace_is_refused_at_once() {
    let dir = std::env::temp_dir().join(format!("lab02-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("trace.csv");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let (out, in_time) = labs_core::testing::output_within(
        lab().arg("replay").arg(&fifo),
        std::time::Duration::from_secs(10),
    );
    assert!(in_time, "lab-02 replay of a FIFO finishes within 10 s");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(fifo.to_str().unwrap()) && err.contains("FIFO"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
