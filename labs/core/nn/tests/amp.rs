//! Mixed precision: autocast's cast policies and cast cache, and the gradient scaler's
//! state machine and kernel. Runs on the simulated GPU by default and on the GPU with
//! `LABS_DEVICE=cuda`.

use labs_alloc::alloc::Category;
use labs_base::testing::serial;
use labs_device::kernels::UnaryOp;
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{Linear, Module, Rng};
use labs_nn::optim::{GradScaler, Optimizer, ScalerStage, Sgd};
use labs_tensor::tensor::{
    autocast, autocast_cache_len, autocast_disabled, autocast_dtype, cast_policy, CastPolicy,
};
use labs_tensor::{DType, Tensor};

fn cache_bytes(device: &Device) -> u64 {
    device
        .allocator()
        .unwrap()
        .memory_by_category()
        .into_iter()
        .find(|(c, _)| *c == Category::AutocastCache)
        .map(|(_, s)| s.current)
        .unwrap()
}

/// Bytes the allocator gives a request (PyTorch's rounding to 512).
fn round(bytes: u64) -> u64 {
    labs_alloc::alloc::round_size(bytes, 0)
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * scale)
        .collect()
}

#[test]
fn products_run_in_the_region_dtype_and_precision_sensitive_ops_in_float32() {
    let _s = serial();
    let d = test_device();
    let a = Tensor::from_slice(&ramp(12, 0.25), &[3, 4], &d).unwrap();
    let b = Tensor::from_slice(&ramp(8, 0.5), &[4, 2], &d).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let _region = autocast(dtype).unwrap();
        assert_eq!(autocast_dtype(), Some(dtype));
        let y = a.matmul(&b).unwrap();
        assert_eq!(y.dtype(), dtype, "matmul is on the lower-precision list");
        // The half-precision product's values are the float32 ones rounded.
        let exact = {
            let _off = autocast_disabled();
            a.matmul(&b).unwrap()
        };
        assert_eq!(exact.dtype(), DType::F32, "a disabled region runs float32");
        let (got, want) = (
            y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
            exact.to_vec::<f32>().unwrap(),
        );
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-2 * w.abs().max(1.0), "{g} vs {w}");
        }
        // softmax, log_softmax, sum, exp, log and layer_norm of a half input: float32.
        assert_eq!(y.softmax(1).unwrap().dtype(), DType::F32);
        assert_eq!(y.log_softmax(1).unwrap().dtype(), DType::F32);
        assert_eq!(y.sum_all().unwrap().dtype(), DType::F32);
        assert_eq!(y.exp().unwrap().dtype(), DType::F32);
        assert_eq!(
            y.abs().unwrap().unary(UnaryOp::Log).unwrap().dtype(),
            DType::F32
        );
        assert_eq!(
            y.layer_norm(&[2], None, None, 1e-5).unwrap().dtype(),
            DType::F32
        );
        // Ops on no list keep their input's dtype; mixed binary ops take the widest.
        assert_eq!(y.relu().unwrap().dtype(), dtype);
        assert_eq!(y.add(&exact).unwrap().dtype(), DType::F32);
        let cat = Tensor::cat(&[&y, &exact], 0).unwrap();
        assert_eq!(cat.dtype(), DType::F32, "cat promotes under autocast");
    }
    assert_eq!(autocast_dtype(), None, "the region ended with its guard");
    assert_eq!(a.matmul(&b).unwrap().dtype(), DType::F32);
}

#[test]
fn regions_nest_and_the_innermost_decides() {
    let _s = serial();
    {
        let _outer = autocast(DType::F16).unwrap();
        {
            let _inner = autocast(DType::BF16).unwrap();
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            {
                let _off = autocast_disabled();
                assert_eq!(autocast_dtype(), None);
            }
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        }
        assert_eq!(autocast_dtype(), Some(DType::F16));
    }
    assert_eq!(autocast_dtype(), None);
    let err = autocast(DType::I32)
        .err()
        .expect("int32 is no autocast dtype");
    assert!(err.to_string().contains("float16 or bfloat16"), "{err}");
}

#[test]
fn the_policy_table_follows_pytorch_lists() {
    assert_eq!(cast_policy("matmul"), CastPolicy::LowerPrecision);
    assert_eq!(cast_policy("linear"), CastPolicy::LowerPrecision);
    for op in ["layer_norm", "nll_loss", "mse_loss"] {
        assert_eq!(cast_policy(op), CastPolicy::Fp32, "{op}");
    }
    // PyTorch's fp32_set_opt_dtype list: float32 through the op's output dtype.
    for op in ["softmax", "log_softmax", "sum"] {
        assert_eq!(cast_policy(op), CastPolicy::Fp32SetOptDtype, "{op}");
    }
    for op in ["exp", "log", "rsqrt", "pow"] {
        assert_eq!(cast_policy(op), CastPolicy::Fp32, "{op}");
    }
    assert_eq!(cast_policy("cat"), CastPolicy::Promote);
    for op in ["relu", "add", "mul", "gelu", "mean"] {
        assert_eq!(cast_policy(op), CastPolicy::Unchanged, "{op}");
    }
}

#[test]
fn each_class_lists_the_ops_that_declare_it() {
    use labs_tensor::tensor::ops_with;
    assert_eq!(ops_with(CastPolicy::LowerPrecision), ["matmul", "linear"]);
    assert_eq!(
        ops_with(CastPolicy::Fp32),
        [
            "layer_norm",
            "nll_loss",
            "mse_loss",
            "exp",
            "log",
            "rsqrt",
            "pow_scalar",
            "pow"
        ]
    );
    assert_eq!(
        ops_with(CastPolicy::Fp32SetOptDtype),
        ["softmax", "log_softmax", "sum"]
    );
    assert_eq!(ops_with(CastPolicy::Promote), ["cat"]);
    let unchanged = ops_with(CastPolicy::Unchanged);
    assert!(unchanged.contains(&"add") && unchanged.contains(&"tanh"));
    for policy in [
        CastPolicy::LowerPrecision,
        CastPolicy::Fp32,
        CastPolicy::Fp32SetOptDtype,
        CastPolicy::Promote,
        CastPolicy::Unchanged,
    ] {
        for op in ops_with(policy) {
            assert_eq!(cast_policy(op), policy, "{op}");
        }
    }
    // A name no op declares changes nothing.
    assert_eq!(cast_policy("no_such_op"), CastPolicy::Unchanged);
}

#[test]
fn weights_are_cast_once_per_region_into_the_cache_category() {
    let _s = serial();
    let d = test_device();
    let mut rng = Rng::seeded(7);
    let layer = Linear::new(64, 32, true, &mut rng, &d).unwrap();
    let x = Tensor::from_slice(&ramp(8 * 64, 0.1), &[8, 64], &d).unwrap();
    let before = cache_bytes(&d);
    let graph_copy;
    {
        let _region = autocast(DType::BF16).unwrap();
        let y1 = layer.forward(&x).unwrap();
        let after_one = cache_bytes(&d);
        // The weight (64 x 32) and the bias (32), two bytes each, in blocks of 512.
        assert_eq!(after_one - before, round(64 * 32 * 2) + round(32 * 2));
        assert_eq!(autocast_cache_len(), 2);
        let y2 = layer.forward(&x).unwrap();
        assert_eq!(autocast_cache_len(), 2, "the second forward hits the cache");
        assert_eq!(cache_bytes(&d), after_one);
        assert_eq!(y1.dtype(), DType::BF16);
        assert_eq!(
            y1.to_vec::<half::bf16>().unwrap(),
            y2.to_vec::<half::bf16>().unwrap()
        );
        // An input is not a leaf that requires grad: cast, not cached.
        graph_copy = y1.sum_all().unwrap();
    }
    assert_eq!(
        autocast_cache_len(),
        0,
        "the outermost exit clears the cache"
    );
    // The graph saved the cast weight for backward: it lives (and is counted) until then.
    assert_eq!(cache_bytes(&d) - before, round(64 * 32 * 2));
    graph_copy.backward().unwrap();
    assert_eq!(cache_bytes(&d), before);
    let g = layer.weight.grad().unwrap();
    assert_eq!(
        g.dtype(),
        DType::F32,
        "the gradient of a float32 weight is float32"
    );
    assert_eq!(
        layer.bias.as_ref().unwrap().grad().unwrap().dtype(),
        DType::F32
    );
}

#[test]
fn autocast_gradients_match_float32_within_half_precision() {
    let _s = serial();
    let d = test_device();
    let w = Tensor::from_slice(&ramp(16 * 8, 0.05), &[8, 16], &d)
        .unwrap()
        .requires_grad_(true);
    let x = Tensor::from_slice(&ramp(4 * 16, 0.3), &[4, 16], &d).unwrap();
    let loss32 = x
        .linear(&w, None)
        .unwrap()
        .mul(&x.linear(&w, None).unwrap());
    loss32.unwrap().sum_all().unwrap().backward().unwrap();
    let want = w.grad().unwrap().to_vec::<f32>().unwrap();
    w.clear_grad();
    {
        let _region = autocast(DType::BF16).unwrap();
        let y = x.linear(&w, None).unwrap();
        let loss = y.mul(&y).unwrap().sum_all().unwrap();
        assert_eq!(loss.dtype(), DType::F32);
        // backward inside the region: derivatives keep the forward's dtypes.
        loss.backward().unwrap();
    }
    let got = w.grad().unwrap().to_vec::<f32>().unwrap();
    let norm = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    for (g, w) in got.iter().zip(&want) {
        // bf16 keeps 8 bits: each operand is within 2^-8 of its value.
        assert!((g - w).abs() <= 0.02 * norm, "{g} vs {w}");
    }
}

/// A parameter whose gradient after `backward` of `scaler.scale(loss)` is `factor *
/// scale` in every element (loss = factor * sum(p)).
fn scaled_step(scaler: &GradScaler, p: &Tensor, factor: f64) {
    let loss = p.mul_scalar(factor).unwrap().sum_all().unwrap();
    scaler.scale(&loss).unwrap().backward().unwrap();
}

#[test]
fn unscale_divides_by_the_scale_and_refuses_a_second_call() {
    let d = test_device();
    let p = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d)
        .unwrap()
        .requires_grad_(true);
    let opt = Sgd::new(vec![p.clone()], 0.1);
    let mut scaler = GradScaler::new();
    assert_eq!(scaler.get_scale().unwrap(), 65536.0);
    scaled_step(&scaler, &p, 0.375);
    assert_eq!(
        p.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![0.375 * 65536.0; 3]
    );
    scaler.unscale_(&opt).unwrap();
    assert_eq!(scaler.stage(&opt), ScalerStage::Unscaled);
    // A power-of-two scale divides exactly.
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.375; 3]);
    let err = scaler.unscale_(&opt).unwrap_err();
    assert!(err.to_string().contains("already been called"), "{err}");
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.375; 3]);
}

#[test]
fn a_good_step_runs_and_the_scale_grows_after_the_interval() {
    let d = test_device();
    let p = Tensor::from_slice(&[1.0f32, -1.0], &[2], &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.5);
    let mut scaler = GradScaler::with_options(1024.0, 2.0, 0.5, 3).unwrap();
    for step in 1..=7u32 {
        opt.zero_grad(true).unwrap();
        scaled_step(&scaler, &p, 1.0);
        assert!(scaler.step(&mut opt).unwrap(), "no overflow: the step runs");
        let err = scaler.step(&mut opt).unwrap_err();
        assert!(err.to_string().contains("already been called"), "{err}");
        scaler.update().unwrap();
        // Growth after every third good step: 1024 -> 2048 at step 3, 4096 at step 6.
        let want = 1024.0 * 2f32.powi((step / 3) as i32);
        assert_eq!(scaler.get_scale().unwrap(), want, "after step {step}");
        assert_eq!(scaler.growth_tracker().unwrap(), step % 3);
    }
    // Seven SGD steps of lr 0.5 on a true gradient of 1.
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0 - 3.5, -1.0 - 3.5]);
    let err = scaler.update().unwrap_err();
    assert!(err.to_string().contains("no inf checks"), "{err}");
}

#[test]
fn an_overflow_skips_the_step_and_backs_the_scale_off() {
    let d = test_device();
    let p = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.5);
    let mut scaler = GradScaler::with_options(65536.0, 2.0, 0.5, 2).unwrap();
    // A good step first, so that the tracker has something to reset.
    scaled_step(&scaler, &p, 1.0);
    assert!(scaler.step(&mut opt).unwrap());
    scaler.update().unwrap();
    assert_eq!(scaler.growth_tracker().unwrap(), 1);
    let before = p.to_vec::<f32>().unwrap();
    opt.zero_grad(true).unwrap();
    // 1e35 * 65536 exceeds float32's 3.4e38: the scaled gradient is infinite.
    scaled_step(&scaler, &p, 1e35);
    assert!(!scaler.step(&mut opt).unwrap(), "the step is skipped");
    assert_eq!(
        p.to_vec::<f32>().unwrap(),
        before,
        "the parameters are untouched"
    );
    scaler.update().unwrap();
    assert_eq!(scaler.get_scale().unwrap(), 32768.0);
    assert_eq!(scaler.growth_tracker().unwrap(), 0);
}

#[test]
fn the_check_sees_nan_and_infinity_and_refuses_float16_gradients() {
    let d = test_device();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let p = Tensor::from_slice(&[0.0f32; 4], &[4], &d)
            .unwrap()
            .requires_grad_(true);
        let g = Tensor::from_slice(&[2.0f32, bad, 4.0, 8.0], &[4], &d).unwrap();
        p.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let mut opt = Sgd::new(vec![p.clone()], 1.0);
        let mut scaler = GradScaler::with_options(2.0, 2.0, 0.5, 10).unwrap();
        assert!(!scaler.step(&mut opt).unwrap(), "{bad} found");
        let unscaled = p.grad().unwrap().to_vec::<f32>().unwrap();
        assert_eq!([unscaled[0], unscaled[2], unscaled[3]], [1.0, 2.0, 4.0]);
    }
    let p16 = Tensor::from_slice(&[half::f16::ONE; 2], &[2], &d)
        .unwrap()
        .requires_grad_(true);
    p16.sum_all().unwrap().backward().unwrap();
    let opt = Sgd::new(vec![p16], 1.0);
    let err = GradScaler::new().unscale_(&opt).unwrap_err();
    assert!(err.to_string().contains("float16 gradients"), "{err}");
    assert!(GradScaler::with_options(1.0, 1.0, 0.5, 1).is_err());
    assert!(GradScaler::with_options(1.0, 2.0, 1.5, 1).is_err());
}

/// One float16-style step through the scaler: the scaled loss's backward, `step`, then
/// `update`; returns the host reads (synchronisations) each part made and whether the
/// step ran.
fn counted_step(
    scaler: &mut GradScaler,
    opt: &mut Sgd,
    p: &Tensor,
    factor: f64,
) -> ([u64; 3], bool) {
    use labs_tensor::tensor::host_reads;
    opt.zero_grad(true).unwrap();
    let loss = p.mul_scalar(factor).unwrap().sum_all().unwrap();
    let r0 = host_reads();
    scaler.scale(&loss).unwrap().backward().unwrap();
    let r1 = host_reads();
    let stepped = scaler.step(opt).unwrap();
    let r2 = host_reads();
    scaler.update().unwrap();
    let r3 = host_reads();
    ([r1 - r0, r2 - r1, r3 - r2], stepped)
}

#[test]
fn a_scaler_step_reads_the_device_once_and_update_not_at_all() {
    let d = test_device();
    let p = Tensor::from_slice(&[1.0f32, -2.0], &[2], &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.0);
    let mut scaler = GradScaler::with_options(1024.0, 2.0, 0.5, 2).unwrap();
    for (factor, runs) in [(1.0, true), (1.0, true), (1e38, false), (1.0, true)] {
        let (reads, stepped) = counted_step(&mut scaler, &mut opt, &p, factor);
        assert_eq!(stepped, runs, "factor {factor}");
        assert_eq!(
            reads,
            [0, 1, 0],
            "scale and backward, step (found_inf.item()), update"
        );
    }
    // Reading the state is what waits: 1024 grew to 2048 after two good steps, then
    // backed off to 1024 at the overflow; one good step since.
    let before = labs_tensor::tensor::host_reads();
    assert_eq!(scaler.get_scale().unwrap(), 1024.0);
    assert_eq!(scaler.growth_tracker().unwrap(), 1);
    assert_eq!(labs_tensor::tensor::host_reads() - before, 2);
    // Host tensors are not counted: reading them waits for nothing.
    let before = labs_tensor::tensor::host_reads();
    Tensor::from_slice(&[1.0f32], &[1], &Device::cpu())
        .unwrap()
        .item::<f32>()
        .unwrap();
    assert_eq!(labs_tensor::tensor::host_reads(), before);
}

#[test]
fn the_dry_run_device_steps_the_scaler_without_reading_it() {
    let d = Device::new_dry(1 << 30);
    let p = Tensor::zeros(&[4], DType::F32, &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.1);
    let mut scaler = GradScaler::new();
    let (reads, stepped) = counted_step(&mut scaler, &mut opt, &p, 1.0);
    assert_eq!((reads, stepped), ([0, 0, 0], true), "dry runs every step");
    let err = scaler.get_scale().unwrap_err();
    assert!(err.to_string().contains("holds no values"), "{err}");
}

#[test]
fn the_scale_grows_after_2000_clean_steps_and_backs_off_by_half() {
    let d = test_device();
    let p = Tensor::from_slice(&[0.5f32], &[1], &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.0);
    let mut scaler = GradScaler::new();
    assert_eq!(scaler.get_scale().unwrap(), 65536.0, "before any step");
    for _ in 0..1999 {
        assert!(counted_step(&mut scaler, &mut opt, &p, 1.0).1);
    }
    assert_eq!(scaler.get_scale().unwrap(), 65536.0);
    assert_eq!(scaler.growth_tracker().unwrap(), 1999);
    assert!(counted_step(&mut scaler, &mut opt, &p, 1.0).1);
    assert_eq!(
        scaler.get_scale().unwrap(),
        131072.0,
        "the 2000th clean step"
    );
    assert_eq!(scaler.growth_tracker().unwrap(), 0);
    assert!(counted_step(&mut scaler, &mut opt, &p, 1.0).1);
    assert_eq!(scaler.growth_tracker().unwrap(), 1);
    // 1e34 * 131072 overflows float32: skipped, the scale halved, the tracker reset.
    assert!(!counted_step(&mut scaler, &mut opt, &p, 1e34).1);
    assert_eq!(scaler.get_scale().unwrap(), 65536.0);
    assert_eq!(scaler.growth_tracker().unwrap(), 0);
}

#[test]
fn growth_stops_short_of_infinity_and_two_optimizers_share_one_update() {
    let d = test_device();
    // 2^127 * 2 is infinite in float32: the scale stays, the tracker resets.
    let top = 2f32.powi(127);
    let p = Tensor::from_slice(&[0.0f32], &[1], &d)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Sgd::new(vec![p.clone()], 0.0);
    let mut scaler = GradScaler::with_options(top, 2.0, 0.5, 1).unwrap();
    assert!(counted_step(&mut scaler, &mut opt, &p, 1.0).1);
    assert_eq!(scaler.get_scale().unwrap(), top);
    assert_eq!(scaler.growth_tracker().unwrap(), 0);

    // Two optimizers, an overflow in the second only: the first steps, the second is
    // skipped, and the one update backs off (their flags are summed on the device).
    let a = Tensor::from_slice(&[1.0f32], &[1], &d)
        .unwrap()
        .requires_grad_(true);
    let b = Tensor::from_slice(&[1.0f32], &[1], &d)
        .unwrap()
        .requires_grad_(true);
    let (mut opt_a, mut opt_b) = (
        Sgd::new(vec![a.clone()], 1.0),
        Sgd::new(vec![b.clone()], 1.0),
    );
    let mut scaler = GradScaler::with_options(8.0, 2.0, 0.5, 1).unwrap();
    let loss = a
        .add(&b.mul_scalar(f64::INFINITY).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    scaler.scale(&loss).unwrap().backward().unwrap();
    let before = labs_tensor::tensor::host_reads();
    assert!(scaler.step(&mut opt_a).unwrap());
    assert!(!scaler.step(&mut opt_b).unwrap());
    scaler.update().unwrap();
    assert_eq!(
        labs_tensor::tensor::host_reads() - before,
        2,
        "one per step"
    );
    assert_eq!(
        a.to_vec::<f32>().unwrap(),
        vec![0.0],
        "lr 1, true gradient 1"
    );
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0]);
    assert_eq!(scaler.get_scale().unwrap(), 4.0);
}

#[test]
fn a_recomputation_in_backward_drops_its_casts_when_its_region_ends() {
    use labs_tensor::autograd::checkpoint;
    use std::sync::{Arc, Mutex};
    let _s = serial();
    let d = test_device();
    let mut rng = Rng::seeded(11);
    let layers: Vec<Arc<Linear>> = (0..2)
        .map(|_| Arc::new(Linear::new(64, 64, false, &mut rng, &d).unwrap()))
        .collect();
    let x = Tensor::from_slice(&ramp(8 * 64, 0.1), &[8, 64], &d)
        .unwrap()
        .requires_grad_(true);
    let loss = {
        let _region = autocast(DType::BF16).unwrap();
        let mut h = x.clone();
        for layer in &layers {
            let layer = layer.clone();
            // The region re-enters autocast for its recomputation, as the models'
            // checkpointed layers do (and torch.utils.checkpoint).
            h = checkpoint(
                move |xs| {
                    let _region = autocast(DType::BF16)?;
                    layer.forward(&xs[0])
                },
                &[h],
            )
            .unwrap();
        }
        h.to_dtype(DType::F32).unwrap().sum_all().unwrap()
    };
    // Each layer's weight gradient arrives once its recomputed region has run and
    // ended: by then its cast is gone from the cache, as when PyTorch's backward
    // recomputes (on a thread of its own, where the region is the outermost).
    let seen: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let before = cache_bytes(&d);
    for layer in &layers {
        let (seen, d) = (seen.clone(), d.clone());
        layer
            .weight
            .register_post_accumulate_grad_hook(move |_| {
                seen.lock()
                    .unwrap()
                    .push((autocast_cache_len(), cache_bytes(&d)));
                Ok(())
            })
            .unwrap();
    }
    loss.backward().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for &(len, bytes) in seen.iter() {
        assert_eq!(len, 0, "a recomputed region's casts outlive it");
        assert!(
            bytes <= before,
            "cast copies held in backward: {bytes} > {before}"
        );
    }
    // And a region open around backward keeps its own cache.
    let _outer = autocast(DType::BF16).unwrap();
    let w = &layers[0].weight;
    let _ = layers[0].forward(&x).unwrap();
    let cached = autocast_cache_len();
    assert!(cached >= 1, "the weight's cast");
    let y = x.mul(&x).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    assert_eq!(
        autocast_cache_len(),
        cached,
        "backward restores the region's cache"
    );
    assert!(w.grad().is_some());
}
