//! `fit` on the training driver of `labs-train`: the batch found on the dry-run device of a
//! capacity fits a simulated GPU of that capacity, one more does not, and the dry run's
//! peaks are the simulated run's, exactly.

use lab_05::fit_train;
use labs_core::testing::serial;
use labs_core::Device;
use labs_train::{AmpMode, CheckpointMode, TrainConfig};

const MIB: u64 = 1 << 20;

fn small_transformer() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 1,
        ffn: 64,
        seq: 8,
        steps: 2,
        ..TrainConfig::transformer()
    }
}

fn small_gpt2() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 1,
        ffn: 128,
        vocab: 128,
        seq: 16,
        steps: 2,
        ..TrainConfig::gpt2()
    }
}

/// Predicts on a dry device of `capacity`, checks on a simulated GPU of the same size.
fn predict_and_check(capacity: u64, base: &TrainConfig) -> usize {
    let sim = Device::new_sim(capacity);
    let p = fit_train::predict(&sim, capacity, base, 1 << 12).unwrap();
    assert!(p.search.batch > 1, "{:?}", p.search);
    assert_eq!(p.one_more_fits(), Some(false), "{:?}", p.search);
    assert!(p.report.oom.is_none());
    assert!(p.report.peak_reserved <= capacity);
    let c = fit_train::check(&sim, &p, base).unwrap();
    assert!(
        c.report.oom.is_none(),
        "the batch found fits: {:?}",
        c.report.oom
    );
    assert!(!c.one_more_fits, "one more does not");
    assert_eq!(
        (c.report.peak_allocated, c.report.peak_reserved),
        (p.report.peak_allocated, p.report.peak_reserved),
        "the dry run predicts the simulated GPU's peaks exactly"
    );
    assert_eq!(c.report.by_category, p.report.by_category);
    assert_eq!(c.reserved_error_percent(&p), 0.0);
    p.search.batch
}

#[test]
fn a_transformer_batch_found_on_the_dry_run_fits_and_one_more_does_not() {
    let _g = serial();
    predict_and_check(24 * MIB, &small_transformer());
}

#[test]
fn a_gpt2_batch_found_on_the_dry_run_fits_and_one_more_does_not() {
    let _g = serial();
    predict_and_check(24 * MIB, &small_gpt2());
}

#[test]
fn checkpointing_and_bf16_let_a_larger_batch_fit() {
    let _g = serial();
    let base = small_gpt2();
    let plain = predict_and_check(24 * MIB, &base);
    let lighter = predict_and_check(
        24 * MIB,
        &TrainConfig {
            checkpoint: CheckpointMode::Layers,
            amp: AmpMode::Bf16,
            ..base
        },
    );
    assert!(lighter > plain, "{lighter} > {plain}");
}

#[test]
fn a_model_that_does_not_fit_at_all_is_a_clear_error() {
    let _g = serial();
    let err = fit_train::predict(&Device::new_sim(MIB), MIB, &small_gpt2(), 16).unwrap_err();
    assert!(
        err.to_string().contains("not even a batch of 1 fits"),
        "{err}"
    );
}
