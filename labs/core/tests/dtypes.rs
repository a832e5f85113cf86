//! Every op with an integer kernel on every integer dtype, every cast between two
//! dtypes, and the dense kernels' vector path against their scalar tail (operands at
//! every alignment), against host arithmetic written out here. On the GPU
//! (`LABS_DEVICE=cuda`) this compiles and runs every integer and cast kernel.

use half::{bf16, f16};
use labs_core::kernels::{BinaryOp, UnaryOp};
use labs_core::testing::test_device;
use labs_core::{DType, Device, Element, Tensor};

/// Host references in i64, narrowed like the element type (wrapping).
fn int_unary(op: UnaryOp, x: i64, alpha: f32) -> Option<i64> {
    Some(match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Relu => x.max(0),
        UnaryOp::ClampMin => x.max(alpha as i64),
        UnaryOp::ClampMax => x.min(alpha as i64),
        _ => return None,
    })
}

fn int_binary(op: BinaryOp, a: i64, b: i64) -> Option<i64> {
    Some(match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        BinaryOp::Pow => {
            if b < 0 {
                match a {
                    1 => 1,
                    -1 => 1 - 2 * (b & 1),
                    _ => 0,
                }
            } else {
                // Repeated multiplication, modulo 2^64 (b may be large: cycle by squaring
                // would be the kernel's way; this counts bits independently).
                let mut r = 1i64;
                let mut p = a;
                for bit in 0..63 {
                    if (b >> bit) & 1 == 1 {
                        r = r.wrapping_mul(p);
                    }
                    p = p.wrapping_mul(p);
                }
                r
            }
        }
        _ => return None,
    })
}

trait Int: Element + PartialEq {
    fn from_i64(v: i64) -> Self;
    fn to_i64(self) -> i64;
}
impl Int for i32 {
    fn from_i64(v: i64) -> Self {
        v as i32
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl Int for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
    fn to_i64(self) -> i64 {
        self
    }
}
impl Int for u8 {
    fn from_i64(v: i64) -> Self {
        v as u8
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
}

/// Values spanning the type, extremes included, in a count that is no multiple of a
/// vector.
fn int_values<T: Int>(n: usize, seed: i64) -> Vec<T> {
    let extremes = [
        i64::MIN,
        i64::MAX,
        i32::MIN as i64,
        i32::MAX as i64,
        0,
        -1,
        255,
    ];
    (0..n as i64)
        .map(|i| {
            let v = if i < extremes.len() as i64 {
                extremes[i as usize]
            } else {
                (i * 7919 + seed).wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64) >> (i % 50)
            };
            T::from_i64(v)
        })
        .collect()
}

fn check_int_ops<T: Int>(d: &Device) {
    let n = 1031;
    let (a, b) = (int_values::<T>(n, 1), int_values::<T>(n, 2));
    let ta = Tensor::from_slice(&a, &[n], d).unwrap();
    let tb = Tensor::from_slice(&b, &[n], d).unwrap();
    let alpha = -3.0;
    for &op in UnaryOp::ALL.iter().filter(|op| op.int_cuda().is_some()) {
        let got = ta.unary_with(op, alpha).unwrap();
        assert_eq!(
            got.dtype(),
            T::DTYPE,
            "{} keeps the integer dtype",
            op.name()
        );
        let got = got.to_vec::<T>().unwrap();
        for i in 0..n {
            let want = T::from_i64(int_unary(op, a[i].to_i64(), alpha).expect("a reference"));
            assert!(got[i] == want, "{} on {} at {i}", op.name(), T::DTYPE);
        }
    }
    for &op in BinaryOp::ALL.iter().filter(|op| op.int_cuda().is_some()) {
        let got = ta.binary(op, &tb).unwrap().to_vec::<T>().unwrap();
        for i in 0..n {
            let want = int_binary(op, a[i].to_i64(), b[i].to_i64()).expect("a reference");
            assert!(
                got[i] == T::from_i64(want),
                "{} on {} at {i}",
                op.name(),
                T::DTYPE
            );
        }
    }
}

#[test]
fn every_integer_op_matches_wrapping_host_arithmetic_on_every_integer_dtype() {
    let d = test_device();
    check_int_ops::<i32>(&d);
    check_int_ops::<i64>(&d);
    check_int_ops::<u8>(&d);
}

/// A value of any dtype on the host, for the cast references.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Host {
    F(f32),
    I(i64),
}

fn host_values(dtype: DType, src: &[f64]) -> (Tensor, Vec<Host>) {
    let d = test_device();
    let n = src.len();
    macro_rules! make {
        ($t:ty, $conv:expr, $back:expr) => {{
            let v: Vec<$t> = src.iter().map(|&x| $conv(x)).collect();
            let host = v.iter().map(|&x| $back(x)).collect();
            (Tensor::from_slice(&v, &[n], &d).unwrap(), host)
        }};
    }
    match dtype {
        DType::F32 => make!(f32, |x: f64| x as f32, Host::F),
        DType::F16 => make!(f16, f16::from_f64, |x: f16| Host::F(x.to_f32())),
        DType::BF16 => make!(bf16, bf16::from_f64, |x: bf16| Host::F(x.to_f32())),
        DType::I32 => make!(i32, |x: f64| x as i32, |x: i32| Host::I(x as i64)),
        DType::I64 => make!(i64, |x: f64| x as i64, Host::I),
        DType::U8 => make!(u8, |x: f64| (x as i64) as u8, |x: u8| Host::I(x as i64)),
    }
}

/// C's conversions: truncation toward zero (uint8 through int), nearest for integer to
/// float, low bits between integers; float types round to nearest even.
fn cast_reference(v: Host, to: DType) -> Host {
    let int = |x: i64| match to {
        DType::I32 => x as i32 as i64,
        DType::U8 => x as u8 as i64,
        _ => x,
    };
    let float = |x: f32| match to {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    };
    let is_float = matches!(to, DType::F32 | DType::F16 | DType::BF16);
    match (v, is_float) {
        (Host::F(x), true) => Host::F(float(x)),
        (Host::I(x), true) => Host::F(float(x as f32)),
        (Host::F(x), false) => Host::I(match to {
            DType::I32 => x as i32 as i64,
            DType::I64 => x as i64,
            _ => (x as i32) as u8 as i64,
        }),
        (Host::I(x), false) => Host::I(int(x)),
    }
}

fn read(t: &Tensor) -> Vec<Host> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(Host::F)
            .collect(),
        DType::F16 => (t.to_vec::<f16>().unwrap().into_iter())
            .map(|x| Host::F(x.to_f32()))
            .collect(),
        DType::BF16 => (t.to_vec::<bf16>().unwrap().into_iter())
            .map(|x| Host::F(x.to_f32()))
            .collect(),
        DType::I32 => (t.to_vec::<i32>().unwrap().into_iter())
            .map(|x| Host::I(x as i64))
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(Host::I)
            .collect(),
        DType::U8 => (t.to_vec::<u8>().unwrap().into_iter())
            .map(|x| Host::I(x as i64))
            .collect(),
    }
}

#[test]
fn every_cast_between_two_dtypes_converts_as_c_does() {
    use DType::*;
    let all = [F32, F16, BF16, I32, I64, U8];
    let src = [
        0.0, 1.0, -1.0, 2.5, -2.75, 100.0, 255.0, 300.0, -129.5, 65504.0, 1e-3, 12345.678,
    ];
    for from in all {
        let (t, host) = host_values(from, &src);
        for to in all {
            let got = read(&t.to_dtype(to).unwrap());
            let want: Vec<Host> = host.iter().map(|&v| cast_reference(v, to)).collect();
            assert_eq!(got, want, "cast from {from} to {to}");
        }
    }
}

#[test]
fn dense_kernels_agree_at_every_alignment_and_length() {
    // Views that start 0..16 bytes into their storage and lengths around a vector's
    // width: the vectorised path, the scalar fallback and the tail all run.
    let d = test_device();
    let base: Vec<f32> = (0..80).map(|i| i as f32 * 0.5 - 7.0).collect();
    let other: Vec<f32> = (0..80).map(|i| 3.0 - i as f32 * 0.25).collect();
    let ta = Tensor::from_slice(&base, &[80], &d).unwrap();
    let tb = Tensor::from_slice(&other, &[80], &d).unwrap();
    let bytes: Vec<u8> = (0..80).map(|i| (i * 37 % 256) as u8).collect();
    let tc = Tensor::from_slice(&bytes, &[80], &d).unwrap();
    for offset in 0..5 {
        for len in [1, 3, 4, 5, 15, 16, 17, 33, 64] {
            let a = ta.narrow(0, offset, len).unwrap();
            let b = tb.narrow(0, 4 - offset.min(4), len).unwrap();
            let got = a.add(&b).unwrap().to_vec::<f32>().unwrap();
            let neg = a.neg().unwrap().to_vec::<f32>().unwrap();
            for i in 0..len {
                assert_eq!(got[i], base[offset + i] + other[4 - offset.min(4) + i]);
                assert_eq!(neg[i], -base[offset + i]);
            }
            let c = tc.narrow(0, offset * 3, len).unwrap();
            let doubled = c.add(&c).unwrap().to_vec::<u8>().unwrap();
            for i in 0..len {
                assert_eq!(
                    doubled[i],
                    bytes[offset * 3 + i].wrapping_add(bytes[offset * 3 + i])
                );
            }
        }
    }
}
