//! `lab-10 train --fused-classifier` through the training driver: a small GPT-2 trains
//! to the same losses with and without the fused classifier, at a lower peak, on the
//! device under test (the simulated GPU here, the GPU with `LABS_DEVICE=cuda`).

use labs_core::testing::{assert_close, serial, test_device};
use labs_train::{run, AmpMode, OptimizerKind, TrainConfig};

fn small_gpt2() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 2,
        ffn: 128,
        vocab: 2048,
        batch: 2,
        seq: 48,
        steps: 3,
        warmup: 0,
        optimizer: OptimizerKind::Adamw,
        lr: 1e-2,
        ..TrainConfig::gpt2()
    }
}

#[test]
fn a_small_gpt2_trains_the_same_with_the_fused_classifier() {
    let _serial = serial();
    let device = test_device();
    for (amp, rtol) in [(AmpMode::None, 2e-5), (AmpMode::Bf16, 1.5e-4)] {
        let plain = TrainConfig {
            amp,
            ..small_gpt2()
        };
        // 96 positions in chunks of 40: two full chunks and one of 16.
        let fused = TrainConfig {
            fused_classifier: Some(40),
            ..plain.clone()
        };
        fused.validate().unwrap();
        let (a, b) = (run(&plain, &device).unwrap(), run(&fused, &device).unwrap());
        assert!(a.oom.is_none() && b.oom.is_none());
        let (la, lb) = (a.losses.unwrap(), b.losses.unwrap());
        assert_eq!(la.len(), 3);
        // The steps change the loss by far more than the tolerance: a wrong gradient
        // would show.
        assert!((la[0] - la[2]).abs() > 5.0 * rtol * la[0], "{la:?}");
        assert_close(&format!("{amp:?} losses"), &lb, &la, rtol, 0.0);
        // 96 positions' float32 logits over 2048 classes, against a chunk's.
        let saved = ((96 - 40) * 2048 * 4) as u64;
        assert!(
            a.peak_allocated >= b.peak_allocated + saved,
            "{amp:?}: peak {} unfused, {} fused",
            a.peak_allocated,
            b.peak_allocated
        );
        assert_eq!(b.config.fused_classifier, Some(40));
    }
}
