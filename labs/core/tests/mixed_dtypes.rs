//! Binary ops on float operands of two different dtypes (`f32 + bf16`), each read in its
//! own dtype by one kernel into float32, as PyTorch's TensorIterator does on CUDA: no
//! cast kernel, no float32 copy of the narrower operand, and the bits of casting
//! first. Dense, row-broadcast and strided operands, both orders, every pair of float
//! dtypes; the backward gives each operand its gradient in its own dtype. On the
//! simulated GPU by default, on the GPU with `LABS_DEVICE=cuda`.

use half::{bf16, f16};
use labs_core::kernels::BinaryOp;
use labs_core::testing::{launch_count as count, launches, serial, test_device};
use labs_core::{DType, Device, Tensor};

mod gradcheck;

use gradcheck::values;

const PAIRS: [(DType, DType); 6] = [
    (DType::F32, DType::BF16),
    (DType::BF16, DType::F32),
    (DType::F32, DType::F16),
    (DType::F16, DType::F32),
    (DType::F16, DType::BF16),
    (DType::BF16, DType::F16),
];

const OPS: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::Pow,
];

fn tensor(data: &[f32], shape: &[usize], dtype: DType, d: &Device) -> Tensor {
    Tensor::from_slice(data, shape, d)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    assert_eq!(t.dtype(), DType::F32);
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// `op(a, b)` in one mixed kernel of the expected form and no cast, with the bits of
/// `op(a.to(float32), b.to(float32))`.
fn same_bits_as_casting_first(d: &Device, op: BinaryOp, a: &Tensor, b: &Tensor, form: &str) {
    let name = format!(
        "{} {} {:?} {} {:?} {form}",
        op.name(),
        a.dtype(),
        a.shape(),
        b.dtype(),
        b.shape()
    );
    let (mixed, seen) = launches(d, || a.binary(op, b).unwrap());
    let label = format!("MixedBinary {op:?} {:?} {:?}{form}", a.dtype(), b.dtype());
    let exact: u64 = (seen.iter())
        .filter(|l| l.label == label)
        .map(|l| l.launches)
        .sum();
    assert_eq!(exact, 1, "{name}: {seen:?}");
    assert_eq!(seen.len(), 1, "{name}: one launch, no cast: {seen:?}");
    assert_eq!(mixed.dtype(), DType::F32, "{name}");
    let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let cast_first = wide(a).binary(op, &wide(b)).unwrap();
    assert_eq!(mixed.shape(), cast_first.shape(), "{name}");
    assert_eq!(bits(&mixed), bits(&cast_first), "{name}");
}

/// Operands for `op`: a positive base for `pow`, a divisor away from zero.
fn data(op: BinaryOp, n: usize, seed: u64, second: bool) -> Vec<f32> {
    match (op, second) {
        (BinaryOp::Pow, false) => values(n, seed, 0.25, 3.0),
        (BinaryOp::Pow, true) => values(n, seed, -2.0, 2.0),
        (BinaryOp::Div, true) => values(n, seed, 0.5, 2.0),
        _ => values(n, seed, -3.0, 3.0),
    }
}

#[test]
fn dense_operands_of_two_dtypes_give_the_bits_of_casting_first_in_one_kernel() {
    let _serial = serial();
    let d = test_device();
    for (da, db) in PAIRS {
        for op in OPS {
            // 48 elements: whole groups of four on the GPU; 37, one element into their
            // storage: misaligned, element by element, with a tail.
            let a = tensor(&data(op, 48, 1, false), &[4, 12], da, &d);
            let b = tensor(&data(op, 48, 2, true), &[4, 12], db, &d);
            same_bits_as_casting_first(&d, op, &a, &b, "");
            let a = tensor(&data(op, 38, 3, false), &[38], da, &d)
                .narrow(0, 1, 37)
                .unwrap();
            let b = tensor(&data(op, 37, 4, true), &[37], db, &d);
            same_bits_as_casting_first(&d, op, &a, &b, "");
        }
    }
}

#[test]
fn a_broadcast_row_of_another_dtype_runs_the_row_kernel_in_either_order() {
    let _serial = serial();
    let d = test_device();
    for (da, db) in PAIRS {
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            // 16 columns: groups of four; 5: element by element.
            for cols in [16, 5] {
                let full = tensor(&data(op, 6 * cols, 5, false), &[2, 3, cols], da, &d);
                let row = tensor(&data(op, cols, 6, true), &[cols], db, &d);
                same_bits_as_casting_first(&d, op, &full, &row, " rows");
                let full = tensor(&data(op, 6 * cols, 7, true), &[2, 3, cols], db, &d);
                let row = tensor(&data(op, cols, 8, false), &[1, cols], da, &d);
                same_bits_as_casting_first(&d, op, &row, &full, " rows");
            }
        }
    }
}

#[test]
fn strided_and_broadcast_operands_of_two_dtypes_run_the_strided_kernel() {
    let _serial = serial();
    let d = test_device();
    for (da, db) in PAIRS {
        for op in [
            BinaryOp::Add,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
        ] {
            // A transposed operand, and a column broadcast over rows.
            let a = tensor(&data(op, 30, 9, false), &[5, 6], da, &d)
                .transpose(0, 1)
                .unwrap();
            let b = tensor(&data(op, 30, 10, true), &[6, 5], db, &d);
            same_bits_as_casting_first(&d, op, &a, &b, " strided");
            let col = tensor(&data(op, 6, 11, true), &[6, 1], db, &d);
            same_bits_as_casting_first(&d, op, &b.to_dtype(da).unwrap(), &col, " strided");
        }
    }
}

#[test]
fn results_match_float32_arithmetic_on_the_host() {
    let _serial = serial();
    let d = test_device();
    let (x, y) = (values(64, 12, -3.0, 3.0), values(64, 13, 0.5, 2.0));
    let a = Tensor::from_slice(&x, &[64], &d).unwrap();
    let yb: Vec<bf16> = y.iter().map(|&v| bf16::from_f32(v)).collect();
    let yh: Vec<f16> = y.iter().map(|&v| f16::from_f32(v)).collect();
    let b16 = Tensor::from_slice(&yb, &[64], &d).unwrap();
    let h16 = Tensor::from_slice(&yh, &[64], &d).unwrap();
    type Host = fn(f32, f32) -> f32;
    let ops: [(BinaryOp, Host); 4] = [
        (BinaryOp::Add, |p, q| p + q),
        (BinaryOp::Sub, |p, q| p - q),
        (BinaryOp::Mul, |p, q| p * q),
        (BinaryOp::Div, |p, q| p / q),
    ];
    for (op, host) in ops {
        let got = a.binary(op, &b16).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = (0..64).map(|i| host(x[i], yb[i].to_f32())).collect();
        assert_eq!(got, want, "{} f32 bf16", op.name());
        let got = h16.binary(op, &a).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = (0..64).map(|i| host(yh[i].to_f32(), x[i])).collect();
        assert_eq!(got, want, "{} f16 f32", op.name());
    }
    // A half tensor with a zero-dimensional float32 one stays half (torch.result_type):
    // the scalar is cast, one element, and the half kernel runs.
    let scalar = Tensor::from_slice(&[2.0f32], &[], &d).unwrap();
    let (half, seen) = launches(&d, || b16.mul(&scalar).unwrap());
    assert_eq!(half.dtype(), DType::BF16);
    assert_eq!(count(&seen, "MixedBinary"), 0, "{seen:?}");
}

/// Gradients of `sum(w * op(a, b))` for leaves `a` and `b` (`b` narrower when `cast`
/// is false, else `b` a float32 leaf cast inside the graph): the old path and the new
/// must agree bit for bit.
fn grads(
    op: BinaryOp,
    b_shape: &[usize],
    b_dtype: DType,
    cast: bool,
    d: &Device,
) -> (Tensor, Tensor) {
    let x = values(32, 20, -2.0, 2.0);
    let nb: usize = b_shape.iter().product();
    let y = values(nb, 21, 0.5, 2.0);
    let w = Tensor::from_slice(&values(32, 22, -1.0, 1.0), &[4, 8], d).unwrap();
    let a = Tensor::from_slice(&x, &[4, 8], d)
        .unwrap()
        .requires_grad_(true);
    let b_narrow = tensor(&y, b_shape, b_dtype, d);
    let b = if cast {
        b_narrow.to_dtype(DType::F32).unwrap().requires_grad_(true)
    } else {
        b_narrow.requires_grad_(true)
    };
    let operand = if cast {
        b.to_dtype(b_dtype).unwrap().to_dtype(DType::F32).unwrap()
    } else {
        b.clone()
    };
    let out = a.binary(op, &operand).unwrap();
    assert_eq!(out.dtype(), DType::F32);
    out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    (a.grad().unwrap(), b.grad().unwrap())
}

#[test]
fn backward_gives_each_operand_its_gradient_in_its_own_dtype_with_the_cast_paths_bits() {
    let _serial = serial();
    let d = test_device();
    for b_dtype in [DType::BF16, DType::F16] {
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            for b_shape in [&[4, 8][..], &[8]] {
                let name = format!("{} f32 {b_dtype} {b_shape:?}", op.name());
                let (ga, gb) = grads(op, b_shape, b_dtype, false, &d);
                assert_eq!(
                    (ga.dtype(), ga.shape()),
                    (DType::F32, &[4, 8][..]),
                    "{name}"
                );
                assert_eq!((gb.dtype(), gb.shape()), (b_dtype, b_shape), "{name}");
                // The same graph made of a cast node and a float32 op.
                let (ca, cb) = grads(op, b_shape, b_dtype, true, &d);
                assert_eq!(bits(&ga), bits(&ca), "{name}: d/da");
                assert_eq!(
                    bits(&gb.to_dtype(DType::F32).unwrap()),
                    bits(&cb),
                    "{name}: d/db"
                );
            }
        }
    }
}

#[test]
fn mul_and_div_gradients_are_the_float32_arithmetic_of_their_formulas() {
    let _serial = serial();
    let d = test_device();
    let (x, w) = (values(16, 30, -2.0, 2.0), values(16, 31, -1.0, 1.0));
    let y: Vec<bf16> = values(16, 32, 0.5, 2.0)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let yf: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    for op in [BinaryOp::Mul, BinaryOp::Div] {
        let a = Tensor::from_slice(&x, &[16], &d)
            .unwrap()
            .requires_grad_(true);
        let b = Tensor::from_slice(&y, &[16], &d)
            .unwrap()
            .requires_grad_(true);
        let out = b.binary(op, &a).unwrap();
        assert_eq!(
            out.grad_fn().unwrap().op.name(),
            format!(
                "{}Backward",
                if op == BinaryOp::Mul { "Mul" } else { "Div" }
            )
        );
        let wt = Tensor::from_slice(&w, &[16], &d).unwrap();
        out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let (gb, ga) = (b.grad().unwrap(), a.grad().unwrap());
        assert_eq!(gb.dtype(), DType::BF16);
        // out = b op a, g = w: for mul, d/db = g a and d/da = g b; for div, d/db = g / a
        // and d/da = -((g / a) * b) / a.
        let (want_b, want_a): (Vec<f32>, Vec<f32>) = (0..16)
            .map(|i| match op {
                BinaryOp::Mul => (w[i] * x[i], w[i] * yf[i]),
                _ => {
                    let q = w[i] / x[i];
                    (q, -((q * yf[i]) / x[i]))
                }
            })
            .unzip();
        let want_b: Vec<bf16> = want_b.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(gb.to_vec::<bf16>().unwrap(), want_b, "{}: d/db", op.name());
        assert_eq!(ga.to_vec::<f32>().unwrap(), want_a, "{}: d/da", op.name());
    }
}

/// Allocated bytes over the forward and backward of `a + b` (float32 and bfloat16
/// `[rows, cols]` leaves): the peak above the baseline, and what is left after.
fn residual_add_memory(d: &Device, rows: usize, cols: usize) -> (u64, u64) {
    let alloc = d.allocator().unwrap();
    let a = Tensor::zeros(&[rows, cols], DType::F32, d)
        .unwrap()
        .requires_grad_(true);
    let b = Tensor::zeros(&[rows, cols], DType::BF16, d)
        .unwrap()
        .requires_grad_(true);
    d.synchronize().unwrap();
    let base = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    let out = a.add(&b).unwrap();
    let forward_peak = alloc.max_memory_allocated() - base;
    out.sum_all().unwrap().backward().unwrap();
    drop(out);
    d.synchronize().unwrap();
    let after = alloc.memory_allocated() - base;
    assert_eq!(b.grad().unwrap().dtype(), DType::BF16);
    (forward_peak, after)
}

#[test]
fn a_mixed_add_allocates_only_its_output_and_the_dry_run_predicts_it() {
    let _serial = serial();
    let d = test_device();
    let (rows, cols) = (64, 256);
    let (forward_peak, after) = residual_add_memory(&d, rows, cols);
    // The float32 output alone: no float32 copy of the bfloat16 operand.
    assert_eq!(forward_peak, (rows * cols * 4) as u64);
    // The two gradients remain, each in its leaf's dtype.
    assert_eq!(after, (rows * cols * (4 + 2)) as u64);
    let dry = Device::new_dry(1 << 30);
    assert_eq!(residual_add_memory(&dry, rows, cols), (forward_peak, after));
}

#[test]
fn the_float32_operands_gradient_matches_finite_differences() {
    let _serial = serial();
    let d = test_device();
    // A bfloat16 operand that needs no gradient, as a row and as a full tensor; the
    // float32 leaf full, then a row summed back over the rows.
    let row = tensor(&values(8, 40, 0.5, 2.0), &[8], DType::BF16, &d);
    let full = tensor(&values(32, 41, 0.5, 2.0), &[4, 8], DType::BF16, &d);
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
        let name = format!("{} f32 [4, 8] bf16 [8]", op.name());
        let input = (values(32, 42, -2.0, 2.0), vec![4, 8]);
        gradcheck::check_gradients(&name, &[input], |ts| ts[0].binary(op, &row).unwrap());
        let name = format!("{} bf16 [4, 8] f32 [8]", op.name());
        let input = (values(8, 43, 0.5, 2.0), vec![8]);
        gradcheck::check_gradients(&name, &[input], |ts| full.binary(op, &ts[0]).unwrap());
    }
}
