//! Every op declared in the op layer, on every float dtype, against host arithmetic
//! written out here independently of the kernels' CPU twins. The same tests run on the
//! simulated GPU by default and on the GPU with `LABS_DEVICE=cuda`, where they also
//! compile every generated CUDA module.

use half::{bf16, f16};
use labs_core::kernels::{BinaryOp, UnaryOp};
use labs_core::testing::test_device;
use labs_core::{DType, Device, Element, Error, Tensor};

/// The reference for each unary op. The match is exhaustive on purpose: a new op does
/// not compile here until it has a reference.
fn unary_reference(op: UnaryOp, x: f32, alpha: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Step => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        UnaryOp::Scale => alpha * x,
    }
}

fn binary_reference(op: BinaryOp, a: f32, b: f32, alpha: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => {
            if a >= b {
                a
            } else {
                b
            }
        }
        BinaryOp::Minimum => {
            if a <= b {
                a
            } else {
                b
            }
        }
        BinaryOp::Axpy => alpha * a + b,
    }
}

/// A float element type under test, with the tolerance of its rounding: the GPU's
/// `expf`, `tanhf`, ... may differ from the host's in the last bits, which rounding to
/// a half type can turn into one unit of the half type's last place.
trait Float: Element + PartialEq {
    const RELATIVE: f32;
    fn from(v: f32) -> Self;
    fn to(self) -> f32;
}
impl Float for f32 {
    const RELATIVE: f32 = 4e-6;
    fn from(v: f32) -> Self {
        v
    }
    fn to(self) -> f32 {
        self
    }
}
impl Float for f16 {
    const RELATIVE: f32 = 1.0 / 1024.0;
    fn from(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to(self) -> f32 {
        self.to_f32()
    }
}
impl Float for bf16 {
    const RELATIVE: f32 = 1.0 / 128.0;
    fn from(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to(self) -> f32 {
        self.to_f32()
    }
}

fn assert_close<T: Float>(what: &str, i: usize, got: T, expected: f32) {
    let (got, expected) = (got.to(), T::from(expected).to());
    let ok = if expected.is_nan() {
        got.is_nan()
    } else if expected.is_infinite() {
        got == expected
    } else {
        (got - expected).abs() <= T::RELATIVE * expected.abs() + 1e-30
    };
    assert!(ok, "{what} at {i}: got {got}, expected {expected}");
}

/// Values that cover signs, zero, small and large magnitudes, and a size that is not
/// a multiple of the GPU's block.
fn inputs<T: Float>(n: usize, phase: f32) -> Vec<T> {
    (0..n)
        .map(|i| {
            let t = i as f32 / n as f32;
            let v = (t * 37.0 + phase).sin() * (8.0 * t - 4.0).exp2();
            T::from(if i % 97 == 0 { 0.0 } else { v })
        })
        .collect()
}

fn check_unary_ops<T: Float>(d: &Device) {
    let n = 4099;
    let x = inputs::<T>(n, 0.3);
    let tx = Tensor::from_slice(&x, &[n], d).unwrap();
    for &op in UnaryOp::ALL {
        let alpha = -1.75;
        let got = tx.unary_with(op, alpha).unwrap().to_vec::<T>().unwrap();
        let what = format!("{} on {}", op.name(), T::DTYPE);
        for i in 0..n {
            assert_close(&what, i, got[i], unary_reference(op, x[i].to(), alpha));
        }
    }
}

fn check_binary_ops<T: Float>(d: &Device) {
    let n = 4099;
    let (a, b) = (inputs::<T>(n, 0.3), inputs::<T>(n, 1.9));
    let ta = Tensor::from_slice(&a, &[n], d).unwrap();
    let tb = Tensor::from_slice(&b, &[n], d).unwrap();
    for &op in BinaryOp::ALL {
        let alpha = 0.625;
        let got = ta.binary_with(op, &tb, alpha).unwrap();
        let got = got.to_vec::<T>().unwrap();
        let what = format!("{} on {}", op.name(), T::DTYPE);
        for i in 0..n {
            let expected = binary_reference(op, a[i].to(), b[i].to(), alpha);
            assert_close(&what, i, got[i], expected);
        }
    }
}

#[test]
fn every_unary_op_matches_host_arithmetic_on_every_float_dtype() {
    let d = test_device();
    check_unary_ops::<f32>(&d);
    check_unary_ops::<f16>(&d);
    check_unary_ops::<bf16>(&d);
}

#[test]
fn every_binary_op_matches_host_arithmetic_on_every_float_dtype() {
    let d = test_device();
    check_binary_ops::<f32>(&d);
    check_binary_ops::<f16>(&d);
    check_binary_ops::<bf16>(&d);
}

#[test]
fn named_shorthands_run_their_ops() {
    let d = test_device();
    let a = Tensor::from_slice(&[1.0f32, -2.0, 3.0], &[3], &d).unwrap();
    let b = Tensor::from_slice(&[4.0f32, 5.0, -6.0], &[3], &d).unwrap();
    let v = |t: Tensor| t.to_vec::<f32>().unwrap();
    assert_eq!(v(a.sub(&b).unwrap()), [-3.0, -7.0, 9.0]);
    assert_eq!(v(a.div(&b).unwrap()), [0.25, -0.4, -0.5]);
    assert_eq!(v(a.maximum(&b).unwrap()), [4.0, 5.0, 3.0]);
    assert_eq!(v(a.neg().unwrap()), [-1.0, 2.0, -3.0]);
    assert_eq!(v(a.relu().unwrap()), [1.0, 0.0, 3.0]);
    assert_eq!(v(a.exp().unwrap())[0], 1f32.exp());
}

#[test]
fn ops_refuse_other_dtypes_and_mixed_dtypes() {
    let d = test_device();
    let i = Tensor::full(&[2], 3i32, &d).unwrap();
    assert!(matches!(i.neg(), Err(Error::DType { .. })));
    let x = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    let h = Tensor::zeros(&[2], DType::F16, &d).unwrap();
    assert!(matches!(x.add(&h), Err(Error::DType { .. })));
}

#[test]
fn elementwise_ops_make_strided_inputs_dense_first() {
    let d = test_device();
    // [[0, 1, 2], [3, 4, 5]] transposed is [[0, 3], [1, 4], [2, 5]].
    let m = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3], &d).unwrap();
    let t = m.transpose(0, 1).unwrap();
    let ones = Tensor::full(&[3, 2], 1.0f32, &d).unwrap();
    let sum = t.add(&ones).unwrap();
    assert_eq!(sum.shape(), [3, 2]);
    assert_eq!(sum.to_vec::<f32>().unwrap(), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // In place on a view would write through a copy: refused.
    assert!(t.axpy_(1.0, &ones).is_err());
}
