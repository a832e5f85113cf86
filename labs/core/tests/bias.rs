//! A linear layer's bias added by its matrix product (cuBLASLt's bias epilogue on the
//! GPU, the CPU GEMM's twin on the simulator). On the simulated GPU by default, on the
//! GPU with `LABS_DEVICE=cuda`. The broadcast add that remains elsewhere is
//! `tests/row_broadcast.rs`'s.
//!
//! The fused product rounds each output once where a product and an add round twice:
//! in `float32` on the simulator that is the same value bit for bit (the product's
//! rounding to `f32` is no rounding), so it is compared exactly there; on the GPU,
//! cuBLASLt may sum in another order than cuBLAS, so it is compared with the
//! accumulation bound of `tests/matmul.rs`, in units of `S = sum_p |a_ip| |b_pj|` plus
//! the bias's and C's magnitudes.

use labs_core::kernels::{Gemm, Kernel, Operand};
use labs_core::testing::{launch_count as count, launches, serial, test_device};
use labs_core::{DType, Device, Error, Tensor};

mod gradcheck;

use gradcheck::{check_gradients, values};

const U32: f64 = 1.0 / (1u64 << 24) as f64;

fn f64s(t: &Tensor) -> Vec<f64> {
    (t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap())
        .into_iter()
        .map(f64::from)
        .collect()
}

fn tensor(data: &[f32], shape: &[usize], dtype: DType, d: &Device) -> Tensor {
    Tensor::from_slice(data, shape, d)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// `x @ wᵀ + b` in `f64` from the tensors' values, with the bound's unit per element
/// (`S + |b|`).
fn linear_reference(x: &Tensor, w: &Tensor, b: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let (xv, wv, bv) = (f64s(x), f64s(w), f64s(b));
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let rows = xv.len() / k;
    let mut want = vec![0.0; rows * n];
    let mut unit = vec![0.0; rows * n];
    for i in 0..rows {
        for j in 0..n {
            let (mut dot, mut s) = (0.0, 0.0);
            for p in 0..k {
                dot += xv[i * k + p] * wv[j * k + p];
                s += (xv[i * k + p] * wv[j * k + p]).abs();
            }
            want[i * n + j] = dot + bv[j];
            unit[i * n + j] = s + bv[j].abs();
        }
    }
    (want, unit)
}

fn assert_within(name: &str, got: &[f64], want: &[f64], unit: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, ((g, w), u)) in got.iter().zip(want).zip(unit).enumerate() {
        assert!(
            (g - w).abs() <= tol * u + 1e-30,
            "{name}: element {i} is {g}, the reference {w} (bound {})",
            tol * u
        );
    }
}

/// Per unit of the bound: the output's rounding twice (the unfused path rounds twice)
/// and `f32` accumulation over `k`.
fn tolerance(dtype: DType, k: usize) -> f64 {
    let rounding = match dtype {
        DType::F16 => 1.0 / 2048.0,
        DType::BF16 => 1.0 / 256.0,
        _ => U32,
    };
    2.0 * rounding + 2.0 * k as f64 * U32
}

#[test]
fn linear_with_a_bias_is_one_gemm_launch_and_equals_matmul_plus_add() {
    let _s = serial();
    let d = test_device();
    let (rows, k, n) = (12, 16, 10);
    let x = tensor(&values(rows * k, 1, -1.0, 1.0), &[rows, k], DType::F32, &d);
    let w = tensor(&values(n * k, 2, -1.0, 1.0), &[n, k], DType::F32, &d);
    let b = tensor(&values(n, 3, -1.0, 1.0), &[n], DType::F32, &d);
    let separate = labs_core::cuda::separate_bias_adds();
    let (y, seen) = launches(&d, || x.linear(&w, Some(&b)).unwrap());
    let total: u64 = seen.iter().map(|l| l.launches).sum();
    assert_eq!(total, 1, "one launch: {seen:?}");
    // On the GPU: cuBLASLt added the bias (no product ran as cuBLAS and an add).
    assert_eq!(labs_core::cuda::separate_bias_adds(), separate);
    assert_eq!(
        count(&seen, "Gemm F32 12x10x16 batch 1 NT bias"),
        1,
        "{seen:?}"
    );
    let two_ops = x
        .matmul(&w.transpose(0, 1).unwrap())
        .unwrap()
        .add(&b)
        .unwrap();
    let (want, unit) = linear_reference(&x, &w, &b);
    assert_within("fused", &f64s(&y), &want, &unit, tolerance(DType::F32, k));
    assert_within(
        "two ops",
        &f64s(&two_ops),
        &want,
        &unit,
        tolerance(DType::F32, k),
    );
    if !d.is_cuda() {
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            two_ops.to_vec::<f32>().unwrap(),
            "the twin rounds an f32 product once either way"
        );
    }
    // Rows of a batch ([2, 6, k]) are one tall product: one launch too.
    let x3 = x.reshape(&[2, 6, k]).unwrap();
    let (y3, seen) = launches(&d, || x3.linear(&w, Some(&b)).unwrap());
    assert_eq!(seen.iter().map(|l| l.launches).sum::<u64>(), 1, "{seen:?}");
    assert_eq!(y3.shape(), &[2, 6, n]);
    assert_eq!(y3.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    // Without a bias: the product alone, as before.
    let (_, seen) = launches(&d, || x.linear(&w, None).unwrap());
    assert_eq!(count(&seen, "Gemm F32 12x10x16 batch 1 NT"), 1, "{seen:?}");
    assert_eq!(count(&seen, "bias"), 0, "{seen:?}");
}

#[test]
fn the_fused_linear_allocates_one_output() {
    let _s = serial();
    let d = test_device();
    let alloc = d.allocator().unwrap();
    // [64, 32] float32: 8 KiB, a whole number of the allocator's blocks.
    let (rows, k, n) = (64, 16, 32);
    let x = tensor(&values(rows * k, 4, -1.0, 1.0), &[rows, k], DType::F32, &d);
    let w = tensor(&values(n * k, 5, -1.0, 1.0), &[n, k], DType::F32, &d);
    let b = tensor(&values(n, 6, -1.0, 1.0), &[n], DType::F32, &d);
    let peak_of = |f: &dyn Fn() -> Tensor| {
        d.synchronize().unwrap();
        let before = alloc.stats().allocated.current;
        alloc.reset_peak_stats();
        let y = f();
        d.synchronize().unwrap();
        let peak = alloc.stats().allocated.peak - before;
        drop(y);
        peak
    };
    let out = (rows * n * 4) as u64;
    let fused = peak_of(&|| x.linear(&w, Some(&b)).unwrap());
    assert_eq!(fused, out, "one [rows, out] tensor");
    let two_ops = peak_of(&|| {
        (x.matmul(&w.transpose(0, 1).unwrap()).unwrap())
            .add(&b)
            .unwrap()
    });
    assert_eq!(
        two_ops,
        2 * out,
        "the product and the sum, both live at the add"
    );
}

#[test]
fn half_precision_linear_is_within_rounding_of_matmul_plus_add() {
    let _s = serial();
    let d = test_device();
    let (rows, k, n) = (9, 24, 7);
    for dtype in [DType::BF16, DType::F16] {
        let x = tensor(&values(rows * k, 7, -1.0, 1.0), &[rows, k], dtype, &d);
        let w = tensor(&values(n * k, 8, -1.0, 1.0), &[n, k], dtype, &d);
        let b = tensor(&values(n, 9, -1.0, 1.0), &[n], dtype, &d);
        let (y, seen) = launches(&d, || x.linear(&w, Some(&b)).unwrap());
        assert_eq!(count(&seen, "bias"), 1, "{dtype}: {seen:?}");
        assert_eq!(y.dtype(), dtype);
        let two_ops = x
            .matmul(&w.transpose(0, 1).unwrap())
            .unwrap()
            .add(&b)
            .unwrap();
        let (want, unit) = linear_reference(&x, &w, &b);
        let tol = tolerance(dtype, k);
        assert_within(&format!("{dtype} fused"), &f64s(&y), &want, &unit, tol);
        assert_within(
            &format!("{dtype} two ops"),
            &f64s(&two_ops),
            &want,
            &unit,
            tol,
        );
    }
}

#[test]
fn linear_gradients_match_finite_differences() {
    let _s = serial();
    let m = |r: usize, c: usize, seed| (values(r * c, seed, -1.0, 1.0), vec![r, c]);
    let bias = (values(5, 12, -1.0, 1.0), vec![5]);
    check_gradients(
        "linear [3,4] -> 5",
        &[m(3, 4, 10), m(5, 4, 11), bias.clone()],
        |t| t[0].linear(&t[1], Some(&t[2])).unwrap(),
    );
    check_gradients(
        "linear [2,3,4] -> 5, then tanh",
        &[
            (values(24, 13, -1.0, 1.0), vec![2, 3, 4]),
            m(5, 4, 14),
            bias,
        ],
        |t| {
            let y = t[0].linear(&t[1], Some(&t[2])).unwrap();
            y.unary(labs_core::kernels::UnaryOp::Tanh).unwrap()
        },
    );
}

#[test]
fn linear_gradients_equal_those_of_the_product_and_the_add() {
    let _s = serial();
    let d = test_device();
    let (rows, k, n) = (6, 8, 5);
    let leaf = |seed, shape: &[usize]| {
        let len = shape.iter().product();
        tensor(&values(len, seed, -1.0, 1.0), shape, DType::F32, &d).requires_grad_(true)
    };
    let (x, w, b) = (leaf(20, &[rows, k]), leaf(21, &[n, k]), leaf(22, &[n]));
    let g = tensor(&values(rows * n, 23, -1.0, 1.0), &[rows, n], DType::F32, &d);
    let grads = |y: Tensor| {
        y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let got = [&x, &w, &b].map(|t| t.grad().unwrap().to_vec::<f32>().unwrap());
        for t in [&x, &w, &b] {
            t.clear_grad();
        }
        got
    };
    let y = x.linear(&w, Some(&b)).unwrap();
    assert_eq!(y.grad_fn().unwrap().op.name(), "AddmmBackward");
    let fused = grads(y);
    let two_ops = grads(
        x.matmul(&w.transpose(0, 1).unwrap())
            .unwrap()
            .add(&b)
            .unwrap(),
    );
    // Backward runs the same kernels on the same gradient either way.
    assert_eq!(fused, two_ops);
    // A bias that needs no gradient gets none; the others are unchanged.
    let frozen = b.detach();
    x.linear(&w, Some(&frozen))
        .unwrap()
        .mul(&g)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(frozen.grad().is_none());
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), fused[0]);
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), fused[1]);
}

/// Writes `data` as `dtype` at the start of a fresh tensor of `len` elements.
fn buffer(data: &[f32], len: usize, dtype: DType, d: &Device) -> Tensor {
    let mut v = data.to_vec();
    v.resize(len, 0.0);
    tensor(&v, &[len], dtype, d)
}

/// Element `(i, j)` of a row-major matrix stored with leading dimension `ld`, used
/// transposed or not.
fn at(v: &[f64], ld: usize, transposed: bool, i: usize, j: usize) -> f64 {
    if transposed {
        v[j * ld + i]
    } else {
        v[i * ld + j]
    }
}

#[test]
fn a_gemm_with_a_bias_matches_a_float64_reference() {
    let _s = serial();
    let d = test_device();
    // On the GPU, m = 5 runs cuBLASLt (told that A starts one element into its
    // storage when `a_off`, where it may also find no algorithm); m = 1, or a bias one
    // element into its storage, runs cuBLAS then the broadcast add. Both operands transposed or not, rows padded, C
    // scaled and accumulated.
    let cases = [
        (DType::F32, DType::F32, 5, false, true, 9, false, false),
        (DType::BF16, DType::BF16, 5, true, false, 9, false, false),
        (DType::F16, DType::F16, 5, true, true, 9, true, false),
        (DType::BF16, DType::F32, 5, false, false, 9, true, false),
        (DType::F32, DType::F32, 1, false, true, 6, false, false),
        (DType::BF16, DType::BF16, 1, true, false, 6, false, false),
        (DType::F32, DType::F32, 5, false, true, 6, false, true),
        (DType::BF16, DType::BF16, 5, true, true, 6, true, true),
    ];
    for (dtype, c_dtype, m, ta, tb, ldc, a_off, bias_off) in cases {
        let (n, k) = (6, 7);
        let (alpha, beta) = (0.5f32, 0.25f32);
        // A is [m, k] (stored [k, m] when transposed), rows 3 longer than needed.
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        let (lda, ldb) = (ac + 3, bc + 2);
        let a_val: Vec<f32> = values(ar * lda, 30, -1.0, 1.0);
        let b_val: Vec<f32> = values(br * ldb, 31, -1.0, 1.0);
        let c_val: Vec<f32> = values(m * ldc, 32, -1.0, 1.0);
        let bias_val: Vec<f32> = values(n, 33, -1.0, 1.0);
        let skip = |off: bool| usize::from(off);
        let a = buffer(&a_val, ar * lda + 1, dtype, &d).narrow(0, skip(a_off), ar * lda);
        let b = buffer(&b_val, br * ldb, dtype, &d);
        let c = buffer(&c_val, m * ldc, c_dtype, &d);
        let bias = buffer(&bias_val, n + 1, c_dtype, &d).narrow(0, skip(bias_off), n);
        let (a, bias) = (a.unwrap(), bias.unwrap());
        let c_before = f64s(&c);
        let gemm = Gemm {
            dtype,
            m,
            n,
            k,
            batch: 1,
            a: Operand {
                ptr: a.ptr(),
                ld: lda,
                batch_stride: 0,
                transposed: ta,
            },
            b: Operand {
                ptr: b.ptr(),
                ld: ldb,
                batch_stride: 0,
                transposed: tb,
            },
            c: c.ptr(),
            c_dtype,
            ldc,
            stride_c: m * ldc,
            alpha,
            beta,
            allow_tf32: false,
            bias: Some(bias.ptr()),
        };
        let separate = labs_core::cuda::separate_bias_adds();
        d.launch(&Kernel::Gemm(gemm)).unwrap();
        let (av, bv, bias_v) = (f64s(&a), f64s(&b), f64s(&bias));
        let got = f64s(&c);
        let name = format!("{dtype}->{c_dtype} m={m} ta={ta} tb={tb} offsets {a_off} {bias_off}");
        if d.is_cuda() && !a_off {
            let expected = u64::from(m == 1 || bias_off);
            assert_eq!(
                labs_core::cuda::separate_bias_adds() - separate,
                expected,
                "{name}: which path ran"
            );
        }
        let tol = tolerance(dtype, k).max(tolerance(c_dtype, k));
        for i in 0..m {
            for j in 0..n {
                let (mut dot, mut s) = (0.0, 0.0);
                for p in 0..k {
                    let v = at(&av, lda, ta, i, p) * at(&bv, ldb, tb, p, j);
                    dot += v;
                    s += v.abs();
                }
                let old = c_before[i * ldc + j];
                let want = alpha as f64 * dot + beta as f64 * old + bias_v[j];
                let unit = alpha as f64 * s + (beta as f64 * old).abs() + bias_v[j].abs();
                let g = got[i * ldc + j];
                assert!(
                    (g - want).abs() <= tol * unit,
                    "{name}: C[{i},{j}] = {g}, the reference {want}"
                );
            }
            for j in n..ldc {
                assert_eq!(got[i * ldc + j], c_before[i * ldc + j], "{name}: padding");
            }
        }
    }
}

#[test]
fn bad_biases_are_clear_errors() {
    let _s = serial();
    let d = test_device();
    let x = tensor(&values(12, 50, -1.0, 1.0), &[3, 4], DType::F32, &d);
    let w = tensor(&values(20, 51, -1.0, 1.0), &[5, 4], DType::F32, &d);
    let short = tensor(&values(4, 52, -1.0, 1.0), &[4], DType::F32, &d);
    let e = x.linear(&w, Some(&short)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("[out] = [5]") && m.contains("[4]")),
        "{e}"
    );
    let halves = tensor(&values(5, 53, -1.0, 1.0), &[5], DType::BF16, &d);
    let e = x.linear(&w, Some(&halves)).unwrap_err();
    assert_eq!(
        e,
        Error::DTypeMismatch {
            op: "linear",
            a: DType::F32,
            b: DType::BF16
        }
    );
    // A bias is one product's: a batch of them is refused before anything runs.
    let mut g = Gemm::dense(DType::F32, 2, 5, 4, [x.ptr(), w.ptr(), x.ptr()]);
    g.bias = Some(halves.ptr());
    g.batch = 2;
    g.stride_c = 10;
    let e = d.launch(&Kernel::Gemm(g)).unwrap_err();
    assert!(e.to_string().contains("batch must be 1"), "{e}");
}

#[test]
fn linear_under_autocast_adds_the_cast_bias_in_its_product() {
    let _s = serial();
    let d = test_device();
    let (rows, k, n) = (8, 16, 12);
    let x = tensor(&values(rows * k, 60, -1.0, 1.0), &[rows, k], DType::F32, &d);
    let w = tensor(&values(n * k, 61, -1.0, 1.0), &[n, k], DType::F32, &d);
    let b = tensor(&values(n, 62, -1.0, 1.0), &[n], DType::F32, &d);
    let (y, seen) = launches(&d, || {
        let _region = labs_core::tensor::autocast(DType::BF16).unwrap();
        x.linear(&w, Some(&b)).unwrap()
    });
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(
        count(&seen, "Gemm BF16 8x12x16 batch 1 NT bias"),
        1,
        "{seen:?}"
    );
    assert_eq!(count(&seen, "Binary"), 0, "{seen:?}");
    let cast = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let plain = cast(&x).linear(&cast(&w), Some(&cast(&b))).unwrap();
    assert_eq!(f64s(&y), f64s(&plain));
}
