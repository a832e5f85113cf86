//! The dense kernel of a row broadcast over a matrix (`[rows, n] + [n]`, a bias):
//! `BinaryRows` runs it in place of the strided kernel, with the same bits. On the
//! simulated GPU by default, on the GPU with `LABS_DEVICE=cuda`, where both the
//! whole-vector path (16 columns, aligned) and the element-by-element one run.

use labs_core::kernels::{BinaryOp, Kernel, Strided};
use labs_core::testing::{launch_count as count, launches, serial, test_device};
use labs_core::{DType, Device, Tensor};

mod gradcheck;

use gradcheck::values;

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

/// `op(full, row)` (or `op(row, full)`) through the tensor layer, and through the
/// strided kernel launched directly with the row's stride 0: the same bits.
fn row_broadcast_case(d: &Device, dtype: DType, op: BinaryOp, cols: usize, row_first: bool) {
    let rows = 7;
    let n = rows * cols;
    let full = tensor(&values(n, 40, -2.0, 2.0), &[rows, cols], dtype, d);
    // Except for 16 columns, the row starts one element into its storage: not 16-byte
    // aligned, so the GPU kernel's element-by-element path runs (with 16 columns, the
    // whole-vector path).
    let offset = usize::from(cols != 16);
    let storage = tensor(&values(cols + 1, 41, 0.5, 2.0), &[cols + 1], dtype, d);
    let row = storage.narrow(0, offset, cols).unwrap();
    assert!(row.is_contiguous());
    let (a, b) = if row_first {
        (&row, &full)
    } else {
        (&full, &row)
    };
    let (fast, seen) = launches(d, || a.binary(op, b).unwrap());
    let name = format!("{dtype} {} cols={cols} row_first={row_first}", op.name());
    assert_eq!(count(&seen, "BinaryRows"), 1, "{name}: {seen:?}");
    assert_eq!(count(&seen, "BinaryStrided"), 0, "{name}: {seen:?}");
    let strided = Tensor::empty(&[rows, cols], dtype, d).unwrap();
    let dense = Strided::new(&[rows, cols], &[cols as isize, 1]).unwrap();
    let repeated = Strided::new(&[rows, cols], &[0, 1]).unwrap();
    let (a_layout, b_layout) = if row_first {
        (repeated, dense)
    } else {
        (dense, repeated)
    };
    d.launch(&Kernel::BinaryStrided {
        op,
        dtype,
        a: a.ptr(),
        a_layout,
        b: b.ptr(),
        b_layout,
        out: strided.ptr(),
        n,
        alpha: 0.0,
    })
    .unwrap();
    // Widening to float32 is exact for every dtype here, so equal widened values are
    // equal bits (no NaN is made).
    assert_eq!(f64s(&fast), f64s(&strided), "{name}");
}

#[test]
fn the_row_broadcast_kernel_matches_the_strided_kernel_bit_for_bit() {
    let _s = serial();
    let d = test_device();
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32] {
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Maximum,
        ] {
            // 16 columns: whole 16-byte vectors for every dtype; 5: none.
            for cols in [16, 8, 5] {
                for row_first in [false, true] {
                    row_broadcast_case(&d, dtype, op, cols, row_first);
                }
            }
        }
    }
    // A batch of matrices plus a row: `[2, 3, n] + [1, n]`.
    let x = tensor(&values(24, 42, -1.0, 1.0), &[2, 3, 4], DType::F32, &d);
    let r = tensor(&values(4, 43, -1.0, 1.0), &[1, 4], DType::F32, &d);
    let (y, seen) = launches(&d, || x.add(&r).unwrap());
    assert_eq!(count(&seen, "BinaryRows Add F32"), 1, "{seen:?}");
    let (xv, rv) = (f64s(&x), f64s(&r));
    let want: Vec<f64> = (0..24)
        .map(|i| (xv[i] as f32 + rv[i % 4] as f32) as f64)
        .collect();
    assert_eq!(f64s(&y), want);
    // A block of trailing dimensions, `[2, 3, 4] - [3, 4]`, and a scalar, `[3, 4] * []`:
    // rows of 12 and of 1.
    let block = tensor(&values(12, 46, -1.0, 1.0), &[3, 4], DType::F32, &d);
    let (y, seen) = launches(&d, || x.sub(&block).unwrap());
    assert_eq!(count(&seen, "BinaryRows Sub F32"), 1, "{seen:?}");
    let bv = f64s(&block);
    let want: Vec<f64> = (0..24)
        .map(|i| (xv[i] as f32 - bv[i % 12] as f32) as f64)
        .collect();
    assert_eq!(f64s(&y), want);
    let (y, seen) = launches(&d, || {
        block.mul(&Tensor::full(&[], 3.0f32, &d).unwrap()).unwrap()
    });
    assert_eq!(count(&seen, "BinaryRows Mul F32"), 1, "{seen:?}");
    let want: Vec<f64> = bv.iter().map(|&v| (v as f32 * 3.0) as f64).collect();
    assert_eq!(f64s(&y), want);
    // A column broadcast is no row: the strided kernel still runs it.
    let col = tensor(&values(6, 44, -1.0, 1.0), &[6, 1], DType::F32, &d);
    let m = tensor(&values(24, 45, -1.0, 1.0), &[6, 4], DType::F32, &d);
    let (_, seen) = launches(&d, || m.add(&col).unwrap());
    assert_eq!(count(&seen, "BinaryStrided"), 1, "{seen:?}");
}
