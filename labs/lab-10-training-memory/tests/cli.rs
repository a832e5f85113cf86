//! The lab's command line: `train --json` prints every field, tables otherwise, and bad
//! input is refused with a message that names the flag.

use std::process::{Command, Output};

mod common;
use common::{binary, device, small};

/// A two-block GPT-2 of width 64 on sequences of 64.
const TINY_GPT2: &[&str] = &[
    "--model",
    "gpt2",
    "--d-model",
    "64",
    "--nhead",
    "2",
    "--layers",
    "2",
    "--seq",
    "64",
];

fn train(extra: &[&str]) -> Output {
    Command::new(binary())
        .args(["train", "--device", &device()])
        .args(small(2))
        .args(extra)
        .output()
        .unwrap()
}

/// A command that failed, and its stderr.
fn refused(out: Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

const FIELDS: &[&str] = &[
    "model",
    "config",
    "device",
    "allocator",
    "params",
    "peak_allocated",
    "peak_reserved",
    "by_category",
    "step_ms",
    "losses",
    "attention_fused_calls",
    "attention_math_calls",
    "skipped_steps",
    "offload",
    "num_ooms",
    "oom",
    "world_size",
    "data_parallel",
    "samples_per_s",
    "model_flops_per_step",
    "peak_flops",
    "mfu",
    "ranks",
    "gemm_workspace_bytes",
    "driver_calls_per_step",
    "steady_driver_calls_per_step",
    "graph",
];

#[test]
fn the_json_has_every_field() {
    let v = labs_core::testing::one_json_object(train(&[
        "--json",
        "--amp",
        "f16",
        "--offload",
        "--checkpoint",
        "selective",
    ]));
    let o = v.as_object().unwrap();
    for f in FIELDS {
        assert!(o.contains_key(*f), "missing {f}: {v}");
    }
    assert_eq!(o.len(), FIELDS.len(), "unexpected fields: {v}");
    assert_eq!(v["model"], "transformer");
    // PyTorch's defaults unless LABS_ALLOC_CONF or --conf says otherwise.
    if std::env::var_os("LABS_ALLOC_CONF").is_none() {
        assert_eq!(v["allocator"], "expandable_segments:False", "{v}");
    }
    for flag in [
        "d_model",
        "nhead",
        "layers",
        "ffn",
        "vocab",
        "dropout",
        "batch",
        "seq",
        "steps",
        "accum",
        "checkpoint",
        "offload",
        "attention",
        "amp",
        "optimizer",
        "lr",
        "seed",
        "warmup",
    ] {
        assert!(v["config"].get(flag).is_some(), "config lacks {flag}: {v}");
    }
    assert_eq!(v["config"]["checkpoint"], "selective");
    assert_eq!(v["config"]["amp"], "f16");
    assert_eq!(v["losses"].as_array().unwrap().len(), 2);
    assert!(v["skipped_steps"].is_u64());
    assert!(v["offload"]["offloaded_bytes"].is_u64());
    assert!(v["step_ms"].as_f64().unwrap() > 0.0);
    assert!(v["oom"].is_null());
    // The model's FLOPs always; the utilisation where the GPU's peak is known (a GPU of
    // the table), a fraction of it.
    assert!(v["model_flops_per_step"].as_f64().unwrap() > 0.0, "{v}");
    match v["peak_flops"].as_f64() {
        Some(peak) => {
            let mfu = v["mfu"].as_f64().unwrap();
            assert!(peak > 1e12 && mfu > 0.0 && mfu < 1.0, "{v}");
        }
        None => assert!(v["mfu"].is_null(), "{v}"),
    }
    let peak = v["peak_allocated"].as_u64().unwrap();
    let split: u64 = (v["by_category"].as_object().unwrap().values())
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(split, peak);
}

#[test]
fn a_dry_run_reports_peaks_and_no_losses() {
    let out = Command::new(binary())
        .args(["train", "--dry-run", "--capacity", "24GiB", "--json"])
        .args(TINY_GPT2)
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    assert!(v["device"].as_str().unwrap().starts_with("dry"), "{v}");
    assert!(v["losses"].is_null() && v["step_ms"].is_null(), "{v}");
    assert!(v["peak_allocated"].as_u64().unwrap() > 0);
    // GPT-2 small's vocabulary and position table (max(seq, 1024)) by default.
    assert_eq!(v["config"]["vocab"], 50257);
}

#[test]
fn the_tables_summarise_the_run() {
    let out = train(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "peak allocated",
        "step time (median)",
        "The allocated peak by category",
        "activation",
    ] {
        assert!(text.contains(line), "missing {line}:\n{text}");
    }
}

#[test]
fn the_help_names_train_and_configs() {
    let out = Command::new(binary()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("train") && text.contains("configs"), "{text}");
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--amp", "fp8"], "--amp"),
        (&["--model", "bert"], "--model"),
        (&["--checkpoint", "some"], "--checkpoint"),
        (&["--nhead", "3"], "divisible by --nhead"),
        (&["--accum", "0"], "--accum must be at least 1"),
        (&["--dropout", "1.5"], "--dropout"),
        (
            &["--model", "gpt2", "--ffn", "100"],
            "GPT-2's feed-forward width",
        ),
        (&["--capacity", "lots"], "--capacity"),
        (&["--gemm-workspace", "lots"], "--gemm-workspace"),
        (&["--nproc", "0"], "--nproc must be at least 1"),
        (&["--nproc", "100000"], "--nproc 100000 is more than 1024"),
        (&["--zero1", "--amp", "f16"], "--zero1 with --amp f16"),
        (&["--offload", "--offload-share", "0"], "not a share"),
        (&["--offload", "--offload-share", "1.5"], "not a share"),
        (&["--offload", "--offload-share", "half"], "not a number"),
        (&["--offload-share", "0.5"], "--offload"),
        (&["--offload", "--offload-in-flight", "lots"], "not a size"),
        (&["--offload-in-flight", "32MiB"], "--offload"),
    ];
    for (args, message) in cases {
        let e = refused(train(args));
        assert!(e.contains(message), "{args:?}: {e}");
    }
    let e = refused(
        Command::new(binary())
            .args(["train", "--device", "cpu", "--amp", "bf16"])
            .args(small(2))
            .output()
            .unwrap(),
    );
    assert!(e.contains("--amp bf16") && e.contains("cpu"), "{e}");
    let e = refused(
        Command::new(binary())
            .args(["train", "--dry-run", "--device", "sim"])
            .output()
            .unwrap(),
    );
    assert!(e.contains("--dry-run"), "{e}");
}

/// `--gemm-workspace` gives every in-process rank of a dry run the workspace, as every
/// GPU of a launched run has its own: each rank's peak grows by it.
#[test]
fn every_dry_rank_takes_the_gemm_workspace() {
    let peaks = |extra: &[&str]| -> Vec<u64> {
        let out = Command::new(binary())
            .args(["train", "--device", "dry", "--nproc", "2", "--json"])
            .args(small(2))
            .args(extra)
            .output()
            .unwrap();
        let v = labs_core::testing::one_json_object(out);
        (v["ranks"].as_array().unwrap().iter())
            .map(|r| r["peak_allocated"].as_u64().unwrap())
            .collect()
    };
    let (plain, lent) = (peaks(&[]), peaks(&["--gemm-workspace", "1MiB"]));
    assert_eq!(plain.len(), 2);
    for (p, l) in plain.iter().zip(&lent) {
        assert_eq!(l - p, 1 << 20, "{plain:?} {lent:?}");
    }
}

#[test]
fn running_out_of_memory_prints_the_json_and_fails() {
    let out = Command::new(binary())
        .args(["train", "--device", "sim", "--capacity", "6MiB", "--json"])
        .args(small(2))
        .args(["--batch", "16", "--seq", "128"])
        .output()
        .unwrap();
    let e = refused(out.clone());
    assert!(e.contains("out of memory"), "{e}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["oom"].as_str().unwrap().contains("out of memory"), "{v}");
    assert!(v["peak_allocated"].as_u64().unwrap() > 0);
    assert!(v["num_ooms"].as_u64().unwrap() >= 1);
}

/// `--capacity` on the device under test: a simulated GPU of that size, or a GPU whose
/// allocator may reserve that much (PyTorch's memory fraction); the same run fits
/// without it.
#[test]
fn capacity_limits_the_device_under_test() {
    let run = |extra: &[&str]| {
        Command::new(binary())
            .args(extra)
            .args(["train", "--device", &device(), "--json"])
            .args(small(2))
            .args(["--batch", "16", "--seq", "128"])
            .output()
            .unwrap()
    };
    let fits = run(&[]);
    assert!(
        fits.status.success(),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );
    let limited = run(&["--capacity", "6MiB"]);
    let e = refused(limited.clone());
    assert!(e.contains("out of memory"), "{e}");
    // Where the model itself does not fit, the run ends before its report.
    if !limited.stdout.is_empty() {
        let v: serde_json::Value = serde_json::from_slice(&limited.stdout).unwrap();
        assert!(v["peak_reserved"].as_u64().unwrap() <= 6 << 20, "{v}");
    }
}

#[test]
fn the_timeline_of_the_last_step_is_drawn_by_category() {
    let path = std::env::temp_dir().join(format!("lab10-timeline-{}.svg", std::process::id()));
    let out = train(&["--json", "--timeline", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(svg.starts_with("<svg"), "not an SVG");
    // A training step holds parameters, optimizer state and gradients at least.
    for band in ["parameters (max", "optimizer state (max", "gradients (max"] {
        assert!(svg.contains(band), "no {band} band");
    }
    assert!(svg.contains("One training step: transformer"));
}

/// A FIFO given as PyTorch's figures is refused at once, naming it, instead of blocking
/// the lab until some program writes to it.
#[cfg(unix)]
#[test]
fn a_fifo_as_pytorchs_figures_is_refused_at_once() {
    let fifo = labs_core::testing::make_fifo("lab10-pytorch.jsonl");
    labs_core::testing::assert_refused(
        Command::new(binary())
            .args(["--device", "sim", "--quick", "--pytorch"])
            .arg(&fifo),
        std::time::Duration::from_secs(60),
        &[fifo.to_str().unwrap(), "FIFO"],
    );
}

/// The labs' preset in full-size loops: the tutorial Transformer and GPT-2 move pages
/// in their first steps, then leave briefly idle memory in place, and the steps after
/// the third make no driver call. On the dry device (the GPU's allocations, no kernels),
/// and on the GPU itself when the tests run there.
#[test]
fn the_labs_preset_makes_no_driver_call_once_the_steps_repeat() {
    let mut devices = vec!["dry".to_string()];
    if device().starts_with("cuda") {
        devices.push(device());
    }
    for d in devices {
        for model in [
            "--model transformer --batch 1",
            "--model gpt2 --batch 4 --seq 512",
        ] {
            let mut cmd = Command::new(binary());
            cmd.args(["train", "--device", &d, "--json", "--steps", "6"]);
            if d == "dry" {
                // An H100's: its memory, and cuBLAS's workspace from the allocator.
                cmd.args(["--gemm-workspace", "32MiB", "--capacity", "80GiB"]);
            }
            let out = cmd
                .args(model.split(' '))
                .env("LABS_ALLOC_CONF", "preset:labs")
                .output()
                .unwrap();
            let v = labs_core::testing::one_json_object(out);
            let per_step: Vec<u64> = (v["driver_calls_per_step"].as_array().unwrap().iter())
                .map(|c| c.as_u64().unwrap())
                .collect();
            assert!(per_step[0] > 0, "{d} {model}: {v}");
            assert_eq!(v["steady_driver_calls_per_step"], 0, "{d} {model}: {v}");
        }
    }
}

#[test]
fn fixed_segments_make_no_driver_call_once_the_steps_repeat() {
    // PyTorch's default segments: the first step of a small GPT-2 takes segments from
    // the driver; after the warm-up steps the cache serves every request of a step that
    // repeats the one before.
    let gpt2 = "--model gpt2 --d-model 64 --nhead 2 --layers 2 --vocab 1000 --batch 4 --seq 64";
    let out = Command::new(binary())
        .args(["train", "--device", &device(), "--json", "--steps", "6"])
        .args(gpt2.split(' '))
        .env("LABS_ALLOC_CONF", "expandable_segments:False")
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    let per_step: Vec<u64> = (v["driver_calls_per_step"].as_array().unwrap().iter())
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(per_step.len(), 6, "{v}");
    assert!(per_step[0] > 0, "the first step took no segment: {v}");
    assert_eq!(v["steady_driver_calls_per_step"], 0, "{v}");
    // Three steps leave none after the warm-up to judge.
    let out = Command::new(binary())
        .args(["train", "--device", &device(), "--json"])
        .args(small(3))
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    assert!(v["steady_driver_calls_per_step"].is_null(), "{v}");
}

/// `--conf` configures the device's allocator, as LABS_ALLOC_CONF does, and wins over
/// it; the header and the JSON say which allocator ran; a bad one is refused in a line
/// that names the flag.
#[test]
fn conf_selects_the_allocator_and_the_output_says_which() {
    let out = Command::new(binary())
        .args([
            "train",
            "--device",
            &device(),
            "--json",
            "--conf",
            "preset:labs",
        ])
        .args(small(2))
        .env("LABS_ALLOC_CONF", "expandable_segments:False")
        .output()
        .unwrap();
    let v = labs_core::testing::one_json_object(out);
    assert_eq!(
        v["allocator"], "expandable_segments:True,recycle_idle_pages:True",
        "{v}"
    );
    let out = Command::new(binary())
        .args(["train", "--device", &device(), "--conf", "preset:labs"])
        .args(small(2))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("(allocator: preset labs)"), "{text}");
    let err = refused(train(&["--conf", "max_split_mb:128"]));
    assert!(
        err.contains("--conf: unknown option `max_split_mb`") && err.lines().count() == 1,
        "{err}"
    );
}

/// `--fused-classifier` (and `--classifier-chunk`) on a dry run of a GPT-2: the report
/// carries the chunk, the peak is lower, and the JSON of a run without it has no such
/// field.
#[test]
fn the_fused_classifier_is_a_flag_of_gpt2_runs() {
    let dry = |extra: &[&str]| -> Output {
        Command::new(binary())
            .args(["train", "--dry-run", "--capacity", "24GiB"])
            .args(TINY_GPT2)
            .args(["--batch", "4", "--vocab", "8192"])
            .args(extra)
            .output()
            .unwrap()
    };
    let json = |extra: &[&str]| {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        labs_core::testing::one_json_object(dry(&args))
    };
    let plain = json(&[]);
    assert!(plain["config"].get("fused_classifier").is_none(), "{plain}");
    let fused = json(&["--fused-classifier", "--classifier-chunk", "64"]);
    assert_eq!(fused["config"]["fused_classifier"], 64, "{fused}");
    let default_chunk = json(&["--fused-classifier"]);
    assert_eq!(
        default_chunk["config"]["fused_classifier"],
        labs_train::config::CLASSIFIER_CHUNK_ROWS
    );
    // 256 positions' float32 logits over 8192 classes are 8 MiB.
    let peak = |v: &serde_json::Value| v["peak_allocated"].as_u64().unwrap();
    assert!(
        peak(&plain) >= peak(&fused) + (256 - 64) * 8192 * 4,
        "{} vs {}",
        peak(&plain),
        peak(&fused)
    );
    let out = dry(&["--fused-classifier", "--classifier-chunk", "64"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("fused classifier (64 rows a chunk)"),
        "{text}"
    );

    let cases: &[(&[&str], &str)] = &[
        (
            &["--fused-classifier", "--classifier-chunk", "0"],
            "0 rows: give at least 1",
        ),
        (
            &["--fused-classifier", "--classifier-chunk", "many"],
            "not a number of rows",
        ),
        (&["--classifier-chunk", "64"], "--fused-classifier"),
    ];
    for (args, message) in cases {
        let e = refused(dry(args));
        assert!(e.contains(message), "{args:?}: {e}");
    }
    // The transformer has no classifier: one line that says so.
    let e = refused(train(&["--fused-classifier"]));
    assert!(
        e.contains("--fused-classifier applies to --model gpt2"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}

#[test]
fn the_classifier_table_matches_the_dry_runs_of_train() {
    let out = Command::new(binary())
        .args(["classifier", "--gemm-workspace", "32MiB"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // The rows' first two cells: the classifier and the peak allocated in MiB.
    let rows: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with("| as written") || l.starts_with("| fused"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].to_string(), cells[2].parse().unwrap())
        })
        .collect();
    assert_eq!(rows.len(), 6, "{text}");
    // Each row is `lab-10 train --dry-run` of GPT-2 small in bf16 with the same head.
    let train_peak = |extra: &[&str]| -> f64 {
        let out = Command::new(binary())
            .args(["--gemm-workspace", "32MiB", "train", "--dry-run", "--json"])
            .args(["--model", "gpt2", "--optimizer", "adamw", "--amp", "bf16"])
            .args(["--batch", "8", "--seq", "1024"])
            .args(extra)
            .output()
            .unwrap();
        let report = labs_core::testing::one_json_object(out);
        report["peak_allocated"].as_u64().unwrap() as f64 / (1 << 20) as f64
    };
    let close = |a: f64, b: f64| (a - b).abs() < 0.06;
    assert!(close(rows[0].1, train_peak(&[])), "{text}");
    assert!(
        close(
            rows[3].1,
            train_peak(&["--fused-classifier", "--classifier-chunk", "2048"])
        ),
        "{text}"
    );
    assert_eq!(rows[3].0, "fused, 2048 rows");
    // Smaller chunks keep less; every row at once keeps more than the head as written
    // (the log-probabilities, their gradient and the logits all at once).
    for pair in rows[1..].windows(2) {
        assert!(pair[0].1 < pair[1].1, "{text}");
    }
    assert!(rows[1].1 < rows[0].1 && rows[5].1 > rows[0].1, "{text}");
}

#[test]
fn a_step_captured_as_a_graph_reports_its_nodes_and_pool() {
    let run = |extra: &[&str]| {
        let out = Command::new(binary())
            .args(["train", "--device", &device(), "--json", "--steps", "3"])
            .args(["--dropout", "0", "--batch", "2", "--vocab", "1024"])
            .args(["--optimizer", "adamw"])
            .args(TINY_GPT2)
            .args(extra)
            .output()
            .unwrap();
        labs_core::testing::one_json_object(out)
    };
    let eager = run(&[]);
    let graphed = run(&["--graph"]);
    assert!(eager["graph"].is_null(), "{eager}");
    assert!(eager["config"].get("graph").is_none(), "{eager}");
    assert_eq!(graphed["config"]["graph"], true);
    let g = &graphed["graph"];
    assert!(g["nodes"].as_u64().unwrap() > 10, "{g}");
    assert!(g["pool_reserved"].as_u64().unwrap() > 0, "{g}");
    assert!(g["pool_allocated"].as_u64().unwrap() <= g["pool_reserved"].as_u64().unwrap());
    // The same training: the first loss is the eager step's, the others agree closely.
    let (a, b) = (
        eager["losses"].as_array().unwrap(),
        graphed["losses"].as_array().unwrap(),
    );
    assert_eq!(a[0], b[0]);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-4 * x.abs(), "{a:?} vs {b:?}");
    }
    let refused = refused(train(&["--graph", "--dropout", "0", "--profile"]));
    assert!(refused.contains("--graph and --profile"), "{refused}");
}
