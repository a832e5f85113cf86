//! Tensors and kernels on the device under test, checked against host arithmetic.

use half::{bf16, f16};
use labs_core::testing::test_device;
use labs_core::{DType, Device, Error, Tensor};

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 - n as f32 / 2.0) * scale)
        .collect()
}

#[test]
fn elementwise_kernels_match_host_arithmetic() {
    let d = test_device();
    let n = 100_003; // not a multiple of the block size
    let (a, b) = (ramp(n, 0.01), ramp(n, -0.003));
    let ta = Tensor::from_slice(&a, &[n], &d).unwrap();
    let tb = Tensor::from_slice(&b, &[n], &d).unwrap();

    let sum = ta.add(&tb).unwrap().to_vec::<f32>().unwrap();
    let prod = ta.mul(&tb).unwrap().to_vec::<f32>().unwrap();
    let scaled = ta.scale(2.5).unwrap().to_vec::<f32>().unwrap();
    let y = tb.deep_clone().unwrap();
    y.axpy_(-0.5, &ta).unwrap();
    let axpy = y.to_vec::<f32>().unwrap();
    for i in 0..n {
        assert_eq!(sum[i], a[i] + b[i], "add at {i}");
        assert_eq!(prod[i], a[i] * b[i], "mul at {i}");
        assert_eq!(scaled[i], 2.5 * a[i], "scale at {i}");
        assert!(
            (axpy[i] - (-0.5 * a[i] + b[i])).abs() <= 1e-6 * (1.0 + b[i].abs()),
            "axpy at {i}"
        );
    }
    // `b` itself was not touched by the in-place op on its clone.
    assert_eq!(tb.to_vec::<f32>().unwrap(), b);
}

#[test]
fn randn_is_standard_normal_and_the_same_on_every_device() {
    let d = test_device();
    let n = 1 << 20;
    let x = Tensor::randn(&[n], 1234, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!((var - 1.0).abs() < 0.01, "variance {var}");
    assert!(x.iter().all(|v| v.is_finite()));
    let host = Tensor::randn(&[n], 1234, &Device::cpu())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let worst = x
        .iter()
        .zip(&host)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "device and host generators differ by {worst}");
    let other_seed = Tensor::randn(&[16], 99, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(&other_seed[..], &x[..16]);
}

#[test]
fn full_and_zeros_work_for_every_dtype() {
    let d = test_device();
    assert_eq!(
        Tensor::full(&[5], 1.5f32, &d)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        [1.5; 5]
    );
    assert_eq!(
        Tensor::full(&[3], f16::from_f32(-2.0), &d)
            .unwrap()
            .to_vec::<f16>()
            .unwrap(),
        [f16::from_f32(-2.0); 3]
    );
    assert_eq!(
        Tensor::full(&[3], bf16::from_f32(0.25), &d)
            .unwrap()
            .to_vec::<bf16>()
            .unwrap(),
        [bf16::from_f32(0.25); 3]
    );
    assert_eq!(
        Tensor::full(&[4], -7i32, &d)
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        [-7; 4]
    );
    assert_eq!(
        Tensor::full(&[9], 200u8, &d)
            .unwrap()
            .to_vec::<u8>()
            .unwrap(),
        [200; 9]
    );
    // A 64-bit pattern whose halves differ: the GPU fills it as two strided words.
    let big = -(3i64 << 40) + 5;
    assert_eq!(
        Tensor::full(&[1000], big, &d)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![big; 1000]
    );
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ] {
        let z = Tensor::zeros(&[3, 5], dtype, &d).unwrap();
        assert_eq!(z.nbytes(), 15 * dtype.size());
    }
}

#[test]
fn to_returns_the_same_tensor_when_already_there_and_copies_otherwise() {
    let d = test_device();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d).unwrap();
    let same = x.to(&d).unwrap();
    assert!(same.shares_storage(&x));
    assert_eq!(same.ptr(), x.ptr());
    let host = x.cpu().unwrap();
    assert!(!host.shares_storage(&x));
    assert_eq!(host.device().id(), labs_core::DeviceId::Cpu);
    let back = host.to(&d).unwrap();
    assert!(!back.shares_storage(&x));
    assert_eq!(back.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
}

#[test]
fn mixing_devices_fails_like_pytorch() {
    let d = test_device();
    let a = Tensor::full(&[2], 1.0f32, &d).unwrap();
    let b = Tensor::full(&[2], 1.0f32, &Device::cpu()).unwrap();
    let err = a.add(&b).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Expected all tensors to be on the same device, but found at least two devices, \
             {} and cpu!",
            d.id()
        )
    );
    assert!(matches!(b.mul(&a), Err(Error::DeviceMismatch { .. })));
}

#[test]
fn bad_inputs_are_errors() {
    let d = test_device();
    assert!(matches!(
        Tensor::from_slice(&[1.0f32, 2.0], &[3], &d),
        Err(Error::InvalidArgument(_))
    ));
    let i = Tensor::full(&[2], 1i32, &d).unwrap();
    // Integer arithmetic runs (in int32); reductions are float-only still.
    assert_eq!(i.add(&i).unwrap().to_vec::<i32>().unwrap(), [2, 2]);
    assert!(matches!(i.sum_all(), Err(Error::DType { .. })));
    let a = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[3], DType::F32, &d).unwrap();
    assert!(matches!(a.add(&b), Err(Error::Shape { .. })));
    assert!(a.to_vec::<i32>().is_err());
    assert!(Tensor::empty(&[usize::MAX, 4], DType::F32, &d).is_err());
}
