//! The dry-run device: the simulated GPU's allocations without its work. The same
//! training step on `sim` and on `dry` makes the same requests in the same order, so
//! the allocator's peaks are equal, while the dry run skips every kernel and copy.
//! These tests compare two fresh simulated devices, so they run the same under
//! `LABS_DEVICE=cuda`.

use std::time::{Duration, Instant};

use labs_device::{Device, DeviceId};
use labs_nn::nn::{Mlp, Module, Rng};
use labs_nn::optim::{Adam, Optimizer};
use labs_tensor::Tensor;

const GIB: u64 = 1 << 30;

/// Peaks of `steps` training steps of an MLP with Adam, and the time they took.
fn train(device: &Device, batch: usize, width: usize, steps: usize) -> (u64, u64, Duration) {
    let mut rng = Rng::seeded(0);
    let model = Mlp::new(&[width, width, width, 16], &mut rng, device).unwrap();
    let mut opt = Adam::new(model.parameters(), 1e-3);
    let start = Instant::now();
    for step in 0..steps {
        let x = Tensor::randn(&[batch, width], step as u64, device).unwrap();
        let y = Tensor::randn(&[batch, 16], 100 + step as u64, device).unwrap();
        let loss = model.forward(&x).unwrap().mse_loss(&y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad(true).unwrap();
    }
    device.synchronize().unwrap();
    let elapsed = start.elapsed();
    let a = device.allocator().unwrap();
    (a.max_memory_allocated(), a.max_memory_reserved(), elapsed)
}

#[test]
fn a_dry_run_has_the_simulated_gpus_peaks_and_is_much_faster() {
    let sim = Device::new_sim(4 * GIB);
    let dry = Device::new_dry(4 * GIB);
    assert!(dry.is_dry() && !sim.is_dry());
    // Warm-up steps so that thread start-up is not timed, then a large batch.
    let (sim_alloc, sim_reserved, sim_time) = train(&sim, 2048, 512, 3);
    let (dry_alloc, dry_reserved, dry_time) = train(&dry, 2048, 512, 3);
    assert_eq!(sim_alloc, dry_alloc, "max_memory_allocated");
    assert_eq!(sim_reserved, dry_reserved, "max_memory_reserved");
    // Weights, gradients, Adam's two moments and the activations of a 2048 batch.
    assert!(sim_alloc > 2048 * 512 * 4 * 2, "{sim_alloc}");
    assert!(
        sim_time >= dry_time * 10,
        "sim {sim_time:?} vs dry {dry_time:?}: the dry run should be at least 10x faster"
    );
}

#[test]
fn reading_values_back_from_a_dry_run_is_a_clear_error() {
    let dry = Device::new_dry(GIB);
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dry).unwrap();
    let sum = t.add(&t).unwrap();
    for err in [
        sum.to_vec::<f32>().unwrap_err(),
        sum.sum_all().unwrap().item::<f32>().unwrap_err(),
    ] {
        assert!(err.to_string().contains("a dry run has no values"), "{err}");
    }
    assert!(dry.properties().unwrap().name.contains("allocations only"));
}

#[test]
fn a_dry_run_refuses_what_its_capacity_cannot_hold() {
    let dry = Device::new_dry(256 << 20);
    let big = Tensor::zeros(&[200 << 20], labs_tensor::DType::U8, &dry).unwrap();
    let err = Tensor::zeros(&[200 << 20], labs_tensor::DType::U8, &dry).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("out of memory on dry:"), "{err}");
    drop(big);
}

#[test]
fn dry_is_a_device_name() {
    assert_eq!("dry".parse::<DeviceId>().unwrap(), DeviceId::Dry(0));
    let d = labs_device::select_device(Some("dry:0")).unwrap().device;
    assert_eq!(d.id(), DeviceId::Dry(0));
    assert!(d.is_dry());
}

#[test]
fn index_ops_run_on_a_dry_run_without_reading_their_indices() {
    // Embedding and cross-entropy check their indices on the host on `sim`; a dry run
    // has no values to check and, like the GPU, skips the check.
    for device in [Device::new_sim(GIB), Device::new_dry(GIB)] {
        let logits = Tensor::randn(&[64, 10], 0, &device)
            .unwrap()
            .requires_grad_(true);
        let target: Vec<i64> = (0..64).map(|i| i % 10).collect();
        let target = Tensor::from_slice(&target, &[64], &device).unwrap();
        let loss = logits.cross_entropy(&target, -100).unwrap();
        loss.backward().unwrap();
        assert!(logits.grad().is_some(), "{device}");
    }
}
