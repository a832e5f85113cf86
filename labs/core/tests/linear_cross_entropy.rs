//! `linear_cross_entropy` (the fused classifier) against the unfused
//! `linear(x, W, b).cross_entropy(target)`, against a float64 reference computed here,
//! and against finite differences: the loss and the gradients of x, W and b, in float32
//! and under bf16 autocast, with ignored rows, chunks that do not divide the rows, one
//! chunk for every row, and an incoming gradient other than 1. Then what it holds: a
//! chunk's logits at a time, and nothing saved with grad off. Runs on the simulated
//! GPU by default and on the GPU with `LABS_DEVICE=cuda`.

mod gradcheck;

use gradcheck::{check_gradients, values};
use labs_core::tensor::{autocast, no_grad, IGNORE_INDEX};
use labs_core::testing::{assert_close, host, serial, test_device};
use labs_core::{DType, Device, Tensor};

/// One problem: x `[rows, d]`, W `[classes, d]`, b `[classes]`, targets with some
/// ignored rows.
struct Case {
    rows: usize,
    d: usize,
    classes: usize,
    x: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    target: Vec<i64>,
}

impl Case {
    fn new(rows: usize, d: usize, classes: usize, seed: u64) -> Case {
        let target = (0..rows)
            .map(|r| match r % 5 {
                // Every fifth row ignored.
                3 => IGNORE_INDEX,
                _ => ((r * 7 + seed as usize) % classes) as i64,
            })
            .collect();
        Case {
            rows,
            d,
            classes,
            x: values(rows * d, seed, -2.0, 2.0),
            w: values(classes * d, seed + 1, -1.0, 1.0),
            b: values(classes, seed + 2, -0.5, 0.5),
            target,
        }
    }

    /// The leaves x, W, b (requiring grad) and the targets on `device`.
    fn leaves(&self, device: &Device) -> [Tensor; 4] {
        let t = |v: &[f32], s: &[usize]| {
            Tensor::from_slice(v, s, device)
                .unwrap()
                .requires_grad_(true)
        };
        [
            t(&self.x, &[self.rows, self.d]),
            t(&self.w, &[self.classes, self.d]),
            t(&self.b, &[self.classes]),
            Tensor::from_slice(&self.target, &[self.rows], device).unwrap(),
        ]
    }

    /// The loss (times `scale`, backward from there) and the gradients of x, W, b, by
    /// the fused op (`chunk` rows) or the unfused path (`None`).
    fn run(
        &self,
        device: &Device,
        chunk: Option<usize>,
        bias: bool,
        scale: f32,
    ) -> (f64, [Vec<f64>; 3]) {
        let [x, w, b, target] = self.leaves(device);
        let bias = bias.then_some(&b);
        let loss = match chunk {
            Some(c) => x
                .linear_cross_entropy(&w, bias, &target, IGNORE_INDEX, c)
                .unwrap(),
            None => x
                .linear(&w, bias)
                .unwrap()
                .cross_entropy(&target, IGNORE_INDEX)
                .unwrap(),
        };
        assert_eq!(loss.shape(), &[] as &[usize]);
        loss.scale(scale).unwrap().backward().unwrap();
        let grad = |t: &Tensor| t.grad().map(|g| host(&g)).unwrap_or_default();
        (host(&loss)[0], [grad(&x), grad(&w), grad(&b)])
    }

    /// The loss and gradients in float64, as PyTorch defines them: the mean over the
    /// rows not ignored (NaN when all are) and `d loss / d logits = (softmax - onehot)
    /// / count` on those rows, zero elsewhere; times `scale`.
    fn reference(&self, bias: bool, scale: f64) -> (f64, [Vec<f64>; 3]) {
        let (rows, d, v) = (self.rows, self.d, self.classes);
        let counted = self.target.iter().filter(|&&t| t != IGNORE_INDEX).count() as f64;
        let (mut loss, mut gx, mut gw, mut gb) =
            (0.0, vec![0.0; rows * d], vec![0.0; v * d], vec![0.0; v]);
        for r in 0..rows {
            let logits: Vec<f64> = (0..v)
                .map(|c| {
                    let dot: f64 = (0..d)
                        .map(|k| self.x[r * d + k] as f64 * self.w[c * d + k] as f64)
                        .sum();
                    dot + if bias { self.b[c] as f64 } else { 0.0 }
                })
                .collect();
            let t = self.target[r];
            if t == IGNORE_INDEX {
                continue;
            }
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = logits.iter().map(|l| (l - m).exp()).sum();
            loss -= logits[t as usize] - m - s.ln();
            for c in 0..v {
                let p = (logits[c] - m).exp() / s;
                let g = scale * (p - (c as i64 == t) as i32 as f64) / counted;
                gb[c] += g;
                for k in 0..d {
                    gx[r * d + k] += g * self.w[c * d + k] as f64;
                    gw[c * d + k] += g * self.x[r * d + k] as f64;
                }
            }
        }
        if !bias {
            gb.clear();
        }
        (loss / counted, [gx, gw, gb])
    }
}

/// `got` against `want` within `rtol` of each element plus `atol` times the largest.
fn close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    let largest = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert_close(what, got, want, rtol, atol * largest.max(1e-30));
}

#[test]
fn the_fused_loss_and_gradients_are_the_unfused_ones_in_float32() {
    let _serial = serial();
    let device = test_device();
    let case = Case::new(37, 6, 23, 11);
    // Chunks that do not divide 37, one row a chunk, and one chunk for all (37, 64).
    for (chunk, bias, scale) in [
        (8, true, 1.0),
        (8, false, 3.0),
        (1, true, 3.0),
        (37, true, 1.0),
        (64, false, -0.5),
    ] {
        let what = format!("chunk {chunk} bias {bias} scale {scale}");
        let (loss, grads) = case.run(&device, Some(chunk), bias, scale);
        let (want_loss, want) = case.run(&device, None, bias, scale);
        assert_close(&format!("{what}: loss"), &[loss], &[want_loss], 1e-6, 0.0);
        for (name, (g, w)) in ["x", "W", "b"].iter().zip(grads.iter().zip(&want)) {
            close(&format!("{what}: grad {name}"), g, w, 1e-5, 1e-6);
        }
        if !bias {
            assert!(
                grads[2].is_empty(),
                "{what}: the unused bias got a gradient"
            );
        }
        // And both against float64.
        let (ref_loss, reference) = case.reference(bias, scale as f64);
        assert_close(
            &format!("{what}: f64 loss"),
            &[loss],
            &[ref_loss],
            1e-5,
            0.0,
        );
        for (name, (g, r)) in ["x", "W", "b"].iter().zip(grads.iter().zip(&reference)) {
            close(&format!("{what}: f64 grad {name}"), g, r, 1e-4, 1e-5);
        }
    }
}

#[test]
fn under_bf16_autocast_the_products_are_bf16_and_the_gradients_arrive_in_float32() {
    let _serial = serial();
    let device = test_device();
    let case = Case::new(45, 16, 70, 5);
    let run = |chunk: Option<usize>| {
        let [x, w, b, target] = case.leaves(&device);
        let loss = {
            let _bf16 = autocast(DType::BF16).unwrap();
            match chunk {
                Some(c) => x
                    .linear_cross_entropy(&w, Some(&b), &target, IGNORE_INDEX, c)
                    .unwrap(),
                None => x
                    .linear(&w, Some(&b))
                    .unwrap()
                    .cross_entropy(&target, IGNORE_INDEX)
                    .unwrap(),
            }
        };
        assert_eq!(loss.dtype(), DType::F32, "the loss runs in float32");
        loss.scale(3.0).unwrap().backward().unwrap();
        let grads = [&x, &w, &b].map(|t| t.grad().unwrap());
        for g in &grads {
            assert_eq!(g.dtype(), DType::F32, "a float32 leaf's gradient");
        }
        (host(&loss)[0], grads.map(|g| host(&g)))
    };
    let (want_loss, want) = run(None);
    let (ref_loss, reference) = case.reference(true, 3.0);
    for chunk in [7, 45, 100] {
        let (loss, grads) = run(Some(chunk));
        // The same bf16 logits, softmax and loss in float32: the losses agree closely.
        assert_close(
            &format!("chunk {chunk}: loss"),
            &[loss],
            &[want_loss],
            1e-4,
            0.0,
        );
        // The gradients differ by bf16 roundings (the unfused path rounds its products
        // to bf16; the fused one writes and sums them in float32).
        for (name, ((g, w), r)) in ["x", "W", "b"]
            .iter()
            .zip(grads.iter().zip(&want).zip(&reference))
        {
            close(&format!("chunk {chunk}: grad {name}"), g, w, 2e-2, 2e-2);
            close(&format!("chunk {chunk}: f64 grad {name}"), g, r, 3e-2, 3e-2);
        }
    }
    assert_close(
        "bf16 loss against f64",
        &[want_loss],
        &[ref_loss],
        2e-2,
        0.0,
    );
}

#[test]
fn bf16_inputs_without_autocast_give_a_bf16_loss_and_bf16_gradients() {
    let _serial = serial();
    let device = test_device();
    let case = Case::new(20, 8, 30, 3);
    let [x, w, _, target] = case.leaves(&device);
    let half = |t: &Tensor| {
        t.detach()
            .to_dtype(DType::BF16)
            .unwrap()
            .requires_grad_(true)
    };
    let (xh, wh) = (half(&x), half(&w));
    let loss = xh
        .linear_cross_entropy(&wh, None, &target, IGNORE_INDEX, 6)
        .unwrap();
    assert_eq!(loss.dtype(), DType::BF16);
    loss.backward().unwrap();
    let (gx, gw) = (xh.grad().unwrap(), wh.grad().unwrap());
    assert_eq!((gx.dtype(), gw.dtype()), (DType::BF16, DType::BF16));
    let (ref_loss, reference) = case.reference(false, 1.0);
    assert_close("bf16 loss", &host(&loss), &[ref_loss], 3e-2, 0.0);
    close("bf16 grad x", &host(&gx), &reference[0], 3e-2, 3e-2);
    close("bf16 grad W", &host(&gw), &reference[1], 3e-2, 3e-2);
}

#[test]
fn every_row_ignored_gives_nan_and_zero_gradients_as_the_unfused_path() {
    let _serial = serial();
    let device = test_device();
    let mut case = Case::new(9, 4, 5, 7);
    case.target = vec![IGNORE_INDEX; 9];
    for chunk in [Some(4), None] {
        let (loss, grads) = case.run(&device, chunk, true, 1.0);
        assert!(loss.is_nan(), "{chunk:?}: {loss}");
        for g in &grads {
            assert!(g.iter().all(|&v| v == 0.0), "{chunk:?}: {g:?}");
        }
    }
    // One chunk of ignored rows among counted ones adds nothing to the mean.
    let mut case = Case::new(12, 4, 5, 8);
    for t in &mut case.target[4..8] {
        *t = IGNORE_INDEX;
    }
    let (loss, _) = case.run(&device, Some(4), true, 1.0);
    let (want, _) = case.reference(true, 1.0);
    assert_close("a chunk of ignored rows", &[loss], &[want], 1e-5, 0.0);
}

#[test]
fn the_gradients_match_finite_differences() {
    let _serial = serial();
    let target = [2i64, 0, IGNORE_INDEX, 3, 1];
    check_gradients(
        "linear_cross_entropy",
        &[
            (values(15, 61, -1.0, 1.0), vec![5, 3]),
            (values(12, 62, -1.0, 1.0), vec![4, 3]),
            (values(4, 63, -0.5, 0.5), vec![4]),
        ],
        |t| {
            let target = Tensor::from_slice(&target, &[5], &test_device()).unwrap();
            t[0].linear_cross_entropy(&t[1], Some(&t[2]), &target, IGNORE_INDEX, 2)
                .unwrap()
                .reshape(&[1])
                .unwrap()
        },
    );
}

#[test]
fn it_holds_one_chunks_logits_at_a_time_and_saves_nothing_without_grad() {
    let _serial = serial();
    let device = test_device();
    let allocator = device.allocator().unwrap();
    let (rows, d, classes, chunk) = (512, 8, 1000, 16);
    let case = Case::new(rows, d, classes, 9);
    let [x, w, b, target] = case.leaves(&device);
    let logits_bytes = (rows * classes * 4) as u64;
    let chunk_bytes = (chunk * classes * 4) as u64;
    // What the node saves: the gradients of x, W and b, and the count.
    let saved_bytes = ((rows * d + classes * d + classes) * 4) as u64;
    device.synchronize().unwrap();
    let before = allocator.memory_allocated();
    allocator.reset_peak_stats();
    let loss = x
        .linear_cross_entropy(&w, Some(&b), &target, IGNORE_INDEX, chunk)
        .unwrap();
    let held = allocator.memory_allocated() - before;
    assert!(
        (saved_bytes..saved_bytes + 4096).contains(&held),
        "after forward: {held} bytes held, the saved gradients are {saved_bytes}"
    );
    loss.backward().unwrap();
    drop(loss);
    let peak = allocator.max_memory_allocated() - before;
    // A chunk's logits, log-probabilities and their two gradients, beside what is
    // saved and the gradients backward hands out: far below the whole logits.
    assert!(
        peak <= 2 * saved_bytes + 4 * chunk_bytes + 64 * 1024,
        "peak {peak} bytes above the inputs; a chunk's logits are {chunk_bytes}"
    );
    assert!(
        peak < logits_bytes / 4,
        "peak {peak} vs logits {logits_bytes}"
    );
    for t in [&x, &w, &b] {
        t.clear_grad();
    }
    // Without recording: no node, nothing saved, the loss alone left.
    let loss = {
        let _off = no_grad();
        x.linear_cross_entropy(&w, Some(&b), &target, IGNORE_INDEX, chunk)
            .unwrap()
    };
    assert!(loss.grad_fn().is_none() && !loss.requires_grad());
    assert_eq!(
        allocator.memory_allocated() - before,
        loss.allocation().size(),
        "only the loss stays without grad"
    );
    drop(loss);
    // Nor when no input requires grad.
    let plain = [&x, &w, &b].map(|t| t.detach());
    let loss = plain[0]
        .linear_cross_entropy(&plain[1], Some(&plain[2]), &target, IGNORE_INDEX, chunk)
        .unwrap();
    assert!(loss.grad_fn().is_none());
    assert_eq!(
        allocator.memory_allocated() - before,
        loss.allocation().size()
    );
}

#[test]
fn only_the_inputs_that_require_grad_get_one() {
    let _serial = serial();
    let device = test_device();
    let case = Case::new(10, 4, 6, 4);
    let [x, w, b, target] = case.leaves(&device);
    let frozen_x = x.detach();
    let loss = frozen_x
        .linear_cross_entropy(&w, Some(&b.detach()), &target, IGNORE_INDEX, 3)
        .unwrap();
    assert_eq!(
        loss.grad_fn().unwrap().op.name(),
        "LinearCrossEntropyBackward"
    );
    loss.backward().unwrap();
    assert!(w.grad().is_some() && x.grad().is_none() && b.grad().is_none());
    let (_, reference) = case.reference(true, 1.0);
    close(
        "grad W alone",
        &host(&w.grad().unwrap()),
        &reference[1],
        1e-4,
        1e-5,
    );
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    let device = test_device();
    let case = Case::new(6, 4, 5, 2);
    let [x, w, b, target] = case.leaves(&device);
    let lce = |x: &Tensor, w: &Tensor, b: Option<&Tensor>, t: &Tensor, chunk| {
        x.linear_cross_entropy(w, b, t, IGNORE_INDEX, chunk)
            .unwrap_err()
            .to_string()
    };
    assert!(lce(&x, &w, Some(&b), &target, 0).contains("chunk_rows must be at least 1"));
    let short = target.narrow(0, 0, 5).unwrap();
    assert!(lce(&x, &w, None, &short, 2).contains("[6, 4] vs [5]"));
    let wide = Tensor::zeros(&[5, 3], DType::F32, &device).unwrap();
    assert!(lce(&x, &wide, None, &target, 2).contains("weight [classes, in]"));
    let bad_bias = Tensor::zeros(&[4], DType::F32, &device).unwrap();
    assert!(lce(&x, &w, Some(&bad_bias), &target, 2).contains("the bias must be [classes]"));
    let floats = Tensor::zeros(&[6], DType::F32, &device).unwrap();
    assert!(lce(&x, &w, None, &floats, 2).contains("int64"));
    if !device.is_cuda() {
        let out_of_range = Tensor::from_slice(&[0i64, 1, 2, 3, 4, 5], &[6], &device).unwrap();
        assert!(lce(&x, &w, None, &out_of_range, 2).contains("index 5 is out of bounds"));
    }
}
