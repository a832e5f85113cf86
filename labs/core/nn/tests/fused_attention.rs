//! The fused attention kernel against a float64 reference `softmax(q kᵀ · s) v` on the
//! host: outputs for odd lengths, causal and not, in every float dtype; gradients
//! against central differences of the reference; the node saves q, k, v, the output
//! and the log-sum-exp, never the scores. Runs on the simulated GPU by default (the CPU
//! twins) and on the GPU with `LABS_DEVICE=cuda` (`kernels/attention.cu`).

use labs_base::testing::max_error;
use labs_device::testing::test_device;
use labs_device::Device;
use labs_tensor::autograd::retained_graph;
use labs_tensor::testing::host;
use labs_tensor::{DType, Tensor};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The reference in float64: `(out, lse)` for `[bh, tq, d]`, `[bh, tk, d]` inputs.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (bh, tq, tk, d): (usize, usize, usize, usize),
    causal: bool,
) -> (Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; bh * tq * d];
    let mut lse = vec![0.0; bh * tq];
    for b in 0..bh {
        for i in 0..tq {
            let keys = if causal { tk.min(i + 1) } else { tk };
            let s: Vec<f64> = (0..keys)
                .map(|j| {
                    (0..d)
                        .map(|c| q[(b * tq + i) * d + c] * k[(b * tk + j) * d + c])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for c in 0..d {
                out[(b * tq + i) * d + c] = (0..keys)
                    .map(|j| (s[j] - m).exp() / l * v[(b * tk + j) * d + c])
                    .sum();
            }
            lse[b * tq + i] = m + l.ln();
        }
    }
    (out, lse)
}

fn inputs(
    shape_q: [usize; 4],
    tk: usize,
    dtype: DType,
    device: &Device,
) -> (Tensor, Tensor, Tensor) {
    let [b, h, tq, d] = shape_q;
    let make = |t: usize, seed| {
        Tensor::from_slice(&values(b * h * t * d, seed), &[b, h, t, d], device)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    (make(tq, 1), make(tk, 2), make(tk, 3))
}

#[test]
fn forward_matches_the_reference_for_odd_lengths_causal_or_not() {
    let device = test_device();
    // Tolerances: float32 sums in another order than float64; half types round
    // their inputs and outputs (bf16 keeps 8 bits).
    for (dtype, tolerance) in [
        (DType::F32, 2e-5),
        (DType::F16, 2e-3),
        (DType::BF16, 1.6e-2),
    ] {
        for (tq, tk) in [(1, 1), (7, 7), (65, 65), (130, 130), (7, 65), (65, 7)] {
            for d in [16, 64, 128] {
                if dtype != DType::F32 && d != 64 {
                    continue; // the half types once per length
                }
                for causal in [false, true] {
                    let (q, k, v) = inputs([2, 2, tq, d], tk, dtype, &device);
                    let out = Tensor::fused_attention(&q, &k, &v, causal, None, 0.0).unwrap();
                    assert_eq!(out.shape(), &[2, 2, tq, d]);
                    assert_eq!(out.dtype(), dtype);
                    let (want, _) =
                        reference(&host(&q), &host(&k), &host(&v), (4, tq, tk, d), causal);
                    let err = max_error(&host(&out), &want);
                    assert!(
                        err < tolerance,
                        "{dtype} tq={tq} tk={tk} d={d} causal={causal}: error {err:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_node_saves_inputs_output_and_log_sum_exp_only() {
    let device = test_device();
    let (b, h, t, d) = (2, 3, 65, 32);
    let (q, k, v) = inputs([b, h, t, d], t, DType::F32, &device);
    let (q, k, v) = (
        q.requires_grad_(true),
        k.requires_grad_(true),
        v.requires_grad_(true),
    );
    let out = Tensor::fused_attention(&q, &k, &v, true, None, 0.0).unwrap();
    let node = out.grad_fn().expect("a recorded node");
    assert_eq!(node.op.name(), "ScaledDotProductFlashAttentionBackward");
    let saved = node.saved.lock().unwrap().clone().unwrap();
    let shapes: Vec<(Vec<usize>, DType)> = saved
        .iter()
        .map(|t| (t.shape().to_vec(), t.dtype()))
        .collect();
    let full = vec![b, h, t, d];
    assert_eq!(
        shapes,
        vec![
            (full.clone(), DType::F32),
            (full.clone(), DType::F32),
            (full.clone(), DType::F32),
            (full, DType::F32),
            (vec![b, h, t], DType::F32),
        ]
    );
    // The lse is the reference's.
    let (_, lse) = reference(&host(&q), &host(&k), &host(&v), (b * h, t, t, d), true);
    assert!(max_error(&host(&saved[4]), &lse) < 2e-5);
    // In bytes: four [B, H, T, D] tensors and one [B, H, T] float32, no T x T scores.
    let bytes = (4 * b * h * t * d * 4 + b * h * t * 4) as u64;
    assert_eq!(retained_graph(&out).saved_bytes, bytes);
    assert!(
        saved.iter().all(|s| s.numel() < b * h * t * t),
        "nothing of the scores' size"
    );
}

/// Central differences of `sum(reference(q, k, v) * w)` in float64.
#[test]
fn gradients_match_finite_differences_of_the_reference() {
    let device = test_device();
    for causal in [false, true] {
        for (tq, tk, d) in [(5, 5, 4), (3, 6, 8), (7, 2, 3)] {
            let bh = 2;
            let (q, k, v) = inputs([1, bh, tq, d], tk, DType::F32, &device);
            let (q, k, v) = (
                q.requires_grad_(true),
                k.requires_grad_(true),
                v.requires_grad_(true),
            );
            let w = values(bh * tq * d, 9);
            let out = Tensor::fused_attention(&q, &k, &v, causal, None, 0.0).unwrap();
            let wt = Tensor::from_slice(&w, out.shape(), &device).unwrap();
            out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
            let mut xs = [host(&q), host(&k), host(&v)];
            let loss = |xs: &[Vec<f64>; 3]| -> f64 {
                let (o, _) = reference(&xs[0], &xs[1], &xs[2], (bh, tq, tk, d), causal);
                o.iter().zip(&w).map(|(o, w)| o * *w as f64).sum()
            };
            for (which, leaf) in [&q, &k, &v].into_iter().enumerate() {
                let analytic = host(&leaf.grad().unwrap());
                for i in 0..xs[which].len() {
                    let h = 1e-5;
                    let x0 = xs[which][i];
                    xs[which][i] = x0 + h;
                    let up = loss(&xs);
                    xs[which][i] = x0 - h;
                    let down = loss(&xs);
                    xs[which][i] = x0;
                    let numeric = (up - down) / (2.0 * h);
                    assert!(
                        (analytic[i] - numeric).abs() < 1e-4 * (1.0 + numeric.abs()),
                        "causal={causal} tq={tq} tk={tk} d={d}: d{}[{i}] = {} vs {numeric}",
                        ["q", "k", "v"][which],
                        analytic[i]
                    );
                }
            }
        }
    }
}

#[test]
fn gradients_agree_with_the_naive_composition_in_half_types() {
    let device = test_device();
    let (b, h, t, d) = (1, 2, 33, 64);
    for (dtype, tolerance) in [(DType::F32, 1e-4), (DType::F16, 1e-2), (DType::BF16, 6e-2)] {
        let fused = gradients_of([b, h, t, d], t, dtype, true, true, &device);
        let naive = gradients_of([b, h, t, d], t, dtype, true, false, &device);
        for (which, (f, n)) in fused.iter().zip(&naive).enumerate() {
            let err = max_error(f, n);
            assert!(
                err < tolerance,
                "{dtype} d{}: error {err:e}",
                ["q", "k", "v"][which]
            );
        }
    }
}

#[test]
fn bad_inputs_are_refused_with_clear_errors() {
    let device = test_device();
    let t = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &device).unwrap();
    let e = |q: &Tensor, k: &Tensor, v: &Tensor| {
        Tensor::fused_attention(q, k, v, false, None, 0.0)
            .unwrap_err()
            .to_string()
    };
    let ok = t(&[1, 2, 4, 8]);
    assert!(e(&t(&[2, 4, 8]), &ok, &ok).contains("[batch, heads, seq, head_dim]"));
    let wide = t(&[1, 1, 4, 129]);
    assert!(e(&wide, &wide, &wide).contains("head_dim must be 1 to 128"));
    assert!(e(&ok, &t(&[1, 2, 4, 4]), &ok).contains("matching"));
    let empty = t(&[1, 2, 0, 8]);
    assert!(e(&ok, &empty, &empty).contains("no keys"));
    let half = ok.to_dtype(DType::F16).unwrap();
    assert!(Tensor::fused_attention(&ok, &half, &half, false, None, 0.0).is_err());
    let ints = Tensor::zeros(&[1, 2, 4, 8], DType::I64, &device).unwrap();
    assert!(Tensor::fused_attention(&ints, &ints, &ints, false, None, 0.0).is_err());
}

#[test]
fn the_fused_backend_serves_a_gpt2_with_the_same_loss_and_gradients_and_stores_less() {
    use labs_nn::nn::{sdpa_kernel, Gpt2, Gpt2Config, Module, Rng, SdpaBackend};
    let device = test_device();
    let c = Gpt2Config {
        vocab: 17,
        n_positions: 128,
        d_model: 16,
        n_layer: 2,
        n_head: 2,
        dropout: 0.0,
    };
    let (b, t) = (2, 128);
    let tokens: Vec<i64> = (0..b * t).map(|i| ((i * 7 + 3) % c.vocab) as i64).collect();
    let targets: Vec<i64> = (0..b * t).map(|i| ((i * 5 + 1) % c.vocab) as i64).collect();
    // `(loss, every gradient, activation bytes live before backward)`.
    let run = |backend: SdpaBackend| -> (f64, Vec<Vec<f64>>, u64) {
        let _backend = sdpa_kernel(backend);
        let model = Gpt2::new(c, &mut Rng::seeded(3), &device).unwrap();
        let idx = Tensor::from_slice(&tokens, &[b, t], &device).unwrap();
        let tgt = Tensor::from_slice(&targets, &[b, t], &device).unwrap();
        let loss = model.loss(&idx, &tgt).unwrap();
        let held = retained_graph(&loss).saved_bytes;
        let value = host(&loss)[0];
        loss.backward().unwrap();
        let grads = model
            .parameters()
            .iter()
            .map(|p| host(&p.grad().unwrap()))
            .collect();
        (value, grads, held)
    };
    let (math_loss, math_grads, math_held) = run(SdpaBackend::Math);
    let (fused_loss, fused_grads, fused_held) = run(SdpaBackend::Fused);
    assert!(
        (math_loss - fused_loss).abs() < 1e-5,
        "{math_loss} vs {fused_loss}"
    );
    for (i, (m, f)) in math_grads.iter().zip(&fused_grads).enumerate() {
        let err = max_error(m, f);
        assert!(err < 1e-4, "parameter {i}: error {err:e}");
    }
    // The math path keeps each layer's [B, H, T, T] probabilities; the fused one a
    // [B, H, T] log-sum-exp, q, k, v (the projections' head views) and the output
    // ([B, H, T, Dh] each, a quarter of the probabilities at these sizes).
    let scores = (c.n_layer * b * c.n_head * t * t * 4) as u64;
    assert!(
        math_held - fused_held >= scores / 2,
        "fused held {fused_held} B, math {math_held} B"
    );
}

/// The gradients of `sum(attention(q, k, v) * w)` over q, k and v, fused (`fused`) or by
/// the naive composition in float32 from the same rounded inputs; causal hides keys
/// `j > i` (top-left aligned, as the kernels).
fn gradients_of(
    shape_q: [usize; 4],
    tk: usize,
    dtype: DType,
    causal: bool,
    fused: bool,
    device: &Device,
) -> Vec<Vec<f64>> {
    let [b, h, tq, d] = shape_q;
    let (q, k, v) = inputs(shape_q, tk, dtype, device);
    let (q, k, v) = (
        q.requires_grad_(true),
        k.requires_grad_(true),
        v.requires_grad_(true),
    );
    let out = if fused {
        Tensor::fused_attention(&q, &k, &v, causal, None, 0.0).unwrap()
    } else {
        let f = |x: &Tensor| x.to_dtype(DType::F32).unwrap();
        let mut s = f(&q)
            .matmul(&f(&k).transpose(2, 3).unwrap())
            .unwrap()
            .scale(1.0 / (d as f32).sqrt())
            .unwrap();
        if causal {
            let hidden: Vec<f32> = (0..tq * tk)
                .map(|e| {
                    if e % tk > e / tk {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            s = s
                .add(&Tensor::from_slice(&hidden, &[tq, tk], device).unwrap())
                .unwrap();
        }
        s.softmax(3).unwrap().matmul(&f(&v)).unwrap()
    };
    let w = Tensor::from_slice(&values(b * h * tq * d, 5), &[b, h, tq, d], device)
        .unwrap()
        .to_dtype(out.dtype())
        .unwrap();
    out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    [&q, &k, &v]
        .iter()
        .map(|x| host(&x.grad().unwrap()))
        .collect()
}

#[test]
fn every_tensor_core_head_size_gives_the_naive_gradients() {
    // Calls without dropout run on the tensor-core kernels on the GPU
    // (kernels/attention_flash.cu; float32 by 3xTF32): 128-row blocks, 64-row tiles, so
    // lengths that end mid-tile, more queries than keys and the reverse, and a
    // batch-head count that makes several blocks.
    let device = test_device();
    for (dtype, tolerance) in [(DType::F32, 1e-4), (DType::F16, 1e-2), (DType::BF16, 6e-2)] {
        for d in labs_device::kernels::FLASH_HEAD_DIMS {
            for (tq, tk) in [(130, 130), (65, 200), (200, 65)] {
                for causal in [false, true] {
                    let shape = [1, 3, tq, d];
                    let fused = gradients_of(shape, tk, dtype, causal, true, &device);
                    let naive = gradients_of(shape, tk, dtype, causal, false, &device);
                    for (which, (f, n)) in fused.iter().zip(&naive).enumerate() {
                        let err = max_error(f, n);
                        assert!(
                            err < tolerance,
                            "{dtype} d={d} tq={tq} tk={tk} causal={causal} d{}: error {err:e}",
                            ["q", "k", "v"][which]
                        );
                    }
                }
            }
        }
    }
}
