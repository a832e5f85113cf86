//! What the gradient tests share: one test at a time on the shared device, deterministic
//! inputs, and the check of backward's gradients against central finite differences.
//! Each test file that needs it declares `mod gradcheck;`.

#![allow(dead_code)]

use labs_core::tensor::no_grad;
use labs_core::testing::test_device;
use labs_core::{Device, Tensor};

/// Deterministic inputs in [lo, hi).
pub fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

pub fn tensor(data: &[f32], shape: &[usize], device: &Device) -> Tensor {
    Tensor::from_slice(data, shape, device).unwrap()
}

/// Checks the gradients backward gives `f`'s inputs against central differences of
/// `sum(f(inputs) * weights)` (random weights, so that no gradient is trivially 1).
/// Differences are taken in float64 on the host from float32 evaluations, with a step
/// large enough that float32 rounding stays below the tolerance.
pub fn check_gradients(
    name: &str,
    inputs: &[(Vec<f32>, Vec<usize>)],
    f: impl Fn(&[Tensor]) -> Tensor,
) {
    let device = test_device();
    let out_len = {
        let ts: Vec<Tensor> = inputs.iter().map(|(d, s)| tensor(d, s, &device)).collect();
        f(&ts).numel()
    };
    let weights = values(out_len, 99, -1.0, 1.0);
    let loss_of = |ts: &[Tensor]| -> Tensor {
        let y = f(ts);
        let w = tensor(&weights, y.shape(), &device);
        y.mul(&w).unwrap().sum_all().unwrap()
    };
    let leaves: Vec<Tensor> = (inputs.iter())
        .map(|(d, s)| tensor(d, s, &device).requires_grad_(true))
        .collect();
    loss_of(&leaves).backward().unwrap();
    let eps = 1e-2f32;
    for (k, (data, shape)) in inputs.iter().enumerate() {
        let analytic = leaves[k]
            .grad()
            .expect("a gradient")
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(
            leaves[k].grad().unwrap().shape(),
            &shape[..],
            "{name}: grad shape"
        );
        for i in 0..data.len() {
            let eval = |delta: f32| -> f64 {
                let _off = no_grad();
                let ts: Vec<Tensor> = (inputs.iter().enumerate())
                    .map(|(j, (d, s))| {
                        let mut d = d.clone();
                        if j == k {
                            d[i] += delta;
                        }
                        tensor(&d, s, &device)
                    })
                    .collect();
                loss_of(&ts).to_vec::<f32>().unwrap()[0] as f64
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps as f64);
            let a = analytic[i] as f64;
            let tol = 1e-2 + 1e-2 * numeric.abs();
            assert!(
                (a - numeric).abs() <= tol,
                "{name}: d/dinput{k}[{i}] is {a} by backward, {numeric} by finite differences"
            );
        }
    }
}
