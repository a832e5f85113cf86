//! The lab's command line on the simulated GPU: every experiment's output, `share`'s
//! two children and `fit`'s prediction.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-05", env!("CARGO_BIN_EXE_lab-05"))
}

fn run(args: &[&str]) -> String {
    let out = Command::new(binary()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_default_command_prints_every_experiment() {
    let text = run(&["--device", "sim"]);
    for title in [
        "1. An out-of-memory error, explained, on sim:0",
        "1b. The same under a memory fraction of 0.25",
        "Suggestion: activations saved for backward",
        "2. Fragmentation:",
        "fragmentation. Setting expandable_segments:True",
        "3. A block freed on another stream",
        "4. Recovering from out-of-memory",
        "5. A batch-size finder",
        "Largest batch that fits:",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
}

#[test]
fn a_dry_run_of_the_experiments_gives_the_simulated_gpus_memory_figures() {
    // From experiment 4 on: the training experiments, whose tables are memory only.
    let tail = |device: &str| {
        let text = run(&["--device", device]);
        let start = text.find("4. Recovering").expect("experiment 4");
        text[start..].replace(&format!("{device}:0"), "DEVICE")
    };
    let (sim, dry) = (tail("sim"), tail("dry"));
    assert_eq!(sim, dry);
    assert!(dry.contains("Largest batch that fits:"), "{dry}");
}

#[test]
fn share_runs_two_children_that_both_finish() {
    let text = run(&["share", "--device", "sim"]);
    assert!(
        text.contains("2 of 2 children finished without error."),
        "{text}"
    );
    assert!(
        text.contains("child 0: its refusal names the fraction: true"),
        "{text}"
    );
    assert!(
        text.contains("child 1: its refusal names the fraction: true"),
        "{text}"
    );
}

#[test]
fn fit_predicts_on_the_dry_run_device() {
    let text = run(&[
        "fit",
        "--capacity",
        "256MiB",
        "--model",
        "mlp",
        "--width",
        "256",
        "--input",
        "256",
        "--depth",
        "2",
        "--device",
        "sim",
    ]);
    assert!(text.contains("found on the dry-run device"), "{text}");
    assert!(text.contains("dry run (predicted)"), "{text}");
    assert!(text.contains("does not fit"), "{text}");
}

#[test]
fn fit_searches_a_gpt2_training_step_on_the_dry_run_device() {
    let text = run(&[
        "fit",
        "--capacity",
        "96MiB",
        "--model",
        "gpt2",
        "--d-model",
        "48",
        "--layers",
        "1",
        "--seq",
        "16",
        "--amp",
        "bf16",
        "--checkpoint",
        "layers",
        "--device",
        "sim",
    ]);
    assert!(text.contains("found on the dry-run device"), "{text}");
    assert!(text.contains("GPT-2 d_model 48"), "{text}");
    assert!(text.contains("checkpoint layers, amp bf16"), "{text}");
    assert!(text.contains("does not fit"), "{text}");
}

#[test]
fn fit_rejects_an_unknown_model() {
    let out = Command::new(binary())
        .args(["fit", "--model", "resnet", "--device", "sim"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("unknown model; available: mlp, transformer, gpt2"));
}
