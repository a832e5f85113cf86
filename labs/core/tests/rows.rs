//! The row ops of a training step against host references computed in float64 and
//! against finite differences: softmax and log_softmax, layer_norm, dropout (its
//! Philox mask checked against the host generator, bit for bit), embedding and
//! index_select, cat and stack, cross_entropy, nll_loss and mse_loss, max and argmax,
//! var; and the memory of a step back to its baseline. Runs on the simulated GPU by
//! default and on the GPU with `LABS_DEVICE=cuda`.

mod gradcheck;

use gradcheck::{check_gradients, values};
use half::{bf16, f16};
use labs_core::kernels::rows::dropout_uniform;
use labs_core::tensor::IGNORE_INDEX;
use labs_core::testing::{assert_close, serial, test_device};
use labs_core::{DType, Device, Error, Tensor};

/// `data` rounded to `dtype` on the device.
fn make(data: &[f32], shape: &[usize], dtype: DType, device: &Device) -> Tensor {
    match dtype {
        DType::F32 => Tensor::from_slice(data, shape, device),
        DType::F16 => {
            let v: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
            Tensor::from_slice(&v, shape, device)
        }
        DType::BF16 => {
            let v: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
            Tensor::from_slice(&v, shape, device)
        }
        other => panic!("no float dtype {other}"),
    }
    .unwrap()
}

/// A float tensor's elements, widened to f32.
fn read(t: &Tensor) -> Vec<f32> {
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        other => panic!("no float dtype {other}"),
    }
}

fn f32s(data: &[f32], shape: &[usize], device: &Device) -> Tensor {
    Tensor::from_slice(data, shape, device).unwrap()
}

fn i64s(data: &[i64], shape: &[usize], device: &Device) -> Tensor {
    Tensor::from_slice(data, shape, device).unwrap()
}

/// The float dtypes and the relative tolerance of each against a float64 reference
/// (float32 computes in float32; the half types round the result to 11 or 8 bits).
const DTYPES: [(DType, f64); 3] = [
    (DType::F32, 2e-6),
    (DType::F16, 2e-3),
    (DType::BF16, 1.6e-2),
];

/// Softmax (or log_softmax) of each row of `x`, in float64.
fn softmax_ref(x: &[f32], cols: usize, log: bool) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            row.iter()
                .map(move |&v| {
                    if log {
                        v as f64 - m - s.ln()
                    } else {
                        (v as f64 - m).exp() / s
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn softmax_and_log_softmax_match_float64_for_every_dtype_and_odd_width() {
    let _serial = serial();
    let device = test_device();
    for (dtype, rel) in DTYPES {
        for cols in [1, 3, 33, 1025] {
            let rows = 3;
            let data = values(rows * cols, cols as u64, -4.0, 4.0);
            let x = make(&data, &[rows, cols], dtype, &device);
            let rounded = read(&x);
            for log in [false, true] {
                let y = if log { x.log_softmax(1) } else { x.softmax(1) }.unwrap();
                assert_eq!(y.dtype(), dtype);
                // log_softmax values near 0 carry the rounding of the inputs' size.
                let abs = if log { rel * 8.0 } else { 1e-7 };
                let name = format!(
                    "{}softmax {dtype} [{rows}, {cols}]",
                    if log { "log_" } else { "" }
                );
                assert_close(
                    &name,
                    &read(&y),
                    &softmax_ref(&rounded, cols, log),
                    rel,
                    abs,
                );
            }
        }
    }
}

#[test]
fn softmax_over_a_middle_dimension_moves_it_last() {
    let _serial = serial();
    let device = test_device();
    let data = values(2 * 5 * 3, 4, -2.0, 2.0);
    let x = f32s(&data, &[2, 5, 3], &device);
    let y = x.softmax(1).unwrap().to_vec::<f32>().unwrap();
    // The reference: transpose to [2, 3, 5], softmax rows, transpose back.
    let at = |a: usize, b: usize, c: usize| data[a * 15 + b * 3 + c];
    let moved: Vec<f32> = (0..2)
        .flat_map(|a| (0..3).flat_map(move |c| (0..5).map(move |b| at(a, b, c))))
        .collect();
    let r = softmax_ref(&moved, 5, false);
    let want: Vec<f64> = (0..2)
        .flat_map(|a| (0..5).flat_map(move |b| (0..3).map(move |c| (a, b, c))))
        .map(|(a, b, c)| r[a * 15 + c * 5 + b])
        .collect();
    assert_close("softmax dim 1 of [2, 5, 3]", &y, &want, 2e-6, 1e-7);
    assert!(matches!(x.softmax(3), Err(Error::InvalidArgument(_))));
}

#[test]
fn softmax_handles_minus_infinity_and_large_logits() {
    let _serial = serial();
    let device = test_device();
    let inf = f32::NEG_INFINITY;
    let x = f32s(&[inf, inf, 2.0, inf, 1e4, -1e4, 1e4, 0.0], &[2, 4], &device);
    let y = x.softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&y[..4], &[0.0, 0.0, 1.0, 0.0]);
    assert_eq!(&y[4..], &[0.5, 0.0, 0.5, 0.0]);
    let l = x.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&l[..4], &[inf, inf, 0.0, inf]);
    assert!(l[4..].iter().all(|v| v.is_finite()), "{l:?}");
    assert!((l[4] + std::f32::consts::LN_2).abs() < 1e-6);
    assert!((l[5] - (-2e4 - std::f32::consts::LN_2)).abs() < 1.0);
}

#[test]
fn softmax_gradients_match_finite_differences() {
    let _serial = serial();
    let a = || (values(24, 6, -2.0, 2.0), vec![2, 3, 4]);
    check_gradients("softmax dim 2", &[a()], |t| t[0].softmax(2).unwrap());
    check_gradients("softmax dim 0", &[a()], |t| t[0].softmax(0).unwrap());
    check_gradients("log_softmax dim 1", &[a()], |t| {
        t[0].log_softmax(1).unwrap()
    });
}

/// layer_norm of each row in float64, with optional weight and bias.
fn layer_norm_ref(
    x: &[f32],
    cols: usize,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            (0..cols)
                .map(|c| {
                    let mut o = (row[c] as f64 - mean) * rstd;
                    if let Some(w) = w {
                        o *= w[c] as f64;
                    }
                    if let Some(b) = b {
                        o += b[c] as f64;
                    }
                    o
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn layer_norm_matches_float64_with_and_without_affine_parameters() {
    let _serial = serial();
    let device = test_device();
    for (dtype, rel) in DTYPES {
        for cols in [1, 3, 33, 1025] {
            let rows = 4;
            let x = make(
                &values(rows * cols, 7, -3.0, 5.0),
                &[rows, cols],
                dtype,
                &device,
            );
            let w = make(&values(cols, 8, 0.5, 1.5), &[cols], dtype, &device);
            let b = make(&values(cols, 9, -1.0, 1.0), &[cols], dtype, &device);
            let (xr, wr, br) = (read(&x), read(&w), read(&b));
            let y = x.layer_norm(&[cols], Some(&w), Some(&b), 1e-5).unwrap();
            let want = layer_norm_ref(&xr, cols, Some(&wr), Some(&br), 1e-5);
            let name = format!("layer_norm {dtype} [{rows}, {cols}]");
            // Outputs near zero keep the rounding of values of size ~3.
            assert_close(&name, &read(&y), &want, rel, 4.0 * rel);
            let y = x.layer_norm(&[cols], None, None, 1e-5).unwrap();
            let want = layer_norm_ref(&xr, cols, None, None, 1e-5);
            assert_close(&format!("{name} plain"), &read(&y), &want, rel, 4.0 * rel);
        }
    }
    // Two normalised dimensions, and shapes that do not fit.
    let x = f32s(&values(24, 3, -1.0, 1.0), &[2, 3, 4], &device);
    let y = x.layer_norm(&[3, 4], None, None, 1e-5).unwrap();
    let want = layer_norm_ref(&x.to_vec::<f32>().unwrap(), 12, None, None, 1e-5);
    assert_close(
        "layer_norm [3, 4]",
        &y.to_vec::<f32>().unwrap(),
        &want,
        1e-5,
        1e-5,
    );
    let err = x.layer_norm(&[3], None, None, 1e-5).unwrap_err();
    assert!(err.to_string().contains("[2, 3, 4]"), "{err}");
    let bad_w = f32s(&[1.0; 3], &[3], &device);
    assert!(x.layer_norm(&[4], Some(&bad_w), None, 1e-5).is_err());
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    let _serial = serial();
    let x = || (values(15, 11, -2.0, 2.0), vec![3, 5]);
    let w = || (values(5, 12, 0.5, 1.5), vec![5]);
    let b = || (values(5, 13, -1.0, 1.0), vec![5]);
    check_gradients("layer_norm affine", &[x(), w(), b()], |t| {
        t[0].layer_norm(&[5], Some(&t[1]), Some(&t[2]), 1e-5)
            .unwrap()
    });
    check_gradients("layer_norm plain", &[x()], |t| {
        t[0].layer_norm(&[5], None, None, 1e-5).unwrap()
    });
    check_gradients(
        "layer_norm weight only, two dims",
        &[
            (values(24, 14, -2.0, 2.0), vec![2, 3, 4]),
            (values(12, 15, 0.5, 1.5), vec![3, 4]),
        ],
        |t| t[0].layer_norm(&[3, 4], Some(&t[1]), None, 1e-5).unwrap(),
    );
}

#[test]
fn dropout_masks_are_the_philox_stream_of_the_device_generator() {
    let _serial = serial();
    let device = test_device();
    let n = 100_000;
    let p = 0.3f32;
    let x = f32s(&vec![1.0; n], &[n], &device);
    device.manual_seed(1234);
    let a = x.dropout(p, true).unwrap().to_vec::<f32>().unwrap();
    let scale = 1.0 / (1.0 - p);
    // Bit for bit the host's Philox4x32-10: element i is kept when the uniform of
    // counter i under seed 1234 is below 1 - p.
    for (i, &v) in a.iter().enumerate() {
        let kept = dropout_uniform(1234, i as u64) < 1.0 - p;
        assert_eq!(v, if kept { scale } else { 0.0 }, "element {i}");
    }
    let dropped = a.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
    // Binomial: the standard deviation of the fraction is ~0.0014.
    assert!((dropped - 0.3).abs() < 0.01, "dropped fraction {dropped}");
    // The offset advanced by n: the next mask is fresh, and counter n onwards.
    let b = x.dropout(p, true).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(a, b);
    let kept = |i: usize| dropout_uniform(1234, (n + i) as u64) < 1.0 - p;
    assert!((0..1000).all(|i| (b[i] != 0.0) == kept(i)));
    // Reseeding replays the first mask.
    device.manual_seed(1234);
    assert_eq!(x.dropout(p, true).unwrap().to_vec::<f32>().unwrap(), a);
}

#[test]
fn dropout_edge_cases_follow_pytorch() {
    let _serial = serial();
    let device = test_device();
    let x = f32s(&values(64, 1, -1.0, 1.0), &[8, 8], &device);
    // p = 0 or not training: the input itself.
    assert!(x.dropout(0.0, true).unwrap().shares_storage(&x));
    assert!(x.dropout(0.5, false).unwrap().shares_storage(&x));
    let zeros = x.dropout(1.0, true).unwrap().to_vec::<f32>().unwrap();
    assert!(zeros.iter().all(|&v| v == 0.0));
    assert!(x.dropout(1.5, true).is_err());
    assert!(x.dropout(-0.1, true).is_err());
    // Half types keep the same mask for the same counters.
    for dtype in [DType::F16, DType::BF16] {
        let h = make(&vec![1.0; 64], &[64], dtype, &device);
        device.manual_seed(5);
        let y = read(&h.dropout(0.5, true).unwrap());
        for (i, &v) in y.iter().enumerate() {
            let kept = dropout_uniform(5, i as u64) < 0.5;
            assert_eq!(v, if kept { 2.0 } else { 0.0 }, "{dtype} element {i}");
        }
    }
}

#[test]
fn dropout_gradient_is_the_mask_times_the_scale() {
    let _serial = serial();
    let device = test_device();
    let x = || (values(40, 21, -2.0, 2.0), vec![5, 8]);
    // The same seed on every evaluation, so finite differences see one mask.
    check_gradients("dropout", &[x()], |t| {
        test_device().manual_seed(77);
        t[0].dropout(0.4, true).unwrap()
    });
    let leaf = f32s(&[1.0; 40], &[40], &device).requires_grad_(true);
    device.manual_seed(3);
    let y = leaf.dropout(0.25, true).unwrap();
    assert_eq!(y.grad_fn().unwrap().op.name(), "NativeDropoutBackward");
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        leaf.grad().unwrap().to_vec::<f32>().unwrap(),
        y.to_vec::<f32>().unwrap()
    );
}

#[test]
fn embedding_gathers_rows_and_accumulates_repeated_indices() {
    let _serial = serial();
    let device = test_device();
    let (vocab, dim) = (5, 3);
    let wdata = values(vocab * dim, 31, -1.0, 1.0);
    let idx = [4i64, 0, 4, 2, 4, 1];
    for (dtype, rel) in DTYPES {
        let w = make(&wdata, &[vocab, dim], dtype, &device).requires_grad_(true);
        let indices = i64s(&idx, &[2, 3], &device);
        let y = Tensor::embedding(&indices, &w).unwrap();
        assert_eq!(y.shape(), &[2, 3, dim]);
        let wr = read(&w);
        let want: Vec<f64> = idx
            .iter()
            .flat_map(|&t| (0..dim).map(move |c| t as usize * dim + c))
            .map(|k| wr[k] as f64)
            .collect();
        assert_close(&format!("embedding {dtype}"), &read(&y), &want, 0.0, 0.0);
        // The gradient of sum(y * g): each row gets the sum of its lookups' g.
        let g = make(&values(18, 32, -1.0, 1.0), &[2, 3, dim], dtype, &device);
        let gr = read(&g);
        y.backward_with(Some(g), false).unwrap();
        let mut want = vec![0f64; vocab * dim];
        for (j, &t) in idx.iter().enumerate() {
            for c in 0..dim {
                want[t as usize * dim + c] += gr[j * dim + c] as f64;
            }
        }
        let dw = w.grad().unwrap();
        assert_eq!((dw.shape(), dw.dtype()), (&[vocab, dim][..], dtype));
        assert_close(
            &format!("embedding grad {dtype}"),
            &read(&dw),
            &want,
            rel,
            rel,
        );
    }
    let w = f32s(&wdata, &[vocab, dim], &device);
    check_gradients("embedding", &[(wdata.clone(), vec![vocab, dim])], |t| {
        Tensor::embedding(&i64s(&idx, &[6], &device), &t[0]).unwrap()
    });
    // Indices must be int64 and in range.
    let as_i32 = Tensor::from_slice(&[0i32], &[1], &device).unwrap();
    assert!(matches!(
        Tensor::embedding(&as_i32, &w),
        Err(Error::DType { .. })
    ));
    let out_of_range = i64s(&[1, 5], &[2], &device);
    let result = Tensor::embedding(&out_of_range, &w);
    if device.is_cuda() {
        // The GPU does not read indices back: the kernel gives a row of zeros.
        let y = result.unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&y[3..], &[0.0; 3]);
    } else {
        let err = result.unwrap_err();
        assert!(
            err.to_string()
                .contains("index 5 is out of bounds for size 5"),
            "{err}"
        );
    }
}

#[test]
fn index_select_picks_entries_of_any_dimension() {
    let _serial = serial();
    let device = test_device();
    let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let x = f32s(&data, &[2, 3, 4], &device);
    let y = x.index_select(1, &i64s(&[2, 0, 2], &[3], &device)).unwrap();
    assert_eq!(y.shape(), &[2, 3, 4]);
    let want: Vec<f32> = [0usize, 1]
        .iter()
        .flat_map(|&a| [2usize, 0, 2].map(move |b| (a, b)))
        .flat_map(|(a, b)| (0..4).map(move |c| (a * 12 + b * 4 + c) as f32))
        .collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    check_gradients(
        "index_select dim 2",
        &[(values(24, 41, -1.0, 1.0), vec![2, 3, 4])],
        |t| {
            t[0].index_select(2, &i64s(&[3, 3, 0], &[3], &test_device()))
                .unwrap()
        },
    );
}

#[test]
fn cat_and_stack_join_along_any_dimension() {
    let _serial = serial();
    let device = test_device();
    let a: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let b: Vec<f32> = (10..14).map(|v| v as f32).collect();
    let ta = f32s(&a, &[2, 3], &device);
    let tb = f32s(&b, &[2, 2], &device);
    let c = Tensor::cat(&[&ta, &tb], 1).unwrap();
    assert_eq!(c.shape(), &[2, 5]);
    assert_eq!(
        c.to_vec::<f32>().unwrap(),
        [0., 1., 2., 10., 11., 3., 4., 5., 12., 13.]
    );
    let c0 = Tensor::cat(&[&ta, &ta.narrow(0, 1, 1).unwrap()], 0).unwrap();
    assert_eq!(
        c0.to_vec::<f32>().unwrap(),
        [0., 1., 2., 3., 4., 5., 3., 4., 5.]
    );
    let s = Tensor::stack(
        &[
            &ta,
            &ta.transpose(0, 1)
                .unwrap()
                .contiguous()
                .unwrap()
                .view(&[2, 3])
                .unwrap(),
        ],
        2,
    )
    .unwrap();
    assert_eq!(s.shape(), &[2, 3, 2]);
    assert_eq!(
        s.to_vec::<f32>().unwrap(),
        [0., 0., 1., 3., 2., 1., 3., 4., 4., 2., 5., 5.]
    );
    let h = make(&a, &[2, 3], DType::F16, &device);
    let hc = Tensor::cat(&[&h, &h], 0).unwrap();
    assert_eq!(read(&hc), [a.clone(), a.clone()].concat());
    // Errors name the shapes.
    let err = Tensor::cat(&[&ta, &tb], 0).unwrap_err();
    assert!(err.to_string().contains("[2, 3] vs [2, 2]"), "{err}");
    let err = Tensor::stack(&[&ta, &tb], 0).unwrap_err();
    assert!(err.to_string().contains("[2, 3] vs [2, 2]"), "{err}");
    assert!(Tensor::cat(&[], 0).is_err());
    assert!(Tensor::cat(&[&ta, &h], 0).is_err());
    check_gradients(
        "cat dim 1",
        &[
            (values(6, 1, -1.0, 1.0), vec![2, 3]),
            (values(4, 2, -1.0, 1.0), vec![2, 2]),
        ],
        |t| Tensor::cat(&[&t[0], &t[1], &t[0]], 1).unwrap(),
    );
    check_gradients(
        "stack dim 0",
        &[
            (values(6, 3, -1.0, 1.0), vec![2, 3]),
            (values(6, 4, -1.0, 1.0), vec![2, 3]),
        ],
        |t| Tensor::stack(&[&t[0], &t[1]], 0).unwrap().exp().unwrap(),
    );
}

/// Mean cross entropy in float64, over rows whose target is not ignored.
fn cross_entropy_ref(x: &[f32], cols: usize, target: &[i64], ignore: i64) -> f64 {
    let lp = softmax_ref(x, cols, true);
    let (mut s, mut k) = (0.0, 0.0);
    for (r, &t) in target.iter().enumerate() {
        if t != ignore {
            s -= lp[r * cols + t as usize];
            k += 1.0;
        }
    }
    s / k
}

#[test]
fn cross_entropy_matches_pytorch_semantics() {
    let _serial = serial();
    let device = test_device();
    let (rows, cols) = (6, 33);
    let data = values(rows * cols, 51, -5.0, 5.0);
    let target = [3i64, IGNORE_INDEX, 0, 32, IGNORE_INDEX, 7];
    for (dtype, rel) in DTYPES {
        let x = make(&data, &[rows, cols], dtype, &device);
        let t = i64s(&target, &[rows], &device);
        let loss = x.cross_entropy(&t, IGNORE_INDEX).unwrap();
        assert_eq!((loss.shape(), loss.dtype()), (&[][..], dtype));
        let want = cross_entropy_ref(&read(&x), cols, &target, IGNORE_INDEX);
        assert_close(
            &format!("cross_entropy {dtype}"),
            &read(&loss),
            &[want],
            4.0 * rel,
            0.0,
        );
    }
    // The gradient is (softmax - onehot) / count, zero on ignored rows.
    let x = f32s(&data, &[rows, cols], &device).requires_grad_(true);
    let t = i64s(&target, &[rows], &device);
    x.cross_entropy(&t, IGNORE_INDEX)
        .unwrap()
        .backward()
        .unwrap();
    let p = softmax_ref(&data, cols, false);
    let want: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            if target[r] == IGNORE_INDEX {
                0.0
            } else {
                (p[i] - (c as i64 == target[r]) as i32 as f64) / 4.0
            }
        })
        .collect();
    assert_close(
        "cross_entropy grad",
        &x.grad().unwrap().to_vec::<f32>().unwrap(),
        &want,
        1e-5,
        1e-7,
    );
    // Another ignore_index, large logits, every row ignored, bad targets.
    let big = f32s(&[1e4, -1e4, 0.0, 1e4], &[2, 2], &device);
    let l = big.cross_entropy(&i64s(&[1, 0], &[2], &device), 5).unwrap();
    // Row 0 loses 2e4 (its target is 2e4 below the max), row 1 loses 1e4.
    assert_eq!(l.to_vec::<f32>().unwrap(), [1.5e4]);
    let l = big.cross_entropy(&i64s(&[5, 5], &[2], &device), 5).unwrap();
    assert!(l.to_vec::<f32>().unwrap()[0].is_nan());
    let err = big
        .cross_entropy(&i64s(&[0], &[1], &device), -100)
        .unwrap_err();
    assert!(err.to_string().contains("[2, 2] vs [1]"), "{err}");
    if !device.is_cuda() {
        let err = big
            .cross_entropy(&i64s(&[0, 2], &[2], &device), -100)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("index 2 is out of bounds for size 2"),
            "{err}"
        );
    }
    check_gradients(
        "cross_entropy",
        &[(values(15, 52, -2.0, 2.0), vec![5, 3])],
        |t| {
            let target = i64s(&[2, 0, -100, 1, 2], &[5], &test_device());
            t[0].cross_entropy(&target, -100)
                .unwrap()
                .reshape(&[1])
                .unwrap()
        },
    );
}

#[test]
fn mse_loss_is_the_mean_squared_difference() {
    let _serial = serial();
    let device = test_device();
    let a = values(12, 61, -1.0, 1.0);
    let b = values(12, 62, -1.0, 1.0);
    let loss = f32s(&a, &[3, 4], &device)
        .mse_loss(&f32s(&b, &[3, 4], &device))
        .unwrap();
    let want = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        / 12.0;
    assert_close(
        "mse_loss",
        &loss.to_vec::<f32>().unwrap(),
        &[want],
        1e-6,
        0.0,
    );
    check_gradients("mse_loss", &[(a, vec![3, 4]), (b, vec![3, 4])], |t| {
        t[0].mse_loss(&t[1]).unwrap().reshape(&[1]).unwrap()
    });
}

#[test]
fn max_and_argmax_take_the_first_of_ties_and_nan_as_largest() {
    let _serial = serial();
    let device = test_device();
    let nan = f32::NAN;
    let data = [1.0, 3.0, 3.0, 0.0, -1.0, -1.0, 2.0, nan, 5.0, nan];
    let x = f32s(&data, &[2, 5], &device);
    let (v, i) = x.max_dim(1, false).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), [1, 2]);
    let v = v.to_vec::<f32>().unwrap();
    assert_eq!(v[0], 3.0);
    assert!(v[1].is_nan());
    let (v, i) = x.max_dim(0, true).unwrap();
    assert_eq!((v.shape(), i.shape()), (&[1, 5][..], &[1, 5][..]));
    assert_eq!(i.to_vec::<i64>().unwrap(), [0, 0, 1, 1, 1]);
    // Ties across lanes of a warp: 1025 equal values, then one larger at the end.
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut row = vec![0.5f32; 1025];
        assert_eq!(
            make(&row, &[1, 1025], dtype, &device)
                .argmax(1, false)
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
            [0]
        );
        row[1024] = 2.0;
        row[40] = 2.0;
        let t = make(&row, &[1025], dtype, &device);
        assert_eq!(t.argmax(0, true).unwrap().to_vec::<i64>().unwrap(), [40]);
        assert_eq!(read(&t.max_dim(0, false).unwrap().0), [2.0]);
    }
    let empty = Tensor::zeros(&[2, 0], DType::F32, &device).unwrap();
    assert!(empty.max_dim(1, false).is_err());
    // Distinct values, spaced wider than the finite-difference step.
    let spaced: Vec<f32> = (0..24).map(|k| ((k * 7) % 24) as f32 * 0.1).collect();
    check_gradients("max dim 1", &[(spaced.clone(), vec![2, 3, 4])], |t| {
        t[0].max_dim(1, false).unwrap().0
    });
    check_gradients("max dim 2 keepdim", &[(spaced, vec![2, 3, 4])], |t| {
        t[0].max_dim(2, true).unwrap().0
    });
}

#[test]
fn var_uses_the_correction_and_matches_finite_differences() {
    let _serial = serial();
    let device = test_device();
    let data = values(24, 71, -2.0, 3.0);
    let x = f32s(&data, &[2, 3, 4], &device);
    for correction in [0usize, 1] {
        let v = x.var_dims(&[0, 2], correction, false).unwrap();
        assert_eq!(v.shape(), &[3]);
        let want: Vec<f64> = (0..3)
            .map(|b| {
                let xs: Vec<f64> = (0..2)
                    .flat_map(|a| (0..4).map(move |c| (a, c)))
                    .map(|(a, c)| data[a * 12 + b * 4 + c] as f64)
                    .collect();
                let m = xs.iter().sum::<f64>() / 8.0;
                xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (8 - correction) as f64
            })
            .collect();
        assert_close("var", &v.to_vec::<f32>().unwrap(), &want, 1e-5, 1e-6);
    }
    // One element, unbiased: 0 / 0, NaN as PyTorch.
    let one = f32s(&[2.0], &[1], &device)
        .var_dims(&[0], 1, false)
        .unwrap();
    assert!(one.to_vec::<f32>().unwrap()[0].is_nan());
    check_gradients("var dims 0,2", &[(data.clone(), vec![2, 3, 4])], |t| {
        t[0].var_dims(&[0, 2], 1, false).unwrap()
    });
    check_gradients("var dim 1 keepdim, biased", &[(data, vec![2, 3, 4])], |t| {
        t[0].var_dims(&[1], 0, true).unwrap()
    });
}

#[test]
fn a_training_step_of_row_ops_returns_memory_to_the_baseline() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let base = alloc.memory_allocated();
    {
        let table = f32s(&values(10 * 8, 81, -1.0, 1.0), &[10, 8], &device).requires_grad_(true);
        let w = f32s(&[1.0; 8], &[8], &device).requires_grad_(true);
        let b = f32s(&[0.0; 8], &[8], &device).requires_grad_(true);
        let proj = f32s(&values(8 * 4, 82, -1.0, 1.0), &[8, 4], &device).requires_grad_(true);
        let idx = i64s(&[1, 3, 9, 0, 3, 2], &[6], &device);
        let h = Tensor::embedding(&idx, &table).unwrap();
        let h = h.layer_norm(&[8], Some(&w), Some(&b), 1e-5).unwrap();
        let h = h.dropout(0.1, true).unwrap();
        let h = Tensor::cat(&[&h, &h], 0).unwrap();
        let logits = h.matmul(&proj).unwrap();
        let target = i64s(&[0, 1, 2, 3, -100, 1, 0, 1, 2, 3, 0, 1], &[12], &device);
        let ce = logits.cross_entropy(&target, IGNORE_INDEX).unwrap();
        let (m, _) = logits.max_dim(1, false).unwrap();
        let loss = ce.add(&m.var_dims(&[0], 1, false).unwrap()).unwrap();
        loss.backward().unwrap();
        for leaf in [&table, &w, &b, &proj] {
            let g = leaf.grad().unwrap().to_vec::<f32>().unwrap();
            assert!(g.iter().all(|v| v.is_finite()));
            assert!(g.iter().any(|&v| v != 0.0));
        }
    }
    assert_eq!(
        alloc.memory_allocated(),
        base,
        "memory back to the baseline"
    );
}

#[test]
fn sums_of_few_long_rows_split_over_spans_and_stay_deterministic() {
    let _serial = serial();
    let device = test_device();
    // 3 rows of 100003 columns: split into spans of 4096 (25 per row), two passes.
    assert_eq!(labs_core::kernels::rows::sum_chunks(3, 100_003), 25);
    assert_eq!(labs_core::kernels::rows::sum_chunks(100_000, 100_003), 1);
    let (rows, cols) = (3, 100_003);
    let data = values(rows * cols, 91, -1.0, 1.0);
    for (dtype, rel) in DTYPES {
        let x = make(&data, &[rows, cols], dtype, &device);
        let xr = read(&x);
        let want: Vec<f64> = xr
            .chunks(cols)
            .map(|r| r.iter().map(|&v| v as f64).sum())
            .collect();
        let got = read(&x.sum_dims(&[1], false).unwrap());
        // Sums of ~±300 from 1e5 terms of size 1: absolute error of float32 sums.
        assert_close(&format!("split sum {dtype}"), &got, &want, rel, 2e-2);
        let again = read(&x.sum_dims(&[1], false).unwrap());
        assert_eq!(got, again, "deterministic");
        let all = read(&x.mean_all().unwrap());
        let mean = want.iter().sum::<f64>() / (rows * cols) as f64;
        assert_close(&format!("split mean {dtype}"), &all, &[mean], rel, 1e-6);
    }
}

/// The gradients of `f` for half-type inputs against the same computation in float32
/// (from the same rounded inputs and output gradient): the backward kernels of every
/// dtype, not only float32's.
fn check_half_gradients(
    name: &str,
    inputs: &[(Vec<f32>, Vec<usize>)],
    f: impl Fn(&[Tensor]) -> Tensor,
) {
    let device = test_device();
    for (dtype, rel) in &DTYPES[1..] {
        let leaves: Vec<Tensor> = inputs
            .iter()
            .map(|(d, s)| make(d, s, *dtype, &device).requires_grad_(true))
            .collect();
        let y = f(&leaves);
        let g = make(&values(y.numel(), 5, -1.0, 1.0), y.shape(), *dtype, &device);
        let g32 = f32s(&read(&g), y.shape(), &device);
        y.backward_with(Some(g), false).unwrap();
        let leaves32: Vec<Tensor> = leaves
            .iter()
            .map(|t| f32s(&read(t), t.shape(), &device).requires_grad_(true))
            .collect();
        f(&leaves32).backward_with(Some(g32), false).unwrap();
        for (k, (half, full)) in leaves.iter().zip(&leaves32).enumerate() {
            let got = half.grad().unwrap();
            assert_eq!(got.dtype(), *dtype, "{name}: grad dtype");
            let want: Vec<f64> = read(&full.grad().unwrap())
                .iter()
                .map(|&v| v as f64)
                .collect();
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            // Half outputs and gradients round at each step: relative to the largest.
            assert_close(
                &format!("{name} {dtype} d/dinput{k}"),
                &read(&got),
                &want,
                0.0,
                8.0 * rel * scale.max(1e-3),
            );
        }
    }
}

#[test]
fn backward_kernels_of_half_types_agree_with_float32() {
    let _serial = serial();
    let x = || (values(3 * 33, 101, -3.0, 3.0), vec![3, 33]);
    check_half_gradients("softmax", &[x()], |t| t[0].softmax(1).unwrap());
    check_half_gradients("log_softmax", &[x()], |t| t[0].log_softmax(0).unwrap());
    let w = || (values(33, 102, 0.5, 1.5), vec![33]);
    let b = || (values(33, 103, -1.0, 1.0), vec![33]);
    check_half_gradients("layer_norm", &[x(), w(), b()], |t| {
        t[0].layer_norm(&[33], Some(&t[1]), Some(&t[2]), 1e-5)
            .unwrap()
    });
    check_half_gradients("cross_entropy", &[x()], |t| {
        let target = i64s(&[32, IGNORE_INDEX, 4], &[3], &test_device());
        t[0].cross_entropy(&target, IGNORE_INDEX).unwrap()
    });
    let spaced: Vec<f32> = (0..99).map(|k| ((k * 37) % 99) as f32 * 0.25).collect();
    check_half_gradients("max", &[(spaced, vec![3, 33])], |t| {
        t[0].max_dim(1, false).unwrap().0
    });
    check_half_gradients("dropout", &[x()], |t| {
        test_device().manual_seed(9);
        t[0].dropout(0.5, true).unwrap()
    });
}

#[test]
fn a_half_precision_loss_backpropagates_from_an_implicit_gradient() {
    let _serial = serial();
    let device = test_device();
    let data = values(2 * 5, 111, -2.0, 2.0);
    for dtype in [DType::F16, DType::BF16] {
        let x = make(&data, &[2, 5], dtype, &device).requires_grad_(true);
        let loss = x
            .cross_entropy(&i64s(&[4, 1], &[2], &device), IGNORE_INDEX)
            .unwrap();
        loss.backward().unwrap();
        let g = x.grad().unwrap();
        assert_eq!(g.dtype(), dtype);
        // Each counted row's gradient sums to zero (softmax minus one-hot, halved).
        for row in read(&g).chunks(5) {
            assert!(row.iter().sum::<f32>().abs() < 2e-2, "{dtype}: {row:?}");
            assert!(row.iter().any(|&v| v < -0.1), "{dtype}: {row:?}");
        }
    }
}

#[test]
fn cross_entropy_over_positions_is_the_mean_over_every_position() {
    let _serial = serial();
    let device = test_device();
    // Logits [N=2, C=3, L=4], targets [2, 4]: the same as [8, 3] rows with C last.
    let data = values(24, 121, -2.0, 2.0);
    let target = [0i64, 2, 1, IGNORE_INDEX, 2, 2, 0, 1];
    let x = f32s(&data, &[2, 3, 4], &device);
    let loss = x
        .cross_entropy(&i64s(&target, &[2, 4], &device), IGNORE_INDEX)
        .unwrap();
    let rows: Vec<f32> = (0..2)
        .flat_map(|n| (0..4).flat_map(move |l| (0..3).map(move |c| (n, c, l))))
        .map(|(n, c, l)| data[n * 12 + c * 4 + l])
        .collect();
    let want = cross_entropy_ref(&rows, 3, &target, IGNORE_INDEX);
    assert_close(
        "cross_entropy [2, 3, 4]",
        &loss.to_vec::<f32>().unwrap(),
        &[want],
        1e-5,
        0.0,
    );
    let err = x
        .cross_entropy(&i64s(&target, &[8], &device), IGNORE_INDEX)
        .unwrap_err();
    assert!(err.to_string().contains("[2, 3, 4] vs [8]"), "{err}");
    check_gradients("cross_entropy [2, 3, 4]", &[(data, vec![2, 3, 4])], |t| {
        let target = i64s(&[0, 2, 1, -100, 2, 2, 0, 1], &[2, 4], &test_device());
        t[0].cross_entropy(&target, -100)
            .unwrap()
            .reshape(&[1])
            .unwrap()
    });
}

#[test]
fn layer_norm_parameter_gradients_sum_spans_of_many_rows() {
    let _serial = serial();
    let device = test_device();
    // 130 rows: three spans of up to 64 rows in the first pass.
    let (rows, cols) = (130, 7);
    let xd = values(rows * cols, 131, -2.0, 2.0);
    let gd = values(rows * cols, 132, -1.0, 1.0);
    for (dtype, rel) in DTYPES {
        let x = make(&xd, &[rows, cols], dtype, &device);
        let w = make(&values(cols, 133, 0.5, 1.5), &[cols], dtype, &device).requires_grad_(true);
        let b = make(&[0.0; 7], &[cols], dtype, &device).requires_grad_(true);
        let g = make(&gd, &[rows, cols], dtype, &device);
        let (xr, gr) = (read(&x), read(&g));
        x.layer_norm(&[cols], Some(&w), Some(&b), 1e-5)
            .unwrap()
            .backward_with(Some(g), false)
            .unwrap();
        let xhat = layer_norm_ref(&xr, cols, None, None, 1e-5);
        let dw: Vec<f64> = (0..cols)
            .map(|c| {
                (0..rows)
                    .map(|r| gr[r * cols + c] as f64 * xhat[r * cols + c])
                    .sum()
            })
            .collect();
        let db: Vec<f64> = (0..cols)
            .map(|c| (0..rows).map(|r| gr[r * cols + c] as f64).sum())
            .collect();
        // Sums of 130 terms of size ~1: the half types' error follows their xhat.
        let abs = 130.0 * rel;
        assert_close(
            &format!("layer_norm dweight {dtype}"),
            &read(&w.grad().unwrap()),
            &dw,
            rel,
            abs,
        );
        assert_close(
            &format!("layer_norm dbias {dtype}"),
            &read(&b.grad().unwrap()),
            &db,
            rel,
            abs,
        );
    }
}

#[test]
fn cat_allocates_only_its_output() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let a = f32s(&values(64 * 64, 141, -1.0, 1.0), &[64, 64], &device);
    let b = f32s(&values(64 * 32, 142, -1.0, 1.0), &[64, 32], &device);
    let before = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    // Along the last dimension, where each input's part of the output is strided.
    let c = Tensor::cat(&[&a, &b], 1).unwrap();
    assert_eq!(alloc.max_memory_allocated() - before, c.nbytes() as u64);
    let (av, bv, cv) = (
        a.to_vec::<f32>().unwrap(),
        b.to_vec::<f32>().unwrap(),
        c.to_vec::<f32>().unwrap(),
    );
    for r in 0..64 {
        assert_eq!(&cv[r * 96..r * 96 + 64], &av[r * 64..r * 64 + 64]);
        assert_eq!(&cv[r * 96 + 64..r * 96 + 96], &bv[r * 32..r * 32 + 32]);
    }
    // int64 and uint8 tensors join too (the scatter only moves bytes).
    let i = Tensor::cat(
        &[
            &i64s(&[1, 2], &[2, 1], &device),
            &i64s(&[3, 4], &[2, 1], &device),
        ],
        1,
    )
    .unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), [1, 3, 2, 4]);
}
