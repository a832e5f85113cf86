//! Lab 7's experiments and exercises on the device under test (the simulated GPU here,
//! the GPU with `LABS_DEVICE=cuda`). The tests measure the device's allocator and use
//! autocast's thread state, so they run one at a time.

use lab_07::exercises::{autocast_output_dtype, flushes_to_zero_in_f16, next_scale};
use lab_07::model::{Precision, Sizes, Trainer};
use lab_07::{categories, curves, full_vs_mixed, gemm, scaler};
use labs_core::alloc::{round_size, Category};
use labs_core::kernels::UnaryOp;
use labs_core::nn::Module;
use labs_core::optim::{GradScaler, Sgd};
use labs_core::tensor::autocast;
use labs_core::testing::{serial, test_device};
use labs_core::{DType, Device, Tensor};

fn sizes(device: &Device) -> Sizes {
    Sizes::for_device(device, true)
}

#[test]
fn autocast_halves_activations_keeps_master_state_float32_and_adds_the_cast_cache() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let rows = categories::measure(&d, s).unwrap();
    let at = |p: usize, c: Category| rows[p].1[c.index()];
    for p in 1..3 {
        for c in [
            Category::Parameter,
            Category::Gradient,
            Category::OptimizerState,
        ] {
            // Under float16 the scaler's scale and growth tracker (a 512-byte block
            // each) are optimizer state too.
            let scaler = if p == 2 && c == Category::OptimizerState {
                2 * round_size(4, 0)
            } else {
                0
            };
            assert_eq!(
                at(p, c),
                at(0, c) + scaler,
                "{c} is float32 in every precision"
            );
        }
        let (half, full) = (at(p, Category::Activation), at(0, Category::Activation));
        assert!(half < full, "{half} vs {full}");
        assert!(half * 10 >= full * 4, "about half: {half} vs {full}");
    }
    // The cache holds a half-precision copy of every parameter, each its own block.
    let t = Trainer::new(&d, s, Precision::Bf16, 1).unwrap();
    let cache: u64 = t
        .model
        .parameters()
        .iter()
        .map(|p| round_size(p.numel() as u64 * 2, 0))
        .sum();
    assert_eq!(at(0, Category::AutocastCache), 0);
    assert_eq!(at(1, Category::AutocastCache), cache);
    assert_eq!(at(2, Category::AutocastCache), cache);
}

#[test]
fn every_precision_trains_the_same_model_from_the_same_state() {
    let _g = serial();
    let d = test_device();
    let rows = full_vs_mixed::measure(&d, sizes(&d), 1).unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows[1..] {
        // Parameters, gradients and Adam's state, all float32: the same but for a few
        // small blocks (the loss, the scaler's flag).
        assert!(r.before.abs_diff(rows[0].before) <= 8 * 512, "{rows:?}");
        assert!(
            (r.loss - rows[0].loss).abs() < 0.02 * rows[0].loss,
            "{rows:?}"
        );
        assert!(r.peak > r.before && r.step_ms > 0.0);
    }
}

#[test]
fn small_float16_gradients_vanish_without_a_scaler_and_survive_with_one() {
    let _g = serial();
    let d = test_device();
    let rows = scaler::underflow(&d, sizes(&d), &[0, 16, 24]).unwrap();
    for r in &rows {
        assert!(r.nonzero_f32 > 0);
        assert!(r.zero_scaled <= r.zero_unscaled, "{r:?}");
    }
    assert!(
        rows[0].zero_unscaled * 100 < rows[0].nonzero_f32,
        "{:?}",
        rows[0]
    );
    assert!(
        rows[1].zero_unscaled * 4 > rows[1].nonzero_f32,
        "{:?}",
        rows[1]
    );
    assert!(
        rows[1].zero_scaled * 100 < rows[1].nonzero_f32,
        "{:?}",
        rows[1]
    );
    assert!(
        rows[2].zero_unscaled * 10 > rows[2].nonzero_f32 * 9,
        "{:?}",
        rows[2]
    );
}

#[test]
fn an_overflow_step_is_skipped_and_the_scale_halves() {
    let _g = serial();
    let d = test_device();
    let rows = scaler::overflow(&d, sizes(&d), 4, 1).unwrap();
    assert!(rows[0].stepped && rows[0].params_changed);
    assert!(!rows[1].stepped && !rows[1].params_changed, "{:?}", rows[1]);
    assert_eq!(rows[1].scale_after, rows[1].scale_before / 2.0);
    assert!(rows[2].stepped && rows[2].params_changed);
    assert_eq!(rows[3].scale_before, 32768.0);
}

#[test]
fn loss_curves_agree_within_the_stated_tolerance() {
    let _g = serial();
    let d = test_device();
    let s = curves::sizes(&d, true);
    let c = curves::measure(&d, s, 100).unwrap();
    let first = c[0].1[0];
    for (p, losses) in &c {
        assert!(losses.iter().all(|l| l.is_finite()), "{p:?}");
        assert!(curves::tail_mean(losses) < first as f64, "{p:?} learns");
    }
    for (gap, (p, _)) in curves::gaps(&c).iter().zip(&c) {
        assert!(*gap <= curves::TOLERANCE, "{p:?}: {gap}");
    }
}

#[test]
fn the_gemm_table_has_every_dtype() {
    let _g = serial();
    let d = test_device();
    let rows = gemm::measure(&d, 64, 1).unwrap();
    let names: Vec<_> = rows.iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        ["float32", "float32, TF32 allowed", "float16", "bfloat16"]
    );
    assert!(rows.iter().all(|r| r.tflops > 0.0 && r.ms > 0.0));
}

// Exercises.

#[test]
fn exercise_the_update_rule_matches_the_grad_scaler() {
    let d = test_device();
    let p = Tensor::from_slice(&[1.0f32], &[1], &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.0);
    let mut scaler = GradScaler::with_options(256.0, 2.0, 0.5, 3).unwrap();
    let (mut scale, mut tracker) = (256.0f32, 0u32);
    let pattern = [
        false, false, false, true, false, false, false, false, true, true,
    ];
    for found_inf in pattern {
        p.clear_grad();
        let factor = if found_inf { f32::INFINITY } else { 1.0 };
        let loss = p.mul_scalar(factor).unwrap().sum_all().unwrap();
        scaler.scale(&loss).unwrap().backward().unwrap();
        scaler.step(&mut opt).unwrap();
        scaler.update().unwrap();
        (scale, tracker) = next_scale(scale, tracker, found_inf, 2.0, 0.5, 3);
        assert_eq!(
            (scale, tracker),
            (
                scaler.get_scale().unwrap(),
                scaler.growth_tracker().unwrap()
            )
        );
    }
    assert_eq!(next_scale(f32::MAX, 0, false, 2.0, 0.5, 1), (f32::MAX, 0));
}

#[test]
fn exercise_the_output_dtypes_match_the_runtime() {
    let _g = serial();
    let d = test_device();
    for region in [DType::F16, DType::BF16] {
        for input in [DType::F32, region] {
            let x = Tensor::from_slice(&[0.5f32, 1.0, 1.5, 2.0], &[2, 2], &d)
                .unwrap()
                .to_dtype(input)
                .unwrap();
            let target = Tensor::from_slice(&[0i64, 1], &[2], &d).unwrap();
            let _r = autocast(region).unwrap();
            let runs: Vec<(&str, Tensor)> = vec![
                ("matmul", x.matmul(&x).unwrap()),
                ("linear", x.linear(&x, None).unwrap()),
                ("softmax", x.softmax(1).unwrap()),
                ("log_softmax", x.log_softmax(1).unwrap()),
                ("layer_norm", x.layer_norm(&[2], None, None, 1e-5).unwrap()),
                ("nll_loss", x.nll_loss(&target, -100).unwrap()),
                ("mse_loss", x.mse_loss(&x).unwrap()),
                ("sum", x.sum_all().unwrap()),
                ("exp", x.exp().unwrap()),
                ("log", x.unary(UnaryOp::Log).unwrap()),
                ("relu", x.relu().unwrap()),
                ("add", x.add(&x).unwrap()),
                ("gelu", x.gelu("none").unwrap()),
                ("mean", x.mean_all().unwrap()),
            ];
            for (op, out) in runs {
                assert_eq!(
                    autocast_output_dtype(op, input, region),
                    out.dtype(),
                    "{op} on {input} in {region}"
                );
            }
        }
    }
}

#[test]
fn exercise_flush_to_zero_matches_float16_rounding() {
    let mut x = 1e-4f32;
    while x > 1e-9 {
        for v in [x, -x, x.next_up(), x.next_down()] {
            let zero = half::f16::from_f32(v).to_f32() == 0.0;
            assert_eq!(flushes_to_zero_in_f16(v), zero, "{v:e}");
        }
        x *= 0.93;
    }
    for exact in [2f32.powi(-24), 2f32.powi(-25), 3.0 * 2f32.powi(-26)] {
        let zero = half::f16::from_f32(exact).to_f32() == 0.0;
        assert_eq!(flushes_to_zero_in_f16(exact), zero, "{exact:e}");
    }
}
