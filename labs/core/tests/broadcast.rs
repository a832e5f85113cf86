//! Broadcasting, type promotion, integer arithmetic, casts, comparisons and `where`,
//! against PyTorch's documented results and host arithmetic. Runs on the simulated GPU
//! by default and on the GPU with `LABS_DEVICE=cuda`, where it also compiles the
//! integer, strided, comparison and cast modules.

use half::{bf16, f16};
use labs_core::kernels::CompareOp;
use labs_core::tensor::{promote_types, Scalar};
use labs_core::testing::{serial, test_device};
use labs_core::{DType, Device, Element, Error, Tensor};

fn t<T: Element>(data: &[T], shape: &[usize], d: &Device) -> Tensor {
    Tensor::from_slice(data, shape, d).unwrap()
}

fn v<T: Element>(x: &Tensor) -> Vec<T> {
    x.to_vec::<T>().unwrap()
}

fn arange(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

#[test]
fn shapes_broadcast_from_the_right_without_copying_operands() {
    let _serial = serial();
    let d = test_device();
    // [3, 1] + [4] -> [3, 4]: out[i][j] = a[i] + b[j].
    let a = t(&[0.0f32, 10.0, 20.0], &[3, 1], &d);
    let b = t(&[1.0f32, 2.0, 3.0, 4.0], &[4], &d);
    let sum = a.add(&b).unwrap();
    assert_eq!(sum.shape(), [3, 4]);
    let want: Vec<f32> = (0..12)
        .map(|k| (k / 4) as f32 * 10.0 + (k % 4 + 1) as f32)
        .collect();
    assert_eq!(v::<f32>(&sum), want);
    // [2, 3, 4] * [3, 1] -> [2, 3, 4]: out[i][j][k] = x[i][j][k] * y[j].
    let x = t(&arange(24), &[2, 3, 4], &d);
    let y = t(&[1.0f32, -1.0, 0.5], &[3, 1], &d);
    let prod = x.mul(&y).unwrap();
    assert_eq!(prod.shape(), [2, 3, 4]);
    let want: Vec<f32> = (0..24)
        .map(|k| k as f32 * [1.0, -1.0, 0.5][(k / 4) % 3])
        .collect();
    assert_eq!(v::<f32>(&prod), want);
    // A zero-dimensional tensor on either side.
    let s = t(&[2.0f32], &[], &d);
    assert_eq!(v::<f32>(&s.sub(&b).unwrap()), [1.0, 0.0, -1.0, -2.0]);
    assert_eq!(v::<f32>(&b.div(&s).unwrap()), [0.5, 1.0, 1.5, 2.0]);
    assert_eq!(s.add(&s).unwrap().shape(), [0usize; 0]);
    // A transposed operand is read through its strides (no `contiguous` first).
    let m = t(&arange(6), &[2, 3], &d);
    let mt = m.transpose(0, 1).unwrap();
    let col = t(&[100.0f32, 200.0], &[2], &d);
    assert_eq!(
        v::<f32>(&mt.add(&col).unwrap()),
        [100.0, 203.0, 101.0, 204.0, 102.0, 205.0]
    );
    // Empty shapes broadcast too.
    let e = Tensor::zeros(&[0, 4], DType::F32, &d).unwrap();
    assert_eq!(e.add(&b).unwrap().shape(), [0, 4]);
}

#[test]
fn mismatched_shapes_are_errors_naming_both() {
    let _serial = serial();
    let d = test_device();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let err = a.mul(&b).unwrap_err();
    assert!(matches!(err, Error::Shape { op: "mul", .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("[2, 3]") && text.contains("[4]"), "{text}");
    let c = Tensor::zeros(&[3, 2], DType::F32, &d).unwrap();
    assert!(matches!(a.lt(&c), Err(Error::Shape { op: "lt", .. })));
    let mask = Tensor::zeros(&[2, 2], DType::U8, &d).unwrap();
    assert!(matches!(
        Tensor::where_(&mask, &a, &a),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn promotion_follows_torch_result_type() {
    let _serial = serial();
    use DType::*;
    let d = test_device();
    let z = |dtype: DType, shape: &[usize]| Tensor::zeros(shape, dtype, &d).unwrap();
    // torch.promote_types
    assert_eq!(promote_types(F16, BF16), F32);
    assert_eq!(promote_types(F32, F16), F32);
    assert_eq!(promote_types(I32, I64), I64);
    assert_eq!(promote_types(U8, I32), I32);
    assert_eq!(promote_types(I64, BF16), BF16);
    // Tensor-tensor, as the ops compute.
    let cases = [
        (F16, BF16, F32),
        (F32, F16, F32),
        (I32, I64, I64),
        (U8, I32, I32),
        (I64, F16, F16),
        (U8, U8, U8),
    ];
    for (a, b, want) in cases {
        let sum = z(a, &[2]).add(&z(b, &[2])).unwrap();
        assert_eq!(sum.dtype(), want, "{a} + {b}");
    }
    // A zero-dimensional tensor changes only the category.
    assert_eq!(z(F16, &[2]).add(&z(F32, &[])).unwrap().dtype(), F16);
    assert_eq!(z(I32, &[2]).add(&z(F32, &[])).unwrap().dtype(), F32);
    assert_eq!(z(U8, &[2]).add(&z(I64, &[])).unwrap().dtype(), U8);
    assert_eq!(z(F16, &[]).add(&z(F32, &[])).unwrap().dtype(), F32);
    // Python scalars: a float makes an integer tensor float32, a half tensor stays half.
    assert_eq!(z(I64, &[2]).result_type_scalar(2.5), F32);
    assert_eq!(z(F16, &[2]).result_type_scalar(2.5), F16);
    assert_eq!(z(U8, &[2]).result_type_scalar(3), U8);
    let i = t(&[1i32, 2, 3], &[3], &d);
    let half_i = i.mul_scalar(0.5).unwrap();
    assert_eq!(half_i.dtype(), F32);
    assert_eq!(v::<f32>(&half_i), [0.5, 1.0, 1.5]);
    let plus = i.add_scalar(10).unwrap();
    assert_eq!(plus.dtype(), I32);
    assert_eq!(v::<i32>(&plus), [11, 12, 13]);
    let h = t(&[f16::from_f32(1.0)], &[1], &d);
    assert_eq!(h.add_scalar(2.5).unwrap().dtype(), F16);
    // Division is true division: integers give float32.
    let q = i.div(&t(&[2i32, 2, 2], &[3], &d)).unwrap();
    assert_eq!((q.dtype(), v::<f32>(&q)), (F32, vec![0.5, 1.0, 1.5]));
    assert_eq!(v::<f32>(&i.div_scalar(4).unwrap()), [0.25, 0.5, 0.75]);
    // A float-only op on integers computes in float32 (torch.exp(int) is float32).
    let e = i.exp().unwrap();
    assert_eq!(e.dtype(), F32);
    assert_eq!(v::<f32>(&e)[0], 1f32.exp());
}

#[test]
fn integer_arithmetic_is_exact_and_wraps() {
    let _serial = serial();
    let d = test_device();
    let big = (1i64 << 40) + 12345;
    let a = t(&[big, -big, 7, i64::MAX], &[4], &d);
    let b = t(&[3i64, 5, -2, 1], &[4], &d);
    assert_eq!(
        v::<i64>(&a.mul(&b).unwrap()),
        [big * 3, -big * 5, -14, i64::MAX]
    );
    assert_eq!(
        v::<i64>(&a.add(&b).unwrap()),
        [big + 3, -big + 5, 5, i64::MIN]
    );
    assert_eq!(
        v::<i64>(&a.sub(&b).unwrap()),
        [big - 3, -big - 5, 9, i64::MAX - 1]
    );
    assert_eq!(v::<i64>(&a.maximum(&b).unwrap()), [big, 5, 7, i64::MAX]);
    assert_eq!(v::<i64>(&a.minimum(&b).unwrap()), [3, -big, -2, 1]);
    assert_eq!(v::<i64>(&a.neg().unwrap()), [-big, big, -7, -i64::MAX]);
    assert_eq!(v::<i64>(&a.abs().unwrap()), [big, big, 7, i64::MAX]);
    let x = t(&[i32::MAX, -3, 46341], &[3], &d);
    let y = t(&[1i32, 4, 46341], &[3], &d);
    assert_eq!(
        v::<i32>(&x.add(&y).unwrap()),
        [i32::MIN, 1, 92682],
        "int32 wraps"
    );
    assert_eq!(
        v::<i32>(&x.mul(&y).unwrap()),
        [i32::MAX, -12, 46341i32.wrapping_mul(46341)]
    );
    let p = t(&[250u8, 3, 0], &[3], &d);
    let q = t(&[10u8, 5, 1], &[3], &d);
    assert_eq!(v::<u8>(&p.add(&q).unwrap()), [4, 8, 1], "uint8 wraps");
    assert_eq!(v::<u8>(&p.sub(&q).unwrap()), [240, 254, 255]);
    assert_eq!(v::<u8>(&p.mul(&q).unwrap()), [196, 15, 0]);
    assert_eq!(v::<u8>(&p.maximum(&q).unwrap()), [250, 5, 1]);
    // Broadcast integer ops take the strided kernel.
    let col = t(&[1i64 << 41, 1], &[2, 1], &d);
    assert_eq!(
        v::<i64>(&col.add(&b).unwrap()),
        [
            (1 << 41) + 3,
            (1 << 41) + 5,
            (1 << 41) - 2,
            (1 << 41) + 1,
            4,
            6,
            -1,
            2
        ]
    );
}

#[test]
fn casts_truncate_round_and_wrap_as_pytorch() {
    let _serial = serial();
    let d = test_device();
    let x = t(&[2.7f32, -2.7, -1.0, 300.0, 0.0, 1e10], &[6], &d);
    let same = x.to_dtype(DType::F32).unwrap();
    assert!(
        same.shares_storage(&x),
        "a cast to its own dtype is the tensor"
    );
    assert_eq!(
        v::<i32>(&x.to_dtype(DType::I32).unwrap())[..5],
        [2, -2, -1, 300, 0]
    );
    assert_eq!(
        v::<i64>(&x.to_dtype(DType::I64).unwrap()),
        [2, -2, -1, 300, 0, 10_000_000_000]
    );
    // -1.0 wraps to 255, 300 to 44 (through int64, as c10's cast to uint8).
    assert_eq!(
        v::<u8>(&x.to_dtype(DType::U8).unwrap())[..5],
        [2, 254, 255, 44, 0]
    );
    // Round to nearest even: 1 + half an ulp is a tie (down to even), 1 + 1.5 ulps
    // rounds up to the even neighbour.
    let ties = t(
        &[1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 65520.0],
        &[3],
        &d,
    );
    let h = v::<f16>(&ties.to_dtype(DType::F16).unwrap());
    assert_eq!(
        h,
        [
            f16::from_f32(1.0),
            f16::from_f32(1.0 + 2f32.powi(-9)),
            f16::INFINITY
        ]
    );
    let ties = t(&[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)], &[2], &d);
    let b = v::<bf16>(&ties.to_dtype(DType::BF16).unwrap());
    assert_eq!(
        b,
        [bf16::from_f32(1.0), bf16::from_f32(1.0 + 2f32.powi(-6))]
    );
    // float16 -> bfloat16 goes through float32.
    let hb = t(&[f16::from_f32(3.140625)], &[1], &d)
        .to_dtype(DType::BF16)
        .unwrap();
    assert_eq!(v::<bf16>(&hb), [bf16::from_f32(3.140625)]);
    // Integers: to float rounds to nearest, between integers keeps the low bits.
    let big = t(&[(1i64 << 40) + 1, (1i64 << 32) + 5, -1], &[3], &d);
    assert_eq!(
        v::<f32>(&big.to_dtype(DType::F32).unwrap()),
        [2f32.powi(40), 2f32.powi(32), -1.0]
    );
    assert_eq!(v::<i32>(&big.to_dtype(DType::I32).unwrap()), [1, 5, -1]);
    assert_eq!(v::<u8>(&big.to_dtype(DType::U8).unwrap()), [1, 5, 255]);
    let bytes = t(&[200u8, 0], &[2], &d);
    assert_eq!(v::<f32>(&bytes.to_dtype(DType::F32).unwrap()), [200.0, 0.0]);
    assert_eq!(v::<i64>(&bytes.to_dtype(DType::I64).unwrap()), [200, 0]);
    // A strided view is cast element by element in row-major order.
    let m = t(&[1.5f32, 2.5, 3.5, 4.5], &[2, 2], &d);
    let mt = m.transpose(0, 1).unwrap().to_dtype(DType::I32).unwrap();
    assert_eq!(v::<i32>(&mt), [1, 3, 2, 4]);
}

#[test]
fn comparisons_give_uint8_masks_and_where_selects() {
    let _serial = serial();
    let d = test_device();
    let a = t(&[1.0f32, 2.0, 3.0, f32::NAN], &[4], &d);
    let b = t(&[2.0f32], &[], &d);
    let mask = |op| v::<u8>(&a.compare(op, &b).unwrap());
    assert_eq!(mask(CompareOp::Eq), [0, 1, 0, 0]);
    assert_eq!(mask(CompareOp::Ne), [1, 0, 1, 1], "NaN != everything");
    assert_eq!(mask(CompareOp::Lt), [1, 0, 0, 0]);
    assert_eq!(mask(CompareOp::Le), [1, 1, 0, 0]);
    assert_eq!(mask(CompareOp::Gt), [0, 0, 1, 0]);
    assert_eq!(mask(CompareOp::Ge), [0, 1, 1, 0]);
    assert_eq!(a.gt(&b).unwrap().dtype(), DType::U8);
    // maximum and minimum propagate NaN from either side, as torch.maximum does.
    let nan_left = v::<f32>(&a.maximum(&b).unwrap());
    assert!(nan_left[..3] == [2.0, 2.0, 3.0] && nan_left[3].is_nan());
    let nan_right = v::<f32>(&b.minimum(&a).unwrap());
    assert!(nan_right[..3] == [1.0, 2.0, 2.0] && nan_right[3].is_nan());
    // Integers compare exactly, and promote against floats.
    let big = t(&[(1i64 << 40) + 1, 1 << 40], &[2], &d);
    let edge = t(&[1i64 << 40], &[], &d);
    assert_eq!(v::<u8>(&big.gt(&edge).unwrap()), [1, 0]);
    let ints = t(&[1i32, 2, 3], &[3], &d);
    assert_eq!(
        v::<u8>(&ints.compare_scalar(CompareOp::Lt, 2.5).unwrap()),
        [1, 1, 0]
    );
    // where: cond [3] against a [2, 3] and a zero-dimensional b.
    let cond = t(&[1u8, 0, 1], &[3], &d);
    let x = t(&arange(6), &[2, 3], &d);
    let fill = t(&[-1.0f32], &[], &d);
    let w = Tensor::where_(&cond, &x, &fill).unwrap();
    assert_eq!(w.shape(), [2, 3]);
    assert_eq!(v::<f32>(&w), [0.0, -1.0, 2.0, 3.0, -1.0, 5.0]);
    // Mixed dtypes promote: int64 and float32 give float32.
    let wi = Tensor::where_(&cond, &t(&[7i64], &[], &d), &x).unwrap();
    assert_eq!(wi.dtype(), DType::F32);
    assert_eq!(v::<f32>(&wi), [7.0, 1.0, 7.0, 7.0, 4.0, 7.0]);
    let not_a_mask = Tensor::zeros(&[3], DType::F32, &d).unwrap();
    assert!(matches!(
        Tensor::where_(&not_a_mask, &x, &x),
        Err(Error::DType { .. })
    ));
    // masked_fill keeps the tensor's dtype and shape; the mask broadcasts to it.
    let filled = x.masked_fill(&cond, 9.5).unwrap();
    assert_eq!(v::<f32>(&filled), [9.5, 1.0, 9.5, 9.5, 4.0, 9.5]);
    let li = t(&[5i64, 6, 7], &[3], &d).masked_fill(&cond, 0).unwrap();
    assert_eq!(v::<i64>(&li), [0, 6, 0]);
    let too_big = Tensor::zeros(&[4, 3], DType::U8, &d).unwrap();
    assert!(x.masked_fill(&too_big, 0.0).is_err());
}

#[test]
fn pointwise_ops_on_integers_and_scalars() {
    let _serial = serial();
    let d = test_device();
    let i = t(&[-3i32, 0, 4], &[3], &d);
    assert_eq!(v::<i32>(&i.relu().unwrap()), [0, 0, 4]);
    let c = i
        .clamp(Some(Scalar::Int(-1)), Some(Scalar::Int(2)))
        .unwrap();
    assert_eq!((c.dtype(), v::<i32>(&c)), (DType::I32, vec![-1, 0, 2]));
    let cf = i.clamp_min(0.5).unwrap();
    assert_eq!(
        (cf.dtype(), v::<f32>(&cf)),
        (DType::F32, vec![0.5, 0.5, 4.0])
    );
    let f = t(&[4.0f32, f32::NAN, -1.0], &[3], &d);
    let clamped = v::<f32>(&f.clamp_max(2.0).unwrap());
    assert!(clamped[0] == 2.0 && clamped[1].is_nan() && clamped[2] == -1.0);
    assert!(f.clamp(None, None).is_err());
    assert_eq!(v::<f32>(&f.pow_scalar(2).unwrap())[0], 16.0);
    // An integer tensor to an integer power stays integer; a float power makes float32.
    let sq = i.pow_scalar(2).unwrap();
    assert_eq!((sq.dtype(), v::<i32>(&sq)), (DType::I32, vec![9, 0, 16]));
    let root = i.pow_scalar(0.5).unwrap();
    assert_eq!(root.dtype(), DType::F32);
    assert_eq!(v::<f32>(&root)[2], 2.0);
    let big = t(&[3i64, -1, 2, 5], &[4], &d);
    let e = t(&[39i64, 3, -1, 0], &[4], &d);
    assert_eq!(
        v::<i64>(&big.pow(&e).unwrap()),
        [3i64.pow(39), -1, 0, 1],
        "int64 powers are exact"
    );
    let r = t(&[4.0f32, 0.25], &[2], &d).rsqrt().unwrap();
    let r = v::<f32>(&r);
    assert!((r[0] - 0.5).abs() < 1e-6 && (r[1] - 2.0).abs() < 1e-6);
    let g = t(&[1.0f32], &[1], &d);
    let exact = v::<f32>(&g.gelu("none").unwrap())[0];
    let tanh = v::<f32>(&g.gelu("tanh").unwrap())[0];
    // torch.nn.functional.gelu(torch.tensor([1.0])) and with approximate="tanh".
    assert!((exact - 0.841_344_7).abs() < 1e-6, "{exact}");
    assert!((tanh - 0.841_192).abs() < 1e-5, "{tanh}");
    assert!(g.gelu("fast").is_err());
    let ints = t(&[1i32, 2], &[2], &d);
    let exps = t(&[3.0f32, 0.5], &[2], &d);
    let p = v::<f32>(&ints.pow(&exps).unwrap());
    assert!((p[0] - 1.0).abs() < 1e-6 && (p[1] - 2f32.sqrt()).abs() < 1e-6);
}

#[test]
fn broadcast_ops_and_their_graphs_return_memory_to_baseline() {
    let _serial = serial();
    let d = test_device();
    let alloc = d.allocator().unwrap();
    let x = Tensor::randn(&[64, 32], 5, &d)
        .unwrap()
        .requires_grad_(true);
    let bias = Tensor::randn(&[32], 6, &d).unwrap().requires_grad_(true);
    let base = alloc.memory_allocated();
    {
        let y = x.add(&bias).unwrap().gelu("tanh").unwrap();
        let mask = y.gt(&Tensor::zeros(&[], DType::F32, &d).unwrap()).unwrap();
        let z = Tensor::where_(&mask, &y, &y.mul_scalar(0.1).unwrap()).unwrap();
        let z = z
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let loss = z.maximum(&bias).unwrap().sum_all().unwrap();
        assert!(alloc.memory_allocated() > base);
        loss.backward().unwrap();
        assert_eq!(bias.grad().unwrap().shape(), [32]);
        assert_eq!(x.grad().unwrap().shape(), [64, 32]);
    }
    x.clear_grad();
    bias.clear_grad();
    assert_eq!(
        alloc.memory_allocated(),
        base,
        "memory back to the baseline"
    );
}
