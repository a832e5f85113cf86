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
        UnaryOp::Rsqrt => (1.0 / (x as f64).sqrt()) as f32,
        UnaryOp::Abs => x.abs(),
        UnaryOp::PowScalar => (x as f64).powf(alpha as f64) as f32,
        UnaryOp::Gelu => (0.5 * x as f64 * (1.0 + erf(x as f64 / 2f64.sqrt()))) as f32,
        UnaryOp::GeluTanh => {
            let x = x as f64;
            let k = (2.0 / std::f64::consts::PI).sqrt();
            (0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh())) as f32
        }
        UnaryOp::GeluGrad => {
            let x = x as f64;
            let pdf = (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
            (0.5 * (1.0 + erf(x / 2f64.sqrt())) + x * pdf) as f32
        }
        UnaryOp::GeluTanhGrad => {
            // The derivative of the tanh form, by central differences in f64.
            let f = |x: f64| {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044715 * x.powi(3))).tanh())
            };
            let (x, h) = (x as f64, 1e-6);
            ((f(x + h) - f(x - h)) / (2.0 * h)) as f32
        }
        UnaryOp::ClampMin => x.max(alpha),
        UnaryOp::ClampMax => x.min(alpha),
        UnaryOp::StepGe => (x >= alpha) as u8 as f32,
        UnaryOp::StepLe => (x <= alpha) as u8 as f32,
    }
}

/// Ops whose float32 result comes from `1 + erff(..)` or `1 + tanhf(..)`: for very
/// negative x the sum cancels, so the GPU's float32 result is close in absolute terms
/// only (PyTorch computes GELU the same way).
fn absolute_tolerance(op: UnaryOp) -> f32 {
    match op {
        UnaryOp::Gelu | UnaryOp::GeluTanh | UnaryOp::GeluGrad | UnaryOp::GeluTanhGrad => 1e-6,
        _ => 0.0,
    }
}

/// The error function by its Maclaurin series (|x| < 3) and its asymptotic expansion
/// beyond, in f64: a reference written apart from the library's.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        let mut term = a;
        let mut sum = a;
        for n in 1..120 {
            term *= -a * a / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) ~ e^{-x^2} / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6) + ...)
        let x2 = a * a;
        let mut series = 1.0;
        let mut term = 1.0;
        for k in 1..8 {
            term *= -((2 * k - 1) as f64) / (2.0 * x2);
            series += term;
        }
        1.0 - (-x2).exp() / (a * std::f64::consts::PI.sqrt()) * series
    };
    r.copysign(x)
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
        BinaryOp::Pow => (a as f64).powf(b as f64) as f32,
        BinaryOp::SquaredDifference => {
            let d = a as f64 - b as f64;
            (d * d) as f32
        }
        BinaryOp::ThresholdBackward => {
            if b > 0.0 || b.is_nan() {
                a
            } else {
                0.0
            }
        }
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

fn assert_element_close<T: Float>(what: &str, i: usize, got: T, expected: f32) {
    assert_near(what, i, got, expected, 0.0)
}

fn assert_near<T: Float>(what: &str, i: usize, got: T, expected: f32, absolute: f32) {
    let (got, expected) = (got.to(), T::from(expected).to());
    let ok = if expected.is_nan() {
        got.is_nan()
    } else if expected.is_infinite() {
        got == expected
    } else {
        (got - expected).abs() <= T::RELATIVE * expected.abs() + absolute + 1e-30
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
        let absolute = absolute_tolerance(op);
        for i in 0..n {
            let expected = unary_reference(op, x[i].to(), alpha);
            assert_near(&what, i, got[i], expected, absolute);
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
            assert_element_close(&what, i, got[i], expected);
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
fn mixed_dtypes_promote_and_in_place_ops_refuse_them() {
    let d = test_device();
    let i = Tensor::full(&[2], 3i32, &d).unwrap();
    assert_eq!(i.neg().unwrap().to_vec::<i32>().unwrap(), [-3, -3]);
    let x = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    let h = Tensor::full(&[2], f16::from_f32(1.5), &d).unwrap();
    let sum = x.add(&h).unwrap();
    assert_eq!(sum.dtype(), DType::F32);
    assert_eq!(sum.to_vec::<f32>().unwrap(), [1.5, 1.5]);
    assert!(matches!(x.axpy_(1.0, &h), Err(Error::DType { .. })));
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

#[test]
fn named_unary_methods_run_their_ops() {
    let d = test_device();
    let xs = [0.25f32, 1.0, 4.0];
    let x = Tensor::from_slice(&xs, &[3], &d).unwrap();
    type Method = fn(&Tensor) -> labs_core::Result<Tensor>;
    let named: [(Method, UnaryOp); 9] = [
        (Tensor::neg, UnaryOp::Neg),
        (Tensor::exp, UnaryOp::Exp),
        (Tensor::log, UnaryOp::Log),
        (Tensor::sqrt, UnaryOp::Sqrt),
        (Tensor::rsqrt, UnaryOp::Rsqrt),
        (Tensor::tanh, UnaryOp::Tanh),
        (Tensor::sigmoid, UnaryOp::Sigmoid),
        (Tensor::relu, UnaryOp::Relu),
        (Tensor::abs, UnaryOp::Abs),
    ];
    for (method, op) in named {
        let got = method(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, x.unary(op).unwrap().to_vec::<f32>().unwrap(), "{op:?}");
        for (g, &v) in got.iter().zip(&xs) {
            let want = unary_reference(op, v, 0.0);
            assert!(
                (g - want).abs() <= 1e-6 * want.abs(),
                "{op:?}({v}): {g} vs {want}"
            );
        }
    }
    let gelu = x.gelu("none").unwrap().to_vec::<f32>().unwrap();
    assert_eq!(
        gelu,
        x.unary(UnaryOp::Gelu).unwrap().to_vec::<f32>().unwrap()
    );
    // An integer tensor computes in float32, as in PyTorch (`torch.sqrt` of int32).
    let i = Tensor::from_slice(&[4i32, 9], &[2], &d).unwrap();
    assert_eq!(i.sqrt().unwrap().to_vec::<f32>().unwrap(), [2.0, 3.0]);
    assert_eq!(i.tanh().unwrap().dtype(), DType::F32);
    let e = x.gelu("fast").unwrap_err().to_string();
    assert!(e.contains("approximate") && !e.contains('\n'), "{e}");
}
