//! Experiment 6: tutorial 004's step and GPT-2 on the training driver of `labs-train`, on the
//! device under test (the simulated GPU here, the GPU with `LABS_DEVICE=cuda`), and
//! PyTorch's figures read from a file of reports.

use lab_07::driver;
use lab_07::pytorch::Source;
use labs_core::alloc::round_size;
use labs_core::testing::{serial, test_device};
use labs_train::AmpMode;

fn bytes(r: &labs_train::TrainReport, name: &str) -> u64 {
    r.by_category.get(name).copied().unwrap_or(0)
}

#[test]
fn autocast_halves_the_activations_keeps_the_master_state_and_adds_the_cache() {
    let _g = serial();
    let d = test_device();
    let c = driver::transformer_config(&d, true);
    let rows =
        driver::measure(&d, &c, &[AmpMode::None, AmpMode::Bf16, AmpMode::F16], None).unwrap();
    let [f32_run, bf16, f16] = [&rows[0].ours, &rows[1].ours, &rows[2].ours];
    for r in [f32_run, bf16, f16] {
        assert!(r.oom.is_none(), "{:?}", r.oom);
        assert_eq!(r.losses.as_ref().unwrap().len(), c.steps);
        assert!(r.losses.as_ref().unwrap().iter().all(|l| l.is_finite()));
    }
    // The float32 master weights and Adam's state are the same in every precision (the
    // gradients at the peak depend on where in backward it falls).
    for half in [bf16, f16] {
        assert_eq!(bytes(half, "parameter"), bytes(f32_run, "parameter"));
    }
    assert_eq!(
        bytes(bf16, "optimizer_state"),
        bytes(f32_run, "optimizer_state")
    );
    // Under float16 the scaler's scale and growth tracker (one element each, a 512-byte
    // block each) join the optimizer's state.
    assert_eq!(
        bytes(f16, "optimizer_state"),
        bytes(f32_run, "optimizer_state") + 2 * round_size(4, 0)
    );
    assert_eq!(bytes(f32_run, "autocast_cache"), 0);
    for half in [bf16, f16] {
        assert!(
            bytes(half, "autocast_cache") > 0,
            "half copies of the weights"
        );
        assert!(
            bytes(half, "activation") < bytes(f32_run, "activation"),
            "{} < {}",
            bytes(half, "activation"),
            bytes(f32_run, "activation")
        );
    }
    assert_eq!(f32_run.skipped_steps, None);
    assert_eq!(bf16.skipped_steps, None, "bfloat16 needs no scaler");
    assert!(f16.skipped_steps.unwrap() <= c.steps);
}

#[test]
fn pytorch_reports_from_a_file_stand_beside_ours() {
    let _g = serial();
    let d = test_device();
    let c = driver::gpt2_config(&d, true);
    let rows = driver::measure(&d, &c, &[AmpMode::None, AmpMode::Bf16], None).unwrap();
    // Stand-ins for PyTorch's reports: ours of the float32 run only, with the fields
    // ci/pytorch-train.py writes.
    let dir = std::env::temp_dir().join(format!("lab07-driver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pytorch.jsonl");
    std::fs::write(&path, format!("{}\n", rows[0].ours.to_json())).unwrap();
    let source = Source::open(&path).unwrap();
    let rows = driver::measure(&d, &c, &[AmpMode::None, AmpMode::Bf16], Some(&source)).unwrap();
    let theirs = rows[0]
        .pytorch
        .as_ref()
        .expect("the float32 report matches");
    assert_eq!(theirs.peak_allocated, rows[0].ours.peak_allocated);
    assert!(rows[1].pytorch.is_none(), "no bfloat16 report in the file");
    let text = driver::table("t".into(), &rows).to_string();
    assert!(text.contains("PyTorch, float32"), "{text}");
    assert!(!text.contains("PyTorch, autocast bfloat16"), "{text}");
    let err = Source::open(&dir.join("x.txt")).unwrap_err();
    assert!(err.to_string().contains("ci/pytorch-train.py"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
