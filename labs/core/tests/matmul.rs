//! Matrix products on the device under test (the simulated GPU by default, the GPU's
//! cuBLAS with `LABS_DEVICE=cuda`), against references computed here in `f64` from the
//! very inputs the device got.
//!
//! Tolerances are bounds, per element, in units of `S = sum_p |a_ip| |b_pj|` (what the
//! products add up to without cancellation), so that they hold for any summation order
//! cuBLAS picks (blocked, split-k):
//!
//! - `float32`, TF32 off: `2 k u S`, `u = 2^-24`. Each of the `k` products and `k - 1`
//!   additions rounds once in `f32` (at most `u` of a partial sum, itself at most `S`);
//!   the factor 2 covers the product roundings. Far below TF32's error, so a TF32 that
//!   sneaks in fails it.
//! - `float32` with TF32: `(2^-9 + 2 k u) S`: each input loses up to 2^-10 of itself
//!   when truncated to TF32's 10 mantissa bits (2^-11 when rounded), so a product up to
//!   2^-9, then the `f32` accumulation as above.
//! - `float16`: `(2^-10 + 2 k u) S`. Products of two `f16` are exact in `f32` and are
//!   accumulated in `f32`; the result is rounded to `f16` (2^-11 of itself), and
//!   cuBLAS's default math mode may round split-k partial sums to `f16` too (another
//!   2^-11).
//! - `bfloat16`: `(2^-7 + 2 k u) S`, the same with bf16's 8 bits (2^-8 per rounding).
//!
//! Layout tests use small integers, whose products and sums are exact in every dtype,
//! and compare exactly.
//!
//! The tests take one lock: the allocator's `memory_allocated` counts the whole device,
//! and one test checks that products leave it where it was.

use half::{bf16, f16};
use labs_core::kernels::{Gemm, Kernel, Operand};
use labs_core::tensor::MatmulOptions;
use labs_core::testing::{host, serial, test_device};
use labs_core::{DType, Device, Element, Error, Tensor};

const U32: f64 = 1.0 / (1u64 << 24) as f64;

trait Float: Element {
    /// The rounding of one result to this type, relative (half an ulp).
    const OUTPUT_ROUNDING: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}
impl Float for f32 {
    const OUTPUT_ROUNDING: f64 = 0.0; // inside the accumulation's bound
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Float for f16 {
    const OUTPUT_ROUNDING: f64 = 1.0 / 2048.0;
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}
impl Float for bf16 {
    const OUTPUT_ROUNDING: f64 = 1.0 / 256.0;
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

/// The bound of the module's comment, per unit of `S`.
fn tolerance<T: Float>(k: usize, tf32: bool) -> f64 {
    let accumulation = 2.0 * k as f64 * U32;
    let tf32 = if tf32 { 1.0 / 512.0 } else { 0.0 };
    2.0 * T::OUTPUT_ROUNDING + tf32 + accumulation
}

/// Deterministic values in [-1, 1), rounded to `T`.
fn random<T: Float>(n: usize, seed: u64) -> Vec<T> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            T::from_f64((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        })
        .collect()
}

/// Small integers in -2..=2, exact in every dtype and in every sum of up to 64 products.
fn integers<T: Float>(n: usize, seed: u64) -> Vec<T> {
    (0..n as u64)
        .map(|i| T::from_f64(((i * 7 + seed * 13 + i * i * 3) % 5) as f64 - 2.0))
        .collect()
}

fn tensor<T: Float>(values: &[T], shape: &[usize], d: &Device) -> Tensor {
    Tensor::from_slice(values, shape, d).unwrap()
}

/// `a @ b` in `f64` from the logical (row-major) values of the operands, with `S` per
/// element: `(reference, S)`. `b` may be 2-D (one weight for every batch).
fn reference(a: &Tensor, b: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let (av, bv) = (host(a), host(b));
    let (ra, rb) = (a.shape().len(), b.shape().len());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let batch: usize = a.shape()[..ra - 2].iter().product();
    let b_step = if rb == 2 { 0 } else { k * n };
    let mut out = vec![0.0; batch * m * n];
    let mut bound = vec![0.0; batch * m * n];
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut abs) = (0.0, 0.0);
                for p in 0..k {
                    let x = av[t * m * k + i * k + p] * bv[t * b_step + p * n + j];
                    sum += x;
                    abs += x.abs();
                }
                out[t * m * n + i * n + j] = sum;
                bound[t * m * n + i * n + j] = abs;
            }
        }
    }
    (out, bound)
}

/// Checks `a @ b` (with `options`) against the reference within `tolerance * S`.
fn check_product<T: Float>(what: &str, a: &Tensor, b: &Tensor, options: MatmulOptions) {
    let got = a.matmul_with(b, options).unwrap();
    let mut shape = a.shape()[..a.shape().len() - 2].to_vec();
    shape.extend([
        a.shape()[a.shape().len() - 2],
        b.shape()[b.shape().len() - 1],
    ]);
    assert_eq!(got.shape(), shape, "{what}: output shape");
    let got = got.to_vec::<T>().unwrap();
    let (expected, bound) = reference(a, b);
    let k = a.shape()[a.shape().len() - 1];
    let tol = tolerance::<T>(k, options.allow_tf32 && T::DTYPE == DType::F32);
    for (i, ((&g, &e), &s)) in got.iter().zip(&expected).zip(&bound).enumerate() {
        let err = (g.to_f64() - e).abs();
        assert!(
            err <= tol * s + 1e-30,
            "{what} ({}, {a:?} @ {b:?}) at {i}: got {}, expected {e}, error {err:.3e} > {:.3e} \
             (= {tol:.3e} x S = {s:.3e})",
            T::DTYPE,
            g.to_f64(),
            tol * s
        );
    }
}

/// Checks `a @ b` exactly (integer inputs).
fn check_exact<T: Float>(what: &str, a: &Tensor, b: &Tensor) {
    let got = a.matmul(b).unwrap().to_vec::<T>().unwrap();
    let (expected, _) = reference(a, b);
    let got: Vec<f64> = got.iter().map(|v| v.to_f64()).collect();
    assert_eq!(got, expected, "{what} ({}, {a:?} @ {b:?})", T::DTYPE);
}

fn products_match_the_reference<T: Float>(d: &Device) {
    let off = MatmulOptions::default();
    let mut seed = 1;
    let mut rand = |shape: &[usize]| {
        seed += 1;
        tensor(&random::<T>(shape.iter().product(), seed), shape, d)
    };
    for (m, k, n) in [
        (1, 1, 1),
        (3, 5, 7),
        (65, 33, 17),
        (17, 65, 33),
        (64, 64, 64),
    ] {
        check_product::<T>("2-D", &rand(&[m, k]), &rand(&[k, n]), off);
    }
    check_product::<T>("batched", &rand(&[4, 5, 9]), &rand(&[4, 9, 6]), off);
    check_product::<T>("shared weight", &rand(&[2, 3, 7, 5]), &rand(&[5, 4]), off);
    let at = rand(&[33, 65]).transpose(0, 1).unwrap();
    let bt = rand(&[17, 33]).transpose(0, 1).unwrap();
    check_product::<T>("transposed views", &at, &bt, off);
    let abt = rand(&[3, 9, 5]).transpose(1, 2).unwrap();
    check_product::<T>("batched, transposed", &abt, &rand(&[3, 9, 6]), off);
    check_product::<T>("shared weight, transposed A", &abt, &rand(&[9, 2]), off);
}

#[test]
fn products_match_an_f64_reference_on_every_dtype() {
    let _serial = serial();
    let d = test_device();
    products_match_the_reference::<f32>(&d);
    products_match_the_reference::<f16>(&d);
    products_match_the_reference::<bf16>(&d);
}

fn layouts<T: Float>(d: &Device) {
    let ints =
        |shape: &[usize], seed| tensor(&integers::<T>(shape.iter().product(), seed), shape, d);
    let (m, k, n, b) = (5, 7, 3, 4);
    let a = ints(&[m, k], 1);
    let bm = ints(&[k, n], 2);
    let a_t = ints(&[k, m], 3).transpose(0, 1).unwrap();
    let b_t = ints(&[n, k], 4).transpose(0, 1).unwrap();
    check_exact::<T>("plain", &a, &bm);
    check_exact::<T>("A transposed", &a_t, &bm);
    check_exact::<T>("B transposed", &a, &b_t);
    check_exact::<T>("both transposed", &a_t, &b_t);
    // Rows longer than the view: a leading dimension past the columns; and an offset.
    let a_narrow = ints(&[m + 1, k + 3], 5)
        .narrow(1, 2, k)
        .unwrap()
        .narrow(0, 1, m)
        .unwrap();
    let b_narrow = ints(&[k, n + 4], 6).narrow(1, 4, n).unwrap();
    check_exact::<T>("narrowed", &a_narrow, &b_narrow);
    // Batches.
    let a3 = ints(&[b, m, k], 7);
    let b3 = ints(&[b, k, n], 8);
    check_exact::<T>("batched", &a3, &b3);
    let a3_t = ints(&[b, k, m], 9).transpose(1, 2).unwrap();
    let b3_t = ints(&[b, n, k], 10).transpose(1, 2).unwrap();
    check_exact::<T>("batched, both transposed", &a3_t, &b3_t);
    // Batch as the middle dimension in memory: rows b*k apart, batches k apart.
    let a_mid = ints(&[m, b, k], 11).transpose(0, 1).unwrap();
    check_exact::<T>("batch in the middle", &a_mid, &b3);
    // One matrix expanded to every batch (batch stride 0).
    let a_one = ints(&[1, m, k], 12).expand(&[b, m, k]).unwrap();
    check_exact::<T>("expanded batch", &a_one, &b3);
    // Batch dimensions no single stride can step: copied first.
    let a4_swapped = ints(&[3, 2, m, k], 13).transpose(0, 1).unwrap();
    check_exact::<T>(
        "4-D, swapped batches",
        &a4_swapped,
        &ints(&[2, 3, k, n], 14),
    );
    // A row expanded to a matrix (row stride 0): copied first.
    let a_rows = ints(&[1, k], 15).expand(&[m, k]).unwrap();
    check_exact::<T>("expanded rows", &a_rows, &bm);
    // One weight for every batch: folded into one tall product, or batched with a
    // weight stride of 0 when A's batches do not follow one another.
    check_exact::<T>("shared weight", &a3, &bm);
    check_exact::<T>("shared weight, 4-D", &ints(&[2, 3, m, k], 16), &bm);
    check_exact::<T>("shared weight, A transposed", &a3_t, &bm);
    check_exact::<T>("shared weight, B transposed", &a3, &b_t);
    check_exact::<T>("shared weight, batch in the middle", &a_mid, &bm);
}

#[test]
fn every_layout_gives_the_exact_product_of_small_integers() {
    let _serial = serial();
    let d = test_device();
    layouts::<f32>(&d);
    layouts::<f16>(&d);
    layouts::<bf16>(&d);
}

#[test]
fn tf32_is_off_by_default_and_rounds_inputs_when_allowed() {
    let _serial = serial();
    let d = test_device();
    // 1 + 2^-12 is exact in f32 and every partial sum of n of them is too; TF32 keeps
    // 10 bits of mantissa, so there it is 1. Large enough a product for cuBLAS to pick
    // a tensor-core kernel when TF32 is allowed (as it does for any size on Ampere and
    // later, unless NVIDIA_TF32_OVERRIDE=0 forbids TF32 process-wide).
    let n = 512;
    let x = 1.0 + 1.0 / 4096.0;
    let a = Tensor::full(&[n, n], x, &d).unwrap();
    let b = Tensor::full(&[n, n], 1.0f32, &d).unwrap();
    let exact = n as f32 * x;
    let plain = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
    assert!(
        plain.iter().all(|&v| v == exact),
        "TF32 was used without being allowed"
    );
    let tf32 = MatmulOptions { allow_tf32: true };
    let fast = a.matmul_with(&b, tf32).unwrap().to_vec::<f32>().unwrap();
    let tensor_cores = match d.properties().unwrap().compute_capability {
        (0, 0) => true, // the simulator rounds as tensor cores do
        (major, _) => major >= 8,
    };
    if tensor_cores {
        assert!(
            fast.iter().all(|&v| v == n as f32),
            "allowing TF32 did not round the inputs: {} (exact {exact})",
            fast[0]
        );
    } else {
        assert!(fast.iter().all(|&v| v == exact));
    }
    // Random inputs: within TF32's tolerance; the half types ignore the option.
    let r = |seed, shape: &[usize]| tensor(&random::<f32>(shape.iter().product(), seed), shape, &d);
    check_product::<f32>("TF32", &r(1, &[65, 33]), &r(2, &[33, 17]), tf32);
    check_product::<f32>(
        "TF32, batched",
        &r(3, &[3, 64, 64]),
        &r(4, &[3, 64, 64]),
        tf32,
    );
    let h =
        |seed, shape: &[usize]| tensor(&random::<bf16>(shape.iter().product(), seed), shape, &d);
    let (ha, hb) = (h(5, &[9, 8]), h(6, &[8, 7]));
    assert_eq!(
        ha.matmul_with(&hb, tf32).unwrap().to_vec::<bf16>().unwrap(),
        ha.matmul(&hb).unwrap().to_vec::<bf16>().unwrap()
    );
}

#[test]
fn the_gemm_launch_scales_accumulates_and_leaves_padding_alone() {
    let _serial = serial();
    let d = test_device();
    // Two batches of [2, 3] @ [3, 2] into C with rows of 4 (2 of padding) and batches
    // 10 apart: C = 2 A B + 0.5 C.
    let (m, k, n, batch, ldc, stride_c) = (2, 3, 2, 2, 4, 10);
    let a: Vec<f32> = (0..12).map(|i| (i % 5) as f32 - 2.0).collect();
    let b: Vec<f32> = (0..12).map(|i| (i % 3) as f32 - 1.0).collect();
    let c0: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let (ta, tb) = (tensor(&a, &[12], &d), tensor(&b, &[12], &d));
    let tc = tensor(&c0, &[20], &d);
    let gemm = Gemm {
        dtype: DType::F32,
        m,
        n,
        k,
        batch,
        a: Operand::dense(ta.ptr(), m, k),
        b: Operand::dense(tb.ptr(), k, n),
        c: tc.ptr(),
        c_dtype: DType::F32,
        ldc,
        stride_c,
        alpha: 2.0,
        beta: 0.5,
        allow_tf32: false,
        bias: None,
    };
    d.launch(&Kernel::Gemm(gemm)).unwrap();
    let got = tc.to_vec::<f32>().unwrap();
    let mut expected = c0.clone();
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let dot: f32 = (0..k)
                    .map(|p| a[t * m * k + i * k + p] * b[t * k * n + p * n + j])
                    .sum();
                let at = t * stride_c + i * ldc + j;
                expected[at] = 2.0 * dot + 0.5 * c0[at];
            }
        }
    }
    assert_eq!(got, expected);

    // beta = 0 ignores what C held, NaNs included.
    let nan = tensor(&[f32::NAN; 4], &[2, 2], &d);
    d.launch(&Kernel::Gemm(Gemm::dense(
        DType::F32,
        2,
        2,
        3,
        [ta.ptr(), tb.ptr(), nan.ptr()],
    )))
    .unwrap();
    assert!(nan.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));

    // A leading dimension shorter than a row is refused before anything runs.
    let short = Gemm {
        a: Operand { ld: 2, ..gemm.a },
        ..gemm
    };
    assert!(matches!(
        d.launch(&Kernel::Gemm(short)),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn empty_products_are_empty_or_zero() {
    let _serial = serial();
    let d = test_device();
    let e = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    let b = Tensor::full(&[3, 4], 1.0f32, &d).unwrap();
    assert_eq!(e.matmul(&b).unwrap().shape(), [0, 4]);
    // k = 0: a sum of nothing.
    let a = Tensor::full(&[2, 0], 1.0f32, &d).unwrap();
    let z = Tensor::full(&[0, 3], 1.0f32, &d).unwrap();
    let out = a.matmul(&z).unwrap();
    assert_eq!(out.shape(), [2, 3]);
    assert_eq!(out.to_vec::<f32>().unwrap(), [0.0; 6]);
    let batch0 = Tensor::zeros(&[0, 2, 3], DType::BF16, &d).unwrap();
    let w = Tensor::zeros(&[3, 5], DType::BF16, &d).unwrap();
    assert_eq!(batch0.matmul(&w).unwrap().shape(), [0, 2, 5]);
}

#[test]
fn bad_shapes_dtypes_and_devices_are_clear_errors() {
    let _serial = serial();
    let d = test_device();
    let f = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &d).unwrap();
    let message = |r: Result<Tensor, Error>| r.unwrap_err().to_string();

    let inner = f(&[2, 3]).matmul(&f(&[4, 5]));
    assert!(matches!(inner, Err(Error::Shape { .. })));
    let text = message(inner);
    assert!(text.contains("[2, 3]") && text.contains("[4, 5]"), "{text}");
    let batches = message(f(&[2, 3, 4]).matmul(&f(&[3, 4, 5])));
    assert!(
        batches.contains("[2, 3, 4]") && batches.contains("[3, 4, 5]"),
        "{batches}"
    );
    for (a, b) in [
        (&[3][..], &[3, 2][..]),
        (&[2, 3], &[2, 3, 4]),
        (&[2, 2, 3], &[1, 3]),
    ] {
        let text = message(f(a).matmul(&f(b)));
        assert!(
            text.contains(&format!("{a:?}")) && text.contains(&format!("{b:?}")),
            "{text}"
        );
    }

    let half = Tensor::zeros(&[3, 2], DType::F16, &d).unwrap();
    let mixed = f(&[2, 3]).matmul(&half);
    assert!(matches!(mixed, Err(Error::DTypeMismatch { .. })));
    let text = message(mixed);
    assert!(
        text.contains("float32") && text.contains("float16"),
        "{text}"
    );
    let ints = Tensor::full(&[2, 2], 1i32, &d).unwrap();
    assert!(matches!(ints.matmul(&ints), Err(Error::DType { .. })));

    let host = Tensor::zeros(&[3, 2], DType::F32, &Device::cpu()).unwrap();
    assert!(matches!(
        f(&[2, 3]).matmul(&host),
        Err(Error::DeviceMismatch { .. })
    ));
}

#[test]
fn transposed_operands_are_not_copied_and_nothing_leaks() {
    let _serial = serial();
    let d = test_device();
    let allocator = d.allocator().unwrap();
    d.synchronize().unwrap();
    let start = allocator.memory_allocated();
    {
        let a = tensor(&random::<bf16>(64 * 32, 1), &[2, 32, 32], &d)
            .transpose(1, 2)
            .unwrap();
        let b = tensor(&random::<bf16>(32 * 16, 2), &[16, 32], &d)
            .transpose(0, 1)
            .unwrap();
        let inputs = allocator.memory_allocated();
        allocator.reset_peak_stats();
        let out = a.matmul(&b).unwrap();
        assert_eq!(
            allocator.max_memory_allocated() - inputs,
            out.allocation().size(),
            "a transposed operand was copied"
        );
        // Rows expanded from one (stride 0) must be copied: the copy shows in the peak,
        // and is gone after.
        let rows = tensor(&random::<f32>(32, 3), &[1, 32], &d)
            .expand(&[8, 32])
            .unwrap();
        let w = tensor(&random::<f32>(32 * 4, 4), &[32, 4], &d);
        let before = allocator.memory_allocated();
        allocator.reset_peak_stats();
        let out2 = rows.matmul(&w).unwrap();
        assert!(allocator.max_memory_allocated() - before > out2.allocation().size());
        assert_eq!(
            allocator.memory_allocated() - before,
            out2.allocation().size()
        );
        // Failures allocate nothing that stays.
        assert!(a.matmul(&w).is_err());
        assert!(rows.matmul(&b).is_err());
        d.synchronize().unwrap();
    }
    assert_eq!(allocator.memory_allocated(), start, "matmul leaked memory");
}
