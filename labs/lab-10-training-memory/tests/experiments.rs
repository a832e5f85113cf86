//! `lab-10` without a subcommand: the chapter's experiments, run with `--quick` (tiny
//! models on the simulated GPU, the tutorial's model and a small GPT-2 on the GPU with
//! `LABS_DEVICE=cuda`). The headings the book's splitter matches, the pictures, PyTorch's
//! columns from a fixture of train-compare's lines, and `--check`'s verdicts.

use std::path::PathBuf;
use std::process::{Command, Output};

fn binary() -> PathBuf {
    labs_core::testing::lab_binary("lab-10", env!("CARGO_BIN_EXE_lab-10"))
}

/// The device under test: `LABS_DEVICE`, else the simulated GPU.
fn device() -> String {
    std::env::var("LABS_DEVICE")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| "sim".into())
}

/// The fixture: train-compare's lines for the tiny tutorial model (PyTorch's side of
/// `tutorial-none`, an out-of-memory `tutorial-accum4`, a `tutorial-offload` of another
/// batch). Built into the test, which may run where the checkout is not.
fn fixture() -> Scratch {
    let dir = scratch("fixture");
    std::fs::write(
        dir.join("pytorch-tiny.jsonl"),
        include_str!("data/pytorch-tiny.jsonl"),
    )
    .unwrap();
    dir
}

/// A fresh folder of its own (tests run at once share the process), removed when
/// dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("lab10-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn experiments(device: &str, extra: &[&str]) -> Output {
    Command::new(binary())
        .args(["--quick", "--device", device])
        .args(extra)
        .output()
        .unwrap()
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The line of `text` after `heading` whose first cell is `label`.
fn row<'a>(text: &'a str, heading: &str, label: &str) -> &'a str {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading}:\n{text}"));
    text[start..]
        .lines()
        .find(|l| l.starts_with(&format!("| {label} ")))
        .unwrap_or_else(|| panic!("no row {label} under {heading}:\n{text}"))
}

const HEADINGS: &[&str] = &[
    "1. Tutorial 004's experiment",
    "2. Techniques on the tutorial's model",
    "3. GPT-2 small",
    "4. Where the memory goes",
    "5. Predicted before running",
];

#[test]
fn the_sections_come_in_order_with_pictures_and_no_pytorch_columns() {
    let dir = scratch("pictures");
    let pictures = dir.join("pictures");
    let out = experiments(&device(), &["--pictures", pictures.to_str().unwrap()]);
    let text = stdout_of(&out);
    let mut at = 0;
    for h in HEADINGS {
        let found = text.lines().position(|l| l.starts_with(h));
        let found = found.unwrap_or_else(|| panic!("no line starts with {h}:\n{text}"));
        assert!(found >= at, "{h} out of order:\n{text}");
        at = found;
    }
    assert!(
        text.contains("2,520.47 MB") && text.contains("903.73 MB"),
        "{text}"
    );
    assert!(text.contains("not batch_first"), "{text}");
    assert!(
        !text.contains("alloc MiB PyTorch") && !text.contains("saving PyTorch"),
        "PyTorch columns without --pytorch:\n{text}"
    );
    for technique in ["none", "accum4", "ckpt-layers", "offload", "bf16"] {
        let path = pictures.join(format!("tutorial-{technique}.svg"));
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert!(
            svg.starts_with("<svg") && svg.contains("parameters (max"),
            "{path:?}"
        );
        assert!(
            text.contains(&format!("wrote {}", path.display())),
            "{text}"
        );
    }
    // Section 4's split adds up to the peak in section 2 (both from the same run).
    let split: Vec<&str> = row(&text, HEADINGS[3], "none").split('|').collect();
    let total = split[split.len() - 2].trim();
    let alloc = row(&text, HEADINGS[1], "none")
        .split('|')
        .nth(2)
        .unwrap()
        .trim();
    assert_eq!(total, alloc, "{text}");
    if device() == "sim" {
        assert!(text.contains("times mean nothing"), "{text}");
        assert!(text.contains("a tiny GPT-2"), "{text}");
        // The dry run predicts the simulated GPU's peaks exactly.
        let predicted = &text[text.find(HEADINGS[4]).unwrap()..];
        let rows = predicted
            .lines()
            .filter(|l| l.starts_with("| tutorial-") || l.starts_with("| gpt2-"));
        let mut n = 0;
        for r in rows {
            assert_eq!(r.matches("+0.0%").count(), 2, "{r}");
            n += 1;
        }
        assert_eq!(n, 17, "{predicted}");
    }
    std::fs::remove_dir_all(&*dir).unwrap();
}

#[test]
fn pytorch_s_columns_come_from_train_compare_s_lines_and_check_lists_the_misses() {
    let out = experiments(
        "sim",
        &[
            "--pytorch",
            fixture().join("pytorch-tiny.jsonl").to_str().unwrap(),
            "--check",
        ],
    );
    assert!(!out.status.success(), "--check passed against the fixture");
    let text = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("targets were not all met"), "{stderr}");
    assert!(
        text.contains("alloc MiB PyTorch") && text.contains("saving PyTorch"),
        "{text}"
    );
    let none = row(&text, HEADINGS[1], "none");
    assert!(none.contains("3.0") && none.contains("5.0"), "{none}");
    assert!(row(&text, HEADINGS[1], "accumulation").contains("OOM"));
    assert!(row(&text, HEADINGS[1], "offload").contains("other config"));
    assert!(row(&text, HEADINGS[1], "checkpoint layers").contains("absent"));
    assert!(
        text.contains("tutorial-offload, PyTorch: other config: PyTorch's run had batch 64"),
        "{text}"
    );
    // Ours is far below the fixture's 3 MiB and far slower than its 0.001 ms.
    assert!(text.contains("tutorial-none: peak allocated"), "{text}");
    assert!(text.contains("tutorial-none: step"), "{text}");
    // PyTorch running out of memory is not a miss of ours.
    assert!(!text.contains("- tutorial-accum4: "), "{text}");
    assert!(
        text.contains("- tutorial-accum4, PyTorch: OOM: CUDA out of memory"),
        "{text}"
    );
    assert!(!text.contains("targets: all met"));
}

#[test]
fn check_is_met_against_figures_equal_to_ours_and_slower() {
    let dir = scratch("check");
    let ours = dir.join("ours.jsonl");
    let first = experiments("sim", &["--out", ours.to_str().unwrap()]);
    stdout_of(&first);
    // Our own runs, as if PyTorch's: the same peaks, each step 100 times as long.
    let mut lines = String::new();
    let mut sides = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(&ours).unwrap().lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        *sides
            .entry(v["side"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
        if v["side"] != "ours" || v["config"].as_str().unwrap().starts_with("tutorial-shape") {
            continue;
        }
        v["side"] = "pytorch".into();
        let ms = v["json"]["step_ms"].as_f64().unwrap();
        v["json"]["step_ms"] = (100.0 * ms).into();
        lines.push_str(&format!("{v}\n"));
    }
    // 17 configurations and the tutorial's 2 shapes, each run and predicted.
    assert_eq!(sides["ours"], 19, "{sides:?}");
    assert_eq!(sides["ours-dry"], 19, "{sides:?}");
    let theirs = dir.join("theirs.jsonl");
    std::fs::write(&theirs, lines).unwrap();
    let out = experiments("sim", &["--pytorch", theirs.to_str().unwrap(), "--check"]);
    let text = stdout_of(&out);
    assert!(text.contains("targets: all met"), "{text}");
    assert!(row(&text, HEADINGS[1], "none").contains("1.00"), "{text}");
    std::fs::remove_dir_all(&*dir).unwrap();
}

#[test]
fn bad_pytorch_input_is_refused_before_anything_runs() {
    let refused = |extra: &[&str], message: &str| {
        let out = experiments("sim", extra);
        assert!(!out.status.success(), "{extra:?} succeeded");
        let e = String::from_utf8(out.stderr).unwrap();
        assert!(e.contains(message), "{extra:?}: {e}");
        assert!(out.stdout.is_empty(), "{extra:?} ran before refusing");
    };
    refused(&["--check"], "--check compares with PyTorch");
    refused(
        &["--pytorch", "figures.csv"],
        "expected ci/pytorch-train.py",
    );
    refused(&["--pytorch", "no-such-script.py"], "no such file");
    refused(&["--pytorch", "no-such.jsonl"], "no-such.jsonl");
    let bad_dir = scratch("bad");
    let bad = bad_dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"config\": \"tutorial-none\"}\n").unwrap();
    refused(&["--pytorch", bad.to_str().unwrap()], "\"side\"");
    refused(&["--dry-run"], "--dry-run applies to train");
}

#[test]
fn configs_lists_what_train_compare_runs() {
    let out = Command::new(binary()).arg("configs").output().unwrap();
    let text = stdout_of(&out);
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(names.len(), 17, "{text}");
    assert!(
        text.contains("tutorial-none\t--model transformer --d-model 256 --batch 64 --seq 100\n"),
        "{text}"
    );
    assert!(
        text.contains("tutorial-accum4\t--model transformer --d-model 256 --batch 16 --accum 4"),
        "{text}"
    );
    assert!(
        text.contains("gpt2-none\t--model gpt2 --optimizer adamw --batch 8 --seq 1024\n"),
        "{text}"
    );
}

#[test]
fn a_configuration_the_dry_run_says_will_not_fit_is_not_run() {
    // 1 MiB: less than one 2 MiB segment, which every run needs.
    let out = experiments("sim", &["--capacity", "1MiB"]);
    let text = stdout_of(&out);
    for (heading, label) in [
        (HEADINGS[1], "none"),
        (HEADINGS[2], "f32"),
        (HEADINGS[3], "none"),
    ] {
        let r = row(&text, heading, label);
        assert!(
            r.contains("does not fit (predicted 2.0 MiB reserved)"),
            "{r}"
        );
    }
    let r = row(&text, HEADINGS[4], "tutorial-none");
    assert!(r.contains("does not fit") && r.contains("2.0"), "{r}");
    assert!(!text.contains("Ours, batch first"), "{text}");
}
