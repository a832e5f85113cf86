//! GPT-2 with its fused classifier (`Gpt2::fused_classifier`): the same loss and
//! gradients as the logits then `cross_entropy`, a peak lower by about the logits, and
//! a dry run that predicts its peaks exactly. Runs on the simulated GPU by default and
//! on the GPU with `LABS_DEVICE=cuda` (the dry-run test compares two fresh simulated
//! devices, the same there).

use labs_base::testing::{assert_close, serial};
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{Gpt2, Gpt2Config, Module, Rng};
use labs_nn::optim::{Adam, Optimizer};
use labs_tensor::tensor::{autocast, IGNORE_INDEX};
use labs_tensor::testing::host;
use labs_tensor::{DType, Tensor};

/// A GPT-2 whose logits dominate its activations: vocabulary 4096, width 32.
const VOCAB: usize = 4096;
const BATCH: usize = 2;
const SEQ: usize = 64;
const CHUNK: usize = 32;

fn gpt2(device: &Device) -> Gpt2 {
    let config = Gpt2Config {
        vocab: VOCAB,
        n_positions: SEQ,
        d_model: 32,
        n_layer: 2,
        n_head: 2,
        dropout: 0.0,
    };
    Gpt2::new(config, &mut Rng::seeded(7), device).unwrap()
}

/// Token ids and next tokens `[BATCH, SEQ]`, a few targets ignored.
fn batch(seed: u64, device: &Device) -> (Tensor, Tensor) {
    let mut rng = Rng::seeded(seed);
    let mut draw = |n| -> Vec<i64> {
        (0..n)
            .map(|_| (rng.next_u64() % VOCAB as u64) as i64)
            .collect()
    };
    let idx = draw(BATCH * SEQ);
    let mut targets = draw(BATCH * SEQ);
    for t in targets.iter_mut().step_by(9) {
        *t = IGNORE_INDEX;
    }
    (
        Tensor::from_slice(&idx, &[BATCH, SEQ], device).unwrap(),
        Tensor::from_slice(&targets, &[BATCH, SEQ], device).unwrap(),
    )
}

/// One forward and backward with the classifier `fused` (or not), under `amp`'s
/// autocast if any: the peak allocated over it (the gradients cleared and the peak
/// reset first), the loss, and every parameter's gradient.
fn step(
    model: &mut Gpt2,
    fused: Option<usize>,
    amp: Option<DType>,
    device: &Device,
) -> (u64, f64, Vec<Vec<f64>>) {
    model.fused_classifier = fused;
    for p in model.parameters() {
        p.clear_grad();
    }
    let (idx, targets) = batch(3, device);
    let allocator = device.allocator().unwrap();
    device.synchronize().unwrap();
    allocator.reset_peak_stats();
    let loss = {
        let _amp = amp.map(|d| autocast(d).unwrap());
        model.loss(&idx, &targets).unwrap()
    };
    loss.backward().unwrap();
    device.synchronize().unwrap();
    let peak = allocator.max_memory_allocated();
    let grads = model
        .parameters()
        .iter()
        .map(|p| host(&p.grad().unwrap()))
        .collect();
    (peak, host(&loss)[0], grads)
}

#[test]
fn the_fused_classifier_trains_the_same_with_a_peak_lower_by_the_logits() {
    let _serial = serial();
    let device = test_device();
    let mut model = gpt2(&device);
    let rows = BATCH * SEQ;
    let logits = (rows * VOCAB * 4) as u64;
    let chunk_logits = (CHUNK * VOCAB * 4) as u64;
    for (amp, rtol) in [(None, 1e-5), (Some(DType::BF16), 2e-2)] {
        let (plain_peak, plain_loss, plain_grads) = step(&mut model, None, amp, &device);
        let (fused_peak, fused_loss, fused_grads) = step(&mut model, Some(CHUNK), amp, &device);
        let what = format!("amp {amp:?}");
        assert_close(
            &format!("{what}: loss"),
            &[fused_loss],
            &[plain_loss],
            1e-4,
            0.0,
        );
        for (i, (f, p)) in fused_grads.iter().zip(&plain_grads).enumerate() {
            let largest = p.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert_close(&format!("{what}: grad {i}"), f, p, rtol, rtol * largest);
        }
        assert!(
            plain_peak >= fused_peak + logits - chunk_logits,
            "{what}: peak {fused_peak} fused vs {plain_peak} unfused; the logits are \
             {logits} bytes, a chunk's {chunk_logits}"
        );
    }
    // The default is the unfused path.
    assert_eq!(gpt2(&device).fused_classifier, None);
}

/// Peaks of two optimizer steps of the model with the fused classifier under bf16
/// autocast, on `device`.
fn train(device: &Device) -> (u64, u64) {
    let mut model = gpt2(device);
    model.fused_classifier = Some(CHUNK);
    let mut adam = Adam::new(model.parameters(), 1e-3);
    for s in 0..2 {
        let (idx, targets) = batch(s, device);
        let loss = {
            let _bf16 = autocast(DType::BF16).unwrap();
            model.loss(&idx, &targets).unwrap()
        };
        loss.backward().unwrap();
        adam.step().unwrap();
        adam.zero_grad(true).unwrap();
    }
    device.synchronize().unwrap();
    let a = device.allocator().unwrap();
    (a.max_memory_allocated(), a.max_memory_reserved())
}

#[test]
fn a_dry_run_predicts_the_fused_classifiers_peaks_exactly() {
    let sim = train(&Device::new_sim(1 << 30));
    let dry = train(&Device::new_dry(1 << 30));
    assert_eq!(sim, dry, "(max allocated, max reserved) on sim and dry");
    assert!(sim.0 > (CHUNK * VOCAB * 4) as u64, "{sim:?}");
}
