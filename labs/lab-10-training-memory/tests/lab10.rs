//! Lab 10's exercises, graded on the device under test (the simulated GPU here, the GPU
//! with `LABS_DEVICE=cuda`): `cargo test -p lab-10 --features exercises` grades the
//! starter code, the default build the reference solutions.

use lab_10::exercises::{accumulate, optimizer_state_bytes};
use lab_10::train::model::Batch;
use lab_10::train::{run, OptimizerKind, TrainConfig, Trainer};
use labs_core::testing::test_device;
use labs_core::DType;

/// The tests measure one shared device: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn small() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 1,
        ffn: 64,
        dropout: 0.0,
        batch: 2,
        seq: 16,
        steps: 2,
        warmup: 0,
        ..TrainConfig::transformer()
    }
}

fn grads(t: &Trainer) -> Vec<f32> {
    let mut out = Vec::new();
    for p in t.model.module().parameters() {
        let g = p.grad().expect("every parameter has a gradient");
        out.extend(g.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
    }
    out
}

#[test]
fn exercise_1_accumulated_gradients_are_the_big_batchs() {
    let _s = serial();
    let device = test_device();
    let c = small();
    let batches: Vec<Batch> = (0..4)
        .map(|m| Batch::random(&c, 0, m, &device).unwrap())
        .collect();
    let mut t = Trainer::new(&c, &device).unwrap();
    let loss = accumulate(&mut t, &batches).unwrap().expect("a loss");
    let whole = TrainConfig {
        batch: 4 * c.batch,
        ..c.clone()
    };
    let mut big = Trainer::new(&whole, &device).unwrap();
    let want = big
        .micro_batch(&Batch::cat(&batches).unwrap(), 1)
        .unwrap()
        .unwrap();
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs(),
        "loss {loss} vs {want}"
    );
    for (i, (a, b)) in grads(&t).iter().zip(grads(&big)).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 + 1e-4 * b.abs(),
            "gradient {i}: {a} vs {b}"
        );
    }
}

#[test]
fn exercise_2_optimizer_state_is_what_the_allocator_counts() {
    let _s = serial();
    let device = test_device();
    for optimizer in [
        OptimizerKind::Adam,
        OptimizerKind::Adamw,
        OptimizerKind::Sgd,
    ] {
        let c = TrainConfig {
            optimizer,
            ..small()
        };
        let numels: Vec<usize> = Trainer::new(&c, &device)
            .unwrap()
            .model
            .module()
            .parameters()
            .iter()
            .map(|p| p.numel())
            .collect();
        let r = run(&c, &device).unwrap();
        assert_eq!(numels.iter().sum::<usize>(), r.params);
        assert_eq!(
            r.by_category["optimizer_state"],
            optimizer_state_bytes(optimizer, &numels, c.steps),
            "{optimizer:?}"
        );
        assert_eq!(optimizer_state_bytes(optimizer, &numels, 0), 0);
    }
}
