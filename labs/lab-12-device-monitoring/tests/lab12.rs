//! Lab 12 through its library and its command line, on the simulated GPU: `smi`'s
//! report, the gap between NVML's line and the allocator's counters taken apart, the
//! polled loop, the process table, and the errors users get for bad input.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lab_12::gap::{self, Figures, Sizes};
use lab_12::poll::{self, Options};
use lab_12::processes;
use lab_12::smi::{self, Source};
use labs_core::testing::{one_json_object, test_device};
use labs_core::Device;

const MIB: u64 = 1 << 20;

fn lab(args: &[&str]) -> Output {
    Command::new(labs_core::testing::lab_binary(
        "lab-12",
        env!("CARGO_BIN_EXE_lab-12"),
    ))
    .args(args)
    .env_remove("LABS_DEVICE")
    .output()
    .expect("the lab binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A simulated GPU of this test's own, so that no other test's memory shows in its
/// figures.
fn own_sim() -> (Device, Source) {
    let d = Device::new_sim(4 << 30);
    let s = Source::for_device(&d, true).unwrap();
    (d, s)
}

#[test]
fn smi_on_the_simulated_gpu_reports_its_own_figures() {
    let d = Device::new_sim(8 << 30);
    let _held = d.raw_buffer(3 << 20).unwrap();
    let r = smi::sim_report(&d).unwrap();
    let mem = d.mem_info().unwrap();
    assert_eq!((r.total, r.used), (mem.total, mem.total - mem.free));
    assert_eq!(r.used, 3 << 20);
    assert_eq!(r.name, d.properties().unwrap().name);
    assert_eq!(r.processes.len(), 1);
    assert_eq!(smi::this_process(&r).unwrap().used, Some(3 << 20));
    // No clock, sensors or power on the simulated GPU: shown as absent, not as zero.
    assert_eq!(r.utilization_percent, None);
    assert_eq!(r.temperature_c, None);
    let text: String = smi::tables("t", &[r])
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert!(
        text.contains("8.00 GiB") && text.contains("3.00 MiB"),
        "{text}"
    );

    let out = lab(&["smi", "--device", "sim", "--loop", "0.01", "--count", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).matches("Processes").count(), 2);
}

#[test]
fn smi_reports_the_device_under_test() {
    // NVML on a GPU (LABS_DEVICE=cuda), the simulator's figures otherwise.
    let d = test_device();
    let report = Source::for_device(&d, true).unwrap().sample_one().unwrap();
    assert!(report.total > 0 && report.used <= report.total);
    assert!(!report.name.is_empty());
}

#[test]
fn missing_nvml_is_a_message_not_a_panic() {
    // On a machine with the driver this opens; without one the message must say what
    // is missing and what to do.
    if let Err(e) = smi::open_nvml() {
        let text = e.to_string();
        assert!(
            text.contains("libnvidia-ml") && text.contains("--device sim"),
            "{text}"
        );
    }
}

#[test]
fn the_gap_on_the_simulated_gpu_is_the_direct_allocation_to_the_byte() {
    let (d, source) = own_sim();
    let sizes = Sizes::for_device(&d);
    let g = gap::run(&d, &source, sizes).unwrap();
    for r in &g.rows {
        if let (Some(a), Some(res)) = (r.allocated, r.reserved) {
            assert!(a <= res, "{r:?}");
            // The simulator's used memory is what mem_get_info and its NVML model say.
            assert_eq!(r.driver_used, Some(r.device), "{r:?}");
            if let Some(p) = r.process {
                assert!(p >= res && p <= r.device, "{r:?}");
            }
        }
    }
    let row = |step: &str| g.rows.iter().find(|r| r.step == step).unwrap().clone();
    // Before the direct allocation NVML's line is the allocator's segments; from then
    // on, those plus the direct allocation, exactly: the simulated GPU has no context.
    let product = row("a matrix product");
    assert_eq!(product.process, product.reserved);
    for step in [
        "a direct allocation",
        "half the tensors dropped",
        "empty_cache()",
    ] {
        let r = row(step);
        assert_eq!(
            r.process.unwrap(),
            r.reserved.unwrap() + sizes.direct as u64,
            "{step}"
        );
    }
    // Dropping tensors moves memory_allocated only; empty_cache hands their segments
    // back (each tensor is a segment of its own: over 10 MiB, a multiple of 2 MiB).
    let (before, dropped, emptied) = (
        row("a direct allocation"),
        row("half the tensors dropped"),
        row("empty_cache()"),
    );
    let half = (sizes.tensors / 2 * sizes.tensor) as u64;
    assert_eq!(dropped.allocated.unwrap(), before.allocated.unwrap() - half);
    assert_eq!(dropped.reserved, before.reserved);
    assert_eq!(dropped.process, before.process);
    assert_eq!(emptied.reserved.unwrap(), dropped.reserved.unwrap() - half);

    // The parts: the tensors kept (half of them and the product's three matrices),
    // no workspace on the simulated GPU, the cache, the direct allocation; the
    // context and other processes are what the simulated GPU cannot show.
    let matrices = 3 * (sizes.side * sizes.side * 4) as u64;
    let p = g.parts;
    assert_eq!(p.tensors, half + matrices);
    assert_eq!(p.workspace, 0);
    assert_eq!(p.cache, g.figures.reserved - g.figures.allocated);
    assert!(p.cache >= half);
    assert_eq!(p.direct, sizes.direct as u64);
    assert_eq!((p.context, p.others), (None, None));
    assert_eq!(
        p.tensors + p.workspace + p.cache + p.direct,
        g.figures.process.unwrap()
    );
    // And it leaves the device as it found it.
    assert_eq!(d.mem_info().unwrap().free, d.mem_info().unwrap().total);
}

#[test]
fn a_lent_workspace_is_allocated_memory_of_its_own() {
    let (d, source) = own_sim();
    d.set_gemm_workspace_bytes(8 << 20).unwrap();
    let sizes = Sizes::for_device(&d);
    let g = gap::run(&d, &source, sizes).unwrap();
    let p = g.parts;
    assert_eq!(p.workspace, 8 * MIB);
    let matrices = 3 * (sizes.side * sizes.side * 4) as u64;
    assert_eq!(
        p.tensors,
        (sizes.tensors / 2 * sizes.tensor) as u64 + matrices
    );
    assert_eq!(g.figures.allocated, p.tensors + p.workspace);
    // The workspace is the allocator's: in reserved, not in the gap.
    assert_eq!(
        g.figures.process.unwrap() - g.figures.reserved,
        sizes.direct as u64
    );
}

#[test]
fn attribute_takes_a_gpus_figures_apart() {
    let f = Figures {
        allocated: 600 * MIB,
        reserved: 700 * MIB,
        workspace: 32 * MIB,
        direct: 256 * MIB,
        process: Some(1500 * MIB),
        device: 2000 * MIB,
        real_gpu: true,
    };
    let p = gap::attribute(&f);
    assert_eq!(p.tensors, 568 * MIB);
    assert_eq!(p.cache, 100 * MIB);
    assert_eq!(p.context, Some(544 * MIB));
    assert_eq!(p.others, Some(500 * MIB));
    // Not listed by NVML: neither part can be known.
    let unlisted = gap::attribute(&Figures { process: None, ..f });
    assert_eq!((unlisted.context, unlisted.others), (None, None));
    // Figures that contradict each other (read at different moments) give no part.
    let short = gap::attribute(&Figures {
        process: Some(900 * MIB),
        ..f
    });
    assert_eq!(short.context, None);
}

#[test]
fn polling_sees_the_plateau_of_reserved_memory_not_the_steps() {
    let (d, source) = own_sim();
    let options = Options {
        duration: Duration::from_millis(800),
        interval: Duration::from_millis(10),
    };
    let p = poll::run(&d, &source, options).unwrap();
    assert!(p.steps >= 1, "{} steps", p.steps);
    assert!(p.samples.len() >= 3, "{} samples", p.samples.len());
    for s in &p.samples {
        assert!(s.allocated <= s.reserved, "{s:?}");
        if let Some(process) = s.process {
            assert!(process >= s.reserved && process == s.device, "{s:?}");
        }
        assert_eq!(s.util, None, "no utilisation on the simulated GPU");
    }
    assert!(p.samples.windows(2).all(|w| w[0].at <= w[1].at));
    // Within every step memory_allocated swings; the peak is at least its highest
    // reading after a phase.
    let (low, high) = p.phase_allocated;
    assert!(low < high && high <= p.max_allocated, "{p:?}");
    assert!(p.max_allocated <= p.max_reserved);
    // The last sample, taken with the model still held, is the plateau: the cache
    // keeps the peak reservation, which is all NVML's line holds on the simulated GPU.
    let last = p.samples.last().unwrap();
    assert_eq!(last.process, Some(p.max_reserved));
    assert_eq!(last.reserved, p.max_reserved);
    // NVML's line never went above that, whatever memory_allocated did in between.
    assert!(p.samples.iter().all(|s| s.process <= Some(p.max_reserved)));
    // Runs of equal readings cover every sample, in order.
    let runs = poll::runs(&p.samples);
    assert_eq!(runs.iter().map(|r| r.len()).sum::<usize>(), p.samples.len());
    assert_eq!(d.mem_info().unwrap().free, d.mem_info().unwrap().total);
}

#[test]
fn the_process_table_finds_this_process_by_its_id() {
    let (d, source) = own_sim();
    let options = processes::Options {
        bytes: 24 * MIB,
        child: None,
    };
    let p = processes::run(&d, &source, &options).unwrap();
    assert_eq!(p.pid, std::process::id());
    let this = p.this().expect("this process is listed");
    assert_eq!(this.who, "this process");
    // Over 10 MiB, a multiple of 2 MiB: a segment of exactly its size.
    assert_eq!(this.reserved, Some(24 * MIB));
    assert_eq!(this.used, this.reserved);
    assert_eq!(p.entries.len(), 1);
    assert_eq!(p.device_used, 24 * MIB);
    assert_eq!(d.mem_info().unwrap().free, d.mem_info().unwrap().total);
}

/// The child `processes` starts on a GPU: it says it holds its memory, and keeps it
/// until its standard input closes.
#[test]
fn hold_keeps_its_memory_until_its_input_closes() {
    let mut child = Command::new(labs_core::testing::lab_binary(
        "lab-12",
        env!("CARGO_BIN_EXE_lab-12"),
    ))
    .args([
        "hold",
        "--device",
        "sim",
        "--bytes",
        &(24 * MIB).to_string(),
    ])
    .env_remove("LABS_DEVICE")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("ready {}", 24 * MIB));
    std::thread::sleep(Duration::from_millis(50));
    assert!(child.try_wait().unwrap().is_none(), "it held on");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn every_experiment_runs_from_the_command_line() {
    let v = one_json_object(lab(&["--device", "sim", "--json"]));
    for key in ["smi", "gap", "poll", "processes"] {
        assert!(!v[key].is_null(), "no {key}: {v}");
    }
    assert_eq!(v["gap"]["parts"]["direct"], v["gap"]["sizes"]["direct"]);
    assert!(v["poll"]["steps"].as_u64().unwrap() > 0);
    let pid = v["processes"]["pid"].as_u64().unwrap();
    let listed = v["processes"]["processes"].as_array().unwrap();
    assert!(listed
        .iter()
        .any(|p| p["pid"] == pid && p["who"] == "this process"));

    let text = lab(&["--device", "sim"]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = stdout(&text);
    // The headings book-outputs.sh splits the run at, in order.
    let lines: Vec<&str> = text.lines().collect();
    let mut last = None;
    for heading in [
        "1. The device-wide view",
        "2. The gap between NVML and memory_reserved",
        "3. Polling NVML",
        "4. Which process holds what",
    ] {
        let at = lines.iter().position(|l| l.starts_with(heading));
        assert!(
            at.is_some() && at > last,
            "{heading:?} out of place: {text}"
        );
        last = at;
    }
}

#[test]
fn each_command_prints_json_with_the_relations_of_its_figures() {
    let g = one_json_object(lab(&[
        "gap",
        "--device",
        "sim",
        "--json",
        "--gemm-workspace",
        "4MiB",
    ]));
    let f = &g["figures"];
    assert_eq!(f["workspace"], 4 * MIB);
    assert!(f["allocated"].as_u64() <= f["reserved"].as_u64());
    assert_eq!(
        f["nvml_process"].as_u64().unwrap(),
        f["reserved"].as_u64().unwrap() + f["direct"].as_u64().unwrap()
    );
    let p = one_json_object(lab(&[
        "poll",
        "--device",
        "sim",
        "--json",
        "--seconds",
        "0.3",
        "--interval",
        "0.05",
    ]));
    assert!(p["samples"].as_array().unwrap().len() >= 2);
    assert!(p["max_allocated"].as_u64() <= p["max_reserved"].as_u64());
    let pr = one_json_object(lab(&[
        "processes",
        "--device",
        "sim",
        "--json",
        "--bytes",
        "12MiB",
    ]));
    assert_eq!(pr["bytes"], 12 * MIB);
    assert_eq!(pr["device_used"], 12 * MIB);
}

#[test]
fn bad_input_is_a_one_line_error_with_a_non_zero_exit() {
    let cases: &[(&[&str], &str)] = &[
        (&["smi", "--count", "0"], "count"),
        (&["smi", "--loop", "soon"], "soon"),
        (&["smi", "--device", "cpu"], "host"),
        (&["gap", "--device", "cpu"], "host"),
        (&["--device", "tpu"], "tpu"),
        (&["gap", "--gemm-workspace", "lots"], "--gemm-workspace"),
        (&["poll", "--seconds", "0"], "positive"),
        (&["poll", "--interval", "-1"], "-1"),
        (&["processes", "--bytes", "0"], "--bytes"),
        (&["processes", "--bytes", "many"], "--bytes"),
        (&["bogus"], "bogus"),
    ];
    for (args, expect) in cases {
        let out = lab(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // Clap's own errors add a line pointing to --help; the lab's are one line.
        if !err.contains("--help") {
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        }
    }
}

/// `--device cuda` on a machine without a GPU or without NVML: one line saying what is
/// missing. (On a GPU machine the command succeeds.)
#[test]
fn cuda_without_a_gpu_or_nvml_is_one_line() {
    for args in [["smi", "--device", "cuda"], ["gap", "--device", "cuda"]] {
        let out = lab(&args);
        if !out.status.success() {
            let err = stderr(&out);
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("error: "), "{args:?}: {err}");
            assert!(!err.contains("panicked"), "{args:?}: {err}");
        }
    }
}
