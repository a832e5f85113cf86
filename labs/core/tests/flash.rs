//! Dropout inside the fused attention kernel, and its strided operands: the output and
//! gradients equal the naive composition `(softmax(q kᵀ · s) ∘ Z / (1 − p)) v` with the
//! mask the call drew (materialised by `Tensor::fused_attention_dropout_mask`), in
//! every float dtype, causal or not, for odd lengths; gradients against finite
//! differences with the mask fixed by the generator state; fresh masks per call and the
//! same mask under checkpointing's replay; head views read in place and an output in
//! `[B, L, H, D]` memory, so that a `MultiheadAttention` forward stores neither the
//! probabilities, nor the mask, nor copies. Runs on the simulated GPU by default (the
//! CPU twins) and on the GPU with `LABS_DEVICE=cuda` (`kernels/attention.cu`).

mod gradcheck;

use gradcheck::{check_gradients, values};
use labs_core::autograd::{checkpoint, retained_graph};
use labs_core::nn::attention::causal_mask_rect;
use labs_core::nn::{sdpa_kernel, MhaLayout, Module, MultiheadAttention, Rng, SdpaBackend};
use labs_core::testing::{host, max_error, serial, test_device};
use labs_core::{DType, Device, Tensor};

/// `[B, H, T, D]` inputs of `dtype` in [-1, 1), leaves that require grad.
fn leaf(shape: [usize; 4], seed: u64, dtype: DType, device: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(&values(n, seed, -1.0, 1.0), &shape, device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .requires_grad_(true)
}

/// The naive composition in float32 from the same (rounded) inputs, with the keep mask
/// `mask` (uint8, 1 kept) scaled by `1 / (1 - p)`.
fn naive(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, mask: &Tensor, p: f32) -> Tensor {
    let f = |x: &Tensor| x.to_dtype(DType::F32).unwrap();
    let (tq, tk, d) = (q.shape()[2], k.shape()[2], q.shape()[3]);
    let mut s = f(q)
        .matmul(&f(k).transpose(2, 3).unwrap())
        .unwrap()
        .scale(1.0 / (d as f32).sqrt())
        .unwrap();
    if causal {
        s = s
            .add(&causal_mask_rect(tq, tk, q.device()).unwrap())
            .unwrap();
    }
    s.softmax(3)
        .unwrap()
        .mul(&mask.to_dtype(DType::F32).unwrap())
        .unwrap()
        .scale(1.0 / (1.0 - p))
        .unwrap()
        .matmul(&f(v))
        .unwrap()
}

/// `(output, [dq, dk, dv])` of `sum(out * w)` on the host.
fn run(out: &Tensor, inputs: [&Tensor; 3]) -> (Vec<f64>, Vec<Vec<f64>>) {
    let w = Tensor::from_slice(
        &values(out.numel(), 5, -1.0, 1.0),
        out.shape(),
        out.device(),
    )
    .unwrap()
    .to_dtype(out.dtype())
    .unwrap();
    out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let grads = inputs.iter().map(|x| host(&x.grad().unwrap())).collect();
    (host(out), grads)
}

#[test]
fn dropout_output_and_gradients_equal_the_naive_composition_with_the_calls_mask() {
    let _s = serial();
    let device = test_device();
    let p = 0.3;
    // Tolerances as in fused_attention.rs: float32 sums in another order; half types
    // round their inputs and outputs.
    for (dtype, out_tol, grad_tol) in [
        (DType::F32, 2e-5, 1e-4),
        (DType::F16, 2e-3, 1e-2),
        (DType::BF16, 1.6e-2, 6e-2),
    ] {
        for (tq, tk) in [(7, 7), (33, 65), (65, 33)] {
            for causal in [false, true] {
                let (b, h, d) = (2, 2, 16);
                let make = || {
                    (
                        leaf([b, h, tq, d], 1, dtype, &device),
                        leaf([b, h, tk, d], 2, dtype, &device),
                        leaf([b, h, tk, d], 3, dtype, &device),
                    )
                };
                device.manual_seed(11);
                let state = device.rng_state();
                let (q, k, v) = make();
                let out = Tensor::fused_attention(&q, &k, &v, causal, None, p).unwrap();
                let (got, got_grads) = run(&out, [&q, &k, &v]);
                let mask = Tensor::fused_attention_dropout_mask([b, h, tq, tk], p, state, &device)
                    .unwrap();
                let kept = mask.to_vec::<u8>().unwrap();
                let share = kept.iter().map(|&m| m as f64).sum::<f64>() / kept.len() as f64;
                assert!(
                    (share - (1.0 - p as f64)).abs() < 0.05,
                    "{share} of the weights kept"
                );
                let (q2, k2, v2) = make();
                let reference = naive(&q2, &k2, &v2, causal, &mask, p);
                let (want, want_grads) = run(&reference, [&q2, &k2, &v2]);
                let what = format!("{dtype} tq={tq} tk={tk} causal={causal}");
                let err = max_error(&got, &want);
                assert!(err < out_tol, "{what}: output error {err:e}");
                for (which, (g, w)) in got_grads.iter().zip(&want_grads).enumerate() {
                    let err = max_error(g, w);
                    assert!(
                        err < grad_tol,
                        "{what}: d{} error {err:e}",
                        ["q", "k", "v"][which]
                    );
                }
            }
        }
    }
}

#[test]
fn two_calls_draw_different_masks_and_reserve_their_counters() {
    let _s = serial();
    let device = test_device();
    let (b, h, t, d) = (2, 3, 9, 8);
    let q = leaf([b, h, t, d], 1, DType::F32, &device);
    device.manual_seed(5);
    let first = device.rng_state();
    let a = host(&Tensor::fused_attention(&q, &q, &q, false, None, 0.5).unwrap());
    let second = device.rng_state();
    assert_eq!(second, (first.0, first.1 + (b * h * t * t) as u64));
    let c = host(&Tensor::fused_attention(&q, &q, &q, false, None, 0.5).unwrap());
    assert_ne!(a, c, "a second call draws a fresh mask");
    let mask = |state| {
        Tensor::fused_attention_dropout_mask([b, h, t, t], 0.5, state, &device)
            .unwrap()
            .to_vec::<u8>()
            .unwrap()
    };
    assert_ne!(mask(first), mask(second));
    // The same state draws the same mask, and no dropout draws nothing.
    device.set_rng_state(first);
    assert_eq!(
        host(&Tensor::fused_attention(&q, &q, &q, false, None, 0.5).unwrap()),
        a
    );
    let before = device.rng_state();
    Tensor::fused_attention(&q, &q, &q, false, None, 0.0).unwrap();
    assert_eq!(device.rng_state(), before);
    // p = 1 drops every weight; p outside [0, 1] is refused.
    let zeros = host(&Tensor::fused_attention(&q, &q, &q, true, None, 1.0).unwrap());
    assert!(zeros.iter().all(|&x| x == 0.0));
    let err = Tensor::fused_attention(&q, &q, &q, true, None, 1.5).unwrap_err();
    assert!(err.to_string().contains("between 0 and 1"), "{err}");
}

#[test]
fn checkpointing_replays_the_same_dropout_mask() {
    let _s = serial();
    let device = test_device();
    let (b, h, t, d) = (1, 2, 13, 8);
    let q = leaf([b, h, t, d], 7, DType::F32, &device);
    let region = |xs: &[Tensor]| -> labs_core::Result<Tensor> {
        Tensor::fused_attention(&xs[0], &xs[0], &xs[0], true, None, 0.4)?.mul(&xs[0])
    };
    let grads = |checkpointed: bool| -> (Vec<u32>, Vec<u32>) {
        q.clear_grad();
        device.manual_seed(9);
        let x = q.scale(0.5).unwrap();
        let y = if checkpointed {
            checkpoint(region, std::slice::from_ref(&x)).unwrap()
        } else {
            region(std::slice::from_ref(&x)).unwrap()
        };
        // Draws between forward and backward: the recomputation must not see them.
        Tensor::fused_attention(&x, &x, &x, false, None, 0.4).unwrap();
        let out = y.to_vec::<f32>().unwrap();
        y.sum_all().unwrap().backward().unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect();
        (bits(out), bits(q.grad().unwrap().to_vec::<f32>().unwrap()))
    };
    assert_eq!(grads(false), grads(true));
}

#[test]
fn gradients_with_dropout_match_finite_differences() {
    let _s = serial();
    let device = test_device();
    device.manual_seed(3);
    let state = device.rng_state();
    for causal in [false, true] {
        for (tq, tk, d) in [(5, 5, 4), (3, 6, 8), (7, 2, 3)] {
            // Inputs as [B, T, H, D], attended as [B, H, T, D] views: strided operands.
            let (b, h) = (1, 2);
            let inputs = vec![
                (values(b * tq * h * d, 1, -1.0, 1.0), vec![b, tq, h, d]),
                (values(b * tk * h * d, 2, -1.0, 1.0), vec![b, tk, h, d]),
                (values(b * tk * h * d, 3, -1.0, 1.0), vec![b, tk, h, d]),
            ];
            let dev = device.clone();
            check_gradients(
                &format!("fused attention with dropout, causal={causal} tq={tq} tk={tk}"),
                &inputs,
                move |xs| {
                    // The same mask for every evaluation.
                    dev.set_rng_state(state);
                    let heads = |x: &Tensor| x.transpose(1, 2).unwrap();
                    let (q, k, v) = (heads(&xs[0]), heads(&xs[1]), heads(&xs[2]));
                    Tensor::fused_attention(&q, &k, &v, causal, None, 0.3).unwrap()
                },
            );
        }
    }
}

#[test]
fn strided_inputs_give_the_dense_results_in_heads_last_memory() {
    let _s = serial();
    let device = test_device();
    let (b, h, tq, tk, d) = (2, 3, 11, 7, 16);
    let src = |t, seed| leaf([b, t, h, d], seed, DType::F32, &device);
    let (qs, ks, vs) = (src(tq, 1), src(tk, 2), src(tk, 3));
    let heads = |x: &Tensor| x.transpose(1, 2).unwrap();
    let (q, k, v) = (heads(&qs), heads(&ks), heads(&vs));
    assert!(!q.is_contiguous());
    device.manual_seed(4);
    let out = Tensor::fused_attention(&q, &k, &v, true, None, 0.2).unwrap();
    assert_eq!(out.shape(), &[b, h, tq, d]);
    assert_eq!(
        out.strides(),
        &[tq * h * d, d, h * d, 1],
        "[B, L, H, D] memory"
    );
    // The node saves the caller's views, not copies.
    let saved = out
        .grad_fn()
        .unwrap()
        .saved
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    for (s, x) in saved.iter().zip([&qs, &ks, &vs]) {
        assert!(s.shares_storage(x) && s.strides() == heads(x).strides());
    }
    let (got, _) = run(&out, [&qs, &ks, &vs]);
    // The strided leaves' gradients in [B, H, T, D] order.
    let got_grads: Vec<Vec<f64>> = [&qs, &ks, &vs]
        .iter()
        .map(|x| host(&heads(&x.grad().unwrap()).contiguous().unwrap()))
        .collect();
    // The same attention on dense copies: the same arithmetic, the same bits.
    let dense = |x: &Tensor| {
        heads(&x.detach())
            .contiguous()
            .unwrap()
            .requires_grad_(true)
    };
    let (qd, kd, vd) = (dense(&qs), dense(&ks), dense(&vs));
    device.manual_seed(4);
    let out_d = Tensor::fused_attention(&qd, &kd, &vd, true, None, 0.2).unwrap();
    let (want, want_grads) = run(&out_d, [&qd, &kd, &vd]);
    assert_eq!(got, want);
    assert_eq!(got_grads, want_grads);
}

/// The saved bytes of one `MultiheadAttention` forward (`d_model = 256`, 8 heads,
/// batch 16, 100 positions, dropout 0.1, training) on each backend, with the heads as
/// views (`MhaLayout::Views`: PyTorch's layout adds the same copies on both paths).
#[test]
fn a_multihead_attention_forward_saves_no_probabilities_mask_or_copies() {
    let _s = serial();
    let device = test_device();
    let (b, l, e, h) = (16, 100, 256, 8);
    let mut mha = MultiheadAttention::new(e, h, 0.1, &mut Rng::seeded(1), &device).unwrap();
    mha.layout = MhaLayout::Views;
    let x = Tensor::randn(&[b, l, e], 2, &device).unwrap();
    let saved = |backend| {
        let _backend = sdpa_kernel(backend);
        let out = mha.forward(&x).unwrap();
        retained_graph(&out).saved_bytes
    };
    let (math, fused) = (saved(SdpaBackend::Math), saved(SdpaBackend::Fused));
    println!("saved bytes of one attention forward: math {math}, fused {fused}");
    let activation = (b * l * e * 4) as u64; // one [B, L, E] float32
    let weights = (b * h * l * l) as u64; // one [B, H, L, L] element each
                                          // Both keep x, the packed projection weight, k and v,
                                          // and out_proj's weight.
                                          // The math path also keeps q scaled, the softmax, the dropout mask (a byte each),
                                          // the dropped weights and the copy of its output that out_proj reads; the fused
                                          // kernel keeps q, its output (which out_proj reads in place) and a log-sum-exp.
    let lse = (b * h * l * 4) as u64;
    // One activation more on the math path: its k and v are views of the packed
    // projection's [B, L, 3E] output, which keeps the query's third alive too (the
    // fused node saves all three thirds anyway, as it needs q).
    assert_eq!(
        math - fused,
        4 * weights + weights + 4 * weights - lse + activation
    );
    let common = activation // x
        + (3 * e * e * 4) as u64 // the packed in_proj weight, read in place
        + 2 * activation // k, v
        + (e * e * 4) as u64; // out_proj.weight
                              // q and the output, nothing else: before strided operands the node kept dense
                              // copies of q, k and v (the same bytes, the projections then freed) and out_proj
                              // a dense copy of the transposed output, one activation more.
    assert_eq!(fused, common + activation + activation + lse);
}

/// A training `nn.TransformerEncoderLayer` (dropout 0.1 on the attention weights) takes
/// the fused kernel: its forward stores exactly the attention's probabilities, dropped
/// weights and mask less than on the math path, and its backward runs (the heads as
/// views, as in the test above).
#[test]
fn a_training_transformer_layer_attends_through_the_fused_kernel() {
    use labs_core::nn::{TransformerConfig, TransformerEncoderLayer};
    let _s = serial();
    let device = test_device();
    let (b, l, e, h) = (16, 100, 256, 8);
    let mut layer =
        TransformerEncoderLayer::new(TransformerConfig::new(e, h), &mut Rng::seeded(1), &device)
            .unwrap();
    layer.self_attn.layout = MhaLayout::Views;
    let x = Tensor::randn(&[b, l, e], 2, &device).unwrap();
    let step = |backend| {
        let _backend = sdpa_kernel(backend);
        let out = layer.forward(&x).unwrap();
        let bytes = retained_graph(&out).saved_bytes;
        out.sum_all().unwrap().backward().unwrap();
        let grad = layer.self_attn.parameters()[0].grad().unwrap();
        assert!(host(&grad).iter().all(|g| g.is_finite()));
        layer.parameters().iter().for_each(|p| p.clear_grad());
        bytes
    };
    let (math, fused) = (step(SdpaBackend::Math), step(SdpaBackend::Fused));
    println!("saved bytes of a training encoder layer: math {math}, fused {fused}");
    let weights = (b * h * l * l) as u64;
    let lse = (b * h * l * 4) as u64;
    let activation = (b * l * e * 4) as u64;
    // As in the test above, the math path keeps the packed projection's query third.
    assert_eq!(math - fused, 9 * weights - lse + activation);
}

/// Values of another width than the keys are the math path's (the kernel needs one
/// head_dim): under the fused backend such a call falls back instead of failing.
#[test]
fn the_fused_backend_falls_back_for_values_of_another_width() {
    use labs_core::nn::scaled_dot_product_attention;
    let _s = serial();
    let device = test_device();
    let q = leaf([1, 2, 5, 8], 1, DType::F32, &device);
    let v = leaf([1, 2, 5, 4], 2, DType::F32, &device);
    let run = |backend| {
        let _backend = sdpa_kernel(backend);
        host(&scaled_dot_product_attention(&q, &q, &v, None, true, 0.0, true).unwrap())
    };
    assert_eq!(run(SdpaBackend::Fused), run(SdpaBackend::Math));
}
