//! Gradients of the pointwise ops (rsqrt, pow, gelu, abs, clamp, maximum, minimum,
//! where, masked_fill, casts) and of broadcast operands, against central finite
//! differences, as `tests/autograd.rs` checks the others. Runs on the simulated GPU by
//! default and on the GPU with `LABS_DEVICE=cuda`.

use labs_core::testing::{serial, test_device};
use labs_core::{DType, Tensor};

mod gradcheck;

use gradcheck::{check_gradients, values};

fn input(shape: &[usize], seed: u64, lo: f32, hi: f32) -> (Vec<f32>, Vec<usize>) {
    let n = shape.iter().product();
    (values(n, seed, lo, hi), shape.to_vec())
}

/// Values at least `gap` away from each of `points` (where a derivative jumps).
fn away_from(mut x: (Vec<f32>, Vec<usize>), points: &[f32], gap: f32) -> (Vec<f32>, Vec<usize>) {
    for v in &mut x.0 {
        for &p in points {
            if (*v - p).abs() < gap {
                *v = p + if *v >= p { gap } else { -gap };
            }
        }
    }
    x
}

#[test]
fn new_unary_ops_match_finite_differences() {
    let _serial = serial();
    let any = || input(&[3, 4], 11, -2.5, 2.5);
    let positive = || input(&[3, 4], 12, 0.5, 3.0);
    check_gradients("rsqrt", &[positive()], |t| t[0].rsqrt().unwrap());
    check_gradients("abs", &[away_from(any(), &[0.0], 0.05)], |t| {
        t[0].abs().unwrap()
    });
    check_gradients("pow_scalar 3", &[any()], |t| t[0].pow_scalar(3).unwrap());
    check_gradients("pow_scalar -0.5", &[positive()], |t| {
        t[0].pow_scalar(-0.5).unwrap()
    });
    check_gradients("gelu none", &[any()], |t| t[0].gelu("none").unwrap());
    check_gradients("gelu tanh", &[any()], |t| t[0].gelu("tanh").unwrap());
    let bounded = || away_from(any(), &[-1.0, 0.5], 0.05);
    check_gradients("clamp", &[bounded()], |t| {
        t[0].clamp(Some((-1.0).into()), Some(0.5.into())).unwrap()
    });
    check_gradients("clamp_min", &[bounded()], |t| t[0].clamp_min(-1.0).unwrap());
    // Scalar forms: the scalar is a zero-dimensional operand that needs no gradient.
    check_gradients("add_scalar", &[any()], |t| t[0].add_scalar(1.5).unwrap());
    check_gradients("sub_scalar", &[any()], |t| t[0].sub_scalar(2).unwrap());
    check_gradients("mul_scalar", &[any()], |t| t[0].mul_scalar(-0.75).unwrap());
    check_gradients("div_scalar", &[any()], |t| t[0].div_scalar(4.0).unwrap());
}

#[test]
fn binary_ops_match_finite_differences_through_broadcasting() {
    let _serial = serial();
    let col = || input(&[3, 1], 13, -2.0, 2.0);
    let row = || input(&[4], 14, -2.0, 2.0);
    check_gradients("[3,1] + [4]", &[col(), row()], |t| t[0].add(&t[1]).unwrap());
    check_gradients("[3,1] - [4]", &[col(), row()], |t| t[0].sub(&t[1]).unwrap());
    check_gradients("[3,1] * [4]", &[col(), row()], |t| t[0].mul(&t[1]).unwrap());
    let away = || input(&[4], 15, 0.5, 2.0);
    check_gradients("[3,1] / [4]", &[col(), away()], |t| {
        t[0].div(&t[1]).unwrap()
    });
    let cube = || input(&[2, 3, 4], 16, -2.0, 2.0);
    check_gradients("[2,3,4] * [3,1]", &[cube(), col()], |t| {
        t[0].mul(&t[1]).unwrap()
    });
    let scalar = || input(&[], 17, 0.5, 1.5);
    check_gradients("[] * [2,3,4]", &[scalar(), cube()], |t| {
        t[0].mul(&t[1]).unwrap()
    });
    let base = || input(&[3, 1], 18, 0.5, 2.0);
    check_gradients("pow [3,1] ^ [4]", &[base(), row()], |t| {
        t[0].pow(&t[1]).unwrap()
    });
    // maximum and minimum away from ties (values from distinct ranges interleave).
    let a = || input(&[3, 4], 19, -2.0, 2.0);
    let b = || away_from(input(&[4], 20, -2.0, 2.0), &values(12, 19, -2.0, 2.0), 0.03);
    check_gradients("maximum", &[a(), b()], |t| t[0].maximum(&t[1]).unwrap());
    check_gradients("minimum", &[a(), b()], |t| t[0].minimum(&t[1]).unwrap());
}

#[test]
fn maximum_splits_the_gradient_on_ties_as_pytorch() {
    let _serial = serial();
    let d = test_device();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d)
        .unwrap()
        .requires_grad_(true);
    let b = Tensor::from_slice(&[2.0f32, 2.0, 1.0], &[3], &d)
        .unwrap()
        .requires_grad_(true);
    a.maximum(&b)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), [0.0, 0.5, 1.0]);
    assert_eq!(b.grad().unwrap().to_vec::<f32>().unwrap(), [1.0, 0.5, 0.0]);
}

#[test]
fn where_and_masked_fill_send_the_gradient_to_the_selected_side() {
    let _serial = serial();
    let d = test_device();
    let cond_data = [1u8, 0, 0, 1];
    let x = || input(&[3, 4], 21, -2.0, 2.0);
    let y = || input(&[4], 22, -2.0, 2.0);
    check_gradients("where [4] ? [3,4] : [4]", &[x(), y()], |t| {
        let cond = Tensor::from_slice(&cond_data, &[4], t[0].device()).unwrap();
        Tensor::where_(&cond, &t[0], &t[1]).unwrap()
    });
    check_gradients("masked_fill", &[x()], |t| {
        let mask = Tensor::from_slice(&cond_data, &[4], t[0].device()).unwrap();
        t[0].masked_fill(&mask, 3.0).unwrap()
    });
    // Exactly: where cond is 1, x's gradient is 0 and y's collects the ones.
    let xs = Tensor::full(&[2, 4], 1.0f32, &d)
        .unwrap()
        .requires_grad_(true);
    let ys = Tensor::full(&[4], 1.0f32, &d).unwrap().requires_grad_(true);
    let cond = Tensor::from_slice(&cond_data, &[4], &d).unwrap();
    let out = Tensor::where_(&cond, &ys, &xs).unwrap();
    out.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        ys.grad().unwrap().to_vec::<f32>().unwrap(),
        [2.0, 0.0, 0.0, 2.0]
    );
    assert_eq!(
        xs.grad().unwrap().to_vec::<f32>().unwrap(),
        [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    );
}

#[test]
fn a_float_cast_passes_the_gradient_cast_back() {
    let _serial = serial();
    let d = test_device();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d)
        .unwrap()
        .requires_grad_(true);
    let w = [0.1f32, 1.0 + 1.0 / 256.0, -7.3];
    let wt = Tensor::from_slice(&w, &[3], &d).unwrap();
    let y = x.to_dtype(DType::BF16).unwrap();
    assert_eq!(y.grad_fn().unwrap().op.name(), "ToCopyBackward");
    let loss = y
        .to_dtype(DType::F32)
        .unwrap()
        .mul(&wt)
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), DType::F32);
    // The gradient went through bfloat16 on its way back.
    let want: Vec<f32> = w
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    assert_eq!(g.to_vec::<f32>().unwrap(), want);
    // An integer cast ends the graph.
    assert!(!x.to_dtype(DType::I32).unwrap().requires_grad());
    // A float-only op on an integer tensor needs no gradient either.
    let i = Tensor::full(&[2], 3i32, &d).unwrap();
    assert!(!i.exp().unwrap().requires_grad());
}
