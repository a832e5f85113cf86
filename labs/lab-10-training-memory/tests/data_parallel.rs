//! `lab-10 train --nproc N` (and `--ddp`, `--zero1`): data-parallel training, one rank
//! per device. On simulated GPUs the ranks are threads of one process; on GPUs
//! (`LABS_DEVICE=cuda`) processes started through `dist::launch`, one per GPU.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{binary, device, small};

/// The JSON of `train` on `device` with `extra` flags, outside any launched job.
fn train(device: &str, extra: &[&str]) -> Value {
    let out = Command::new(binary())
        .args(["train", "--device", device])
        .args(small(3))
        .arg("--json")
        .args(extra)
        .env_remove("WORLD_SIZE")
        .output()
        .unwrap();
    labs_core::testing::one_json_object(out)
}

fn category(v: &Value, name: &str) -> u64 {
    v["by_category"][name].as_u64().unwrap()
}

fn ranks(v: &Value) -> &Vec<Value> {
    v["ranks"].as_array().unwrap()
}

#[test]
fn ddp_on_two_simulated_gpus_reports_every_rank() {
    let single = train("sim", &[]);
    let v = train("sim", &["--nproc", "2"]);
    assert_eq!(v["world_size"], 2);
    assert_eq!(v["data_parallel"], "ddp");
    assert_eq!(single["world_size"], 1);
    assert!(single["ranks"].is_null() && single["data_parallel"].is_null());
    let every = ranks(&v);
    assert_eq!(every.len(), 2);
    // The same model and batch shapes on each rank: the same peaks.
    assert_eq!(every[0]["peak_allocated"], every[1]["peak_allocated"]);
    assert_eq!(every[0]["peak_allocated"], v["peak_allocated"]);
    // The first loss is rank 0's batch (seed + 0) on the same weights: the single run's.
    assert_eq!(v["losses"][0], single["losses"][0]);
    assert_ne!(
        v["losses"][1], single["losses"][1],
        "the step used both ranks"
    );
    // Throughput: 2 ranks x batch 2 per median step.
    let expected = 4.0 / (v["step_ms"].as_f64().unwrap() / 1e3);
    let got = v["samples_per_s"].as_f64().unwrap();
    assert!(
        (got - expected).abs() < 1e-6 * expected,
        "{got} vs {expected}"
    );
    // The gradients live in DDP's flat buckets: no more than the parameters.
    assert!(category(&v, "gradient") <= category(&v, "parameter"), "{v}");
}

#[test]
fn ddp_on_one_rank_trains_as_without_it() {
    let single = train("sim", &[]);
    let v = train("sim", &["--ddp"]);
    assert_eq!(v["world_size"], 1);
    assert_eq!(v["losses"], single["losses"]);
}

#[test]
fn zero1_shards_the_optimizer_state() {
    let ddp = train("sim", &["--nproc", "2", "--accum", "2"]);
    let zero = train("sim", &["--nproc", "2", "--accum", "2", "--zero1"]);
    assert_eq!(zero["data_parallel"], "zero1");
    let (d, z) = (
        category(&ddp, "optimizer_state"),
        category(&zero, "optimizer_state"),
    );
    // Adam's two float32 moments of half the parameters each: one flat shard, rounded
    // once to the allocator's 512 bytes; under DDP every parameter's, rounded each.
    let shard = zero["params"].as_u64().unwrap().div_ceil(2);
    assert_eq!(z, 2 * (4 * shard).div_ceil(512) * 512);
    assert!(d >= 2 * 4 * 2 * shard && 2 * z <= d, "{z} vs {d}");
    // The same averaged gradients and the same update: the same losses.
    let (a, b) = (
        ddp["losses"].as_array().unwrap(),
        zero["losses"].as_array().unwrap(),
    );
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{a:?} vs {b:?}");
    }
}

#[test]
fn the_dry_run_predicts_every_ranks_peaks() {
    let sim = train("sim", &["--nproc", "2"]);
    let dry = train("dry", &["--nproc", "2"]);
    assert!(dry["losses"].is_null());
    for r in 0..2 {
        assert_eq!(
            ranks(&dry)[r]["peak_allocated"],
            ranks(&sim)[r]["peak_allocated"]
        );
    }
}

#[test]
fn every_device_of_the_device_under_test_takes_a_rank() {
    // On GPUs: one process per GPU through the launcher (NCCL); on the simulator, two
    // threads.
    let d = device();
    let n = if d.starts_with("cuda") {
        labs_core::cuda::device_count().unwrap()
    } else {
        2
    };
    let v = train(&d, &["--nproc", &n.to_string()]);
    assert_eq!(v["world_size"], n);
    assert_eq!(ranks(&v).len(), n);
    let peak = v["peak_allocated"].as_u64().unwrap();
    assert!(ranks(&v).iter().all(|r| r["peak_allocated"] == peak), "{v}");
    assert!(v["samples_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn ranks_started_by_a_launcher_join_one_job() {
    // What `torchrun` (or `dist::launch`) starts: one process per rank, WORLD_SIZE set;
    // here over simulated GPUs, the collectives through the rendezvous's connections.
    let mut args: Vec<String> = ["train", "--device", "sim"]
        .iter()
        .map(|s| s.to_string())
        .chain(small(3))
        .chain(["--json".to_string()])
        .collect();
    args.push("--zero1".into());
    let mut rank0 = Vec::new();
    let mut others = Vec::new();
    labs_core::dist::launch_with(2, &binary().to_string_lossy(), &args, |line| {
        if line.rank == 0 && line.stream == labs_core::dist::OutputStream::Stdout {
            rank0.push(line.text);
        } else {
            others.push(line.text);
        }
    })
    .unwrap();
    assert_eq!(
        rank0.len(),
        1,
        "rank 0 prints one line: {rank0:?} {others:?}"
    );
    assert!(others.is_empty(), "{others:?}");
    let v: Value = serde_json::from_str(&rank0[0]).unwrap();
    assert_eq!(v["world_size"], 2);
    assert_eq!(v["data_parallel"], "zero1");
    // The same run as two threads: the same losses, the same peaks.
    let threads = train("sim", &["--nproc", "2", "--zero1"]);
    assert_eq!(v["losses"], threads["losses"]);
    assert_eq!(ranks(&v).len(), 2);
    for r in 0..2 {
        assert_eq!(
            ranks(&v)[r]["peak_allocated"],
            ranks(&threads)[r]["peak_allocated"]
        );
    }
}

/// `train` of a GPT-2 of 12 blocks, width 64, on `device`, with `extra` flags.
fn train_gpt2(device: &str, extra: &[&str]) -> Value {
    let out = Command::new(binary())
        .args([
            "train", "--device", device, "--model", "gpt2", "--layers", "12",
        ])
        .args([
            "--d-model",
            "64",
            "--nhead",
            "2",
            "--vocab",
            "256",
            "--batch",
            "2",
        ])
        .args([
            "--seq",
            "32",
            "--steps",
            "3",
            "--accum",
            "2",
            "--optimizer",
            "adam",
        ])
        .args(["--dropout", "0", "--json"])
        .args(extra)
        .env_remove("WORLD_SIZE")
        .output()
        .unwrap();
    labs_core::testing::one_json_object(out)
}

#[test]
fn zero3_shards_the_parameters_and_trains_as_ddp() {
    // On every device of the device under test: on GPUs one process per GPU through
    // NCCL, on the simulator two threads.
    let d = device();
    let n = if d.starts_with("cuda") {
        labs_core::cuda::device_count().unwrap()
    } else {
        2
    };
    let nproc = n.to_string();
    let ddp = train_gpt2(&d, &["--nproc", &nproc]);
    let zero = train_gpt2(&d, &["--nproc", &nproc, "--zero3"]);
    assert_eq!(zero["data_parallel"], "zero3");
    assert_eq!(zero["world_size"], n);
    // The same averaged gradients and the same update: the same losses.
    let (a, b) = (
        ddp["losses"].as_array().unwrap(),
        zero["losses"].as_array().unwrap(),
    );
    assert_eq!(a.len(), 3);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{a:?} vs {b:?}");
    }
    // At the peak a rank holds its shard of every parameter and a few blocks whole,
    // and its shard of the gradients and of Adam's moments. Over one rank a shard is
    // the whole: the parameters are all there, and the gathered block beside them.
    for name in ["parameter", "gradient", "optimizer_state"] {
        let (z, p) = (category(&zero, name), category(&ddp, name));
        if n > 1 {
            assert!(z < p, "{name}: ZeRO-3 {z} against DDP's {p}");
        } else if name == "parameter" {
            assert!(z > p, "{name}: ZeRO-3 {z} on one rank against DDP's {p}");
        }
    }
    if !d.starts_with("cuda") {
        // The dry run predicts each rank's peak.
        let dry = train_gpt2("dry", &["--nproc", &nproc, "--zero3"]);
        for r in 0..n {
            assert_eq!(
                ranks(&dry)[r]["peak_allocated"],
                ranks(&zero)[r]["peak_allocated"]
            );
        }
    }
}

#[test]
fn launched_ranks_on_simulated_gpus_take_the_capacity_given() {
    // Each rank a process, as under torchrun, on a simulated GPU of 64 MiB: the batch does
    // not fit, and the report says so with that capacity.
    let mut args: Vec<String> = ["--capacity", "64MiB", "train", "--device", "sim", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(
        [
            "--model",
            "gpt2",
            "--d-model",
            "64",
            "--nhead",
            "2",
            "--layers",
            "2",
            "--vocab",
            "256",
            "--batch",
            "64",
            "--seq",
            "128",
            "--steps",
            "2",
        ]
        .map(String::from),
    );
    let mut rank0 = Vec::new();
    let status = labs_core::dist::launch_with(2, &binary().to_string_lossy(), &args, |line| {
        if line.rank == 0 && line.stream == labs_core::dist::OutputStream::Stdout {
            rank0.push(line.text);
        }
    });
    // Out of memory is the run's failure, as on one device, after its report.
    assert!(status.is_err(), "{rank0:?}");
    let v: Value = serde_json::from_str(rank0.first().expect("rank 0's report")).unwrap();
    let oom = v["oom"].as_str().unwrap();
    assert!(oom.contains("total capacity of 64.00 MiB"), "{oom}");
}
