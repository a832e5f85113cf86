//! Where our memory follows PyTorch's, allocation for allocation: `nn.MultiheadAttention`'s
//! copies around the heads (PyTorch's layout against the copy-free one: the same values
//! and gradients, more memory kept by exactly those copies), `relu`'s backward in one
//! output (`threshold_backward`), backward's order (the latest recorded ready node
//! first, which decides when saved tensors go), and a checkpointed region's inputs
//! freed once backward is through it.
//! Runs on the simulated GPU by default and on the GPU with `LABS_DEVICE=cuda`.

mod gradcheck;

use labs_core::kernels::UnaryOp;
use labs_core::nn::{MhaLayout, MultiheadAttention, Rng};
use labs_core::testing::{serial, test_device};
use labs_core::{Device, Tensor};

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 + 1e-4 * y.abs(),
            "{what}[{i}]: {x} against {y}"
        );
    }
}

/// One training forward and backward of `mha` on `x` (self-attention) or on `x` over
/// `memory` (a shared key and value): the output, every gradient, and the bytes the
/// graph keeps between forward and backward.
fn run(
    mha: &MultiheadAttention,
    x: &Tensor,
    memory: Option<&Tensor>,
    device: &Device,
) -> (Vec<f32>, Vec<Vec<f32>>, u64) {
    let alloc = device.allocator().unwrap();
    let before = alloc.memory_allocated();
    let kv = memory.unwrap_or(x);
    let y = mha.attend(x, kv, kv, None).unwrap();
    let kept = alloc.memory_allocated() - before - y.nbytes() as u64;
    y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
    let mut grads = vec![x.grad().unwrap().to_vec::<f32>().unwrap()];
    if let Some(m) = memory {
        grads.push(m.grad().unwrap().to_vec::<f32>().unwrap());
    }
    for p in [&mha.in_proj_weight, &mha.in_proj_bias, &mha.out_proj.weight] {
        grads.push(p.grad().unwrap().to_vec::<f32>().unwrap());
    }
    (y.to_vec::<f32>().unwrap(), grads, kept)
}

fn leaf(shape: &[usize], seed: u64, device: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(&gradcheck::values(n, seed, -1.0, 1.0), shape, device)
        .unwrap()
        .requires_grad_(true)
}

#[test]
fn pytorch_layout_keeps_its_copies_and_computes_what_views_compute() {
    let _serial = serial();
    let device = test_device();
    let (b, l, s, e) = (2, 8, 16, 64);
    // A [B, L, E] activation in float32.
    let act = (b * l * e * 4) as u64;
    let mem_act = (b * s * e * 4) as u64;
    for cross in [false, true] {
        let mut results = Vec::new();
        for layout in [MhaLayout::PyTorch, MhaLayout::Views] {
            let mut mha = MultiheadAttention::new(e, 4, 0.0, &mut Rng::seeded(3), &device).unwrap();
            mha.layout = layout;
            let x = leaf(&[b, l, e], 11, &device);
            let memory = cross.then(|| leaf(&[b, s, e], 12, &device));
            results.push(run(&mha, &x, memory.as_ref(), &device));
        }
        let (pt, views) = (&results[0], &results[1]);
        close(&pt.0, &views.0, "output");
        for (i, (g, h)) in pt.1.iter().zip(&views.1).enumerate() {
            close(g, h, &format!("gradient {i} (cross {cross})"));
        }
        // PyTorch's copies, each kept for backward: the input folded for the product
        // (the query's and, across, the memory's), and the heads' joined output
        // before `out_proj` (which the views' path copies too where the attention's
        // output is not laid out heads-last). Self-attention's packed projection is a
        // dense [3, L, B, E] copy where the views keep the product's output itself:
        // the same bytes.
        let folded = if cross { act + mem_act } else { act };
        let kept = pt.2 - views.2;
        assert!(
            (folded..=folded + act).contains(&kept),
            "cross {cross}: {kept} bytes kept beyond the views, not {folded} to {}",
            folded + act
        );
    }
}

#[test]
fn relu_backward_allocates_only_the_gradient() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let x = leaf(&[256, 64], 5, &device);
    let y = x.relu().unwrap();
    let g = Tensor::from_slice(
        &gradcheck::values(256 * 64, 6, -1.0, 1.0),
        &[256, 64],
        &device,
    )
    .unwrap();
    let base = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    y.backward_with(Some(g.clone()), false).unwrap();
    let grad = x.grad().unwrap();
    // One output the size of x (the gradient), nothing beside it.
    assert_eq!(alloc.max_memory_allocated() - base, grad.nbytes() as u64);
    let (xv, gv, dv) = (
        x.to_vec::<f32>().unwrap(),
        g.to_vec::<f32>().unwrap(),
        grad.to_vec::<f32>().unwrap(),
    );
    for i in 0..xv.len() {
        let expect = if xv[i] > 0.0 { gv[i] } else { 0.0 };
        assert_eq!(dv[i], expect, "element {i}");
    }
}

#[test]
fn mse_loss_keeps_only_its_operands_and_its_backward_writes_one_gradient() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let x = leaf(&[256, 64], 7, &device);
    let y = Tensor::from_slice(
        &gradcheck::values(256 * 64, 8, -1.0, 1.0),
        &[256, 64],
        &device,
    )
    .unwrap();
    let g = Tensor::from_slice(&[0.5f32], &[], &device).unwrap();
    let before = alloc.memory_allocated();
    let loss = x.mse_loss(&y).unwrap();
    // Forward leaves the loss alone: the difference it squared is not kept.
    assert_eq!(alloc.memory_allocated() - before, loss.allocation().size());
    let base = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    loss.backward_with(Some(g), false).unwrap();
    let grad = x.grad().unwrap();
    // One output the size of x (its gradient), nothing beside it.
    assert_eq!(alloc.max_memory_allocated() - base, grad.nbytes() as u64);
    let (xv, yv, dv) = (
        x.to_vec::<f32>().unwrap(),
        y.to_vec::<f32>().unwrap(),
        grad.to_vec::<f32>().unwrap(),
    );
    let scale = 2.0f32 / xv.len() as f32;
    for i in 0..xv.len() {
        let expect = scale * (xv[i] - yv[i]) * 0.5;
        assert!(
            (dv[i] - expect).abs() <= 1e-6 * expect.abs().max(1e-6),
            "element {i}"
        );
    }
}

/// Unpacks are logged by the length of the tensor unpacked.
fn logging_hooks(
    log: &std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
) -> labs_core::tensor::SavedTensorsHooksGuard {
    let log = log.clone();
    labs_core::autograd::saved_tensors_hooks(
        |t: &Tensor| Ok(Box::new(t.detach()) as labs_core::tensor::Packed),
        move |p: &labs_core::tensor::Packed| {
            let t = p.downcast_ref::<Tensor>().unwrap().clone();
            log.lock().unwrap().push(t.numel());
            Ok(t)
        },
    )
}

/// PyTorch's engine runs, of the nodes whose gradients are complete, the one recorded
/// last. A decoder branch recorded after the encoder (here fed by an input that needs
/// no gradient, as the decoder's target is) is thus differentiated, and what it saved
/// released, before the encoder's nodes; a depth-first order would leave it until the
/// end of the pass, its saved tensors alive all the way.
#[test]
fn backward_runs_the_latest_recorded_ready_node_first() {
    let _serial = serial();
    let device = test_device();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (x, a) = (leaf(&[2], 1, &device), leaf(&[2], 2, &device));
    let t = Tensor::from_slice(&gradcheck::values(3, 3, -1.0, 1.0), &[3], &device).unwrap();
    let b = leaf(&[3], 4, &device);
    let y = {
        let _hooks = logging_hooks(&log);
        // The encoder, recorded first: mul (saves x and a), tanh (saves its output).
        let e = x.mul(&a).unwrap().unary(UnaryOp::Tanh).unwrap();
        // The decoder, recorded after: mul (saves t), tanh; then a join that saves
        // nothing, the encoder's sum recorded before the decoder's.
        let d = t.mul(&b).unwrap().unary(UnaryOp::Tanh).unwrap();
        let e_sum = e.sum_all().unwrap();
        d.sum_all().unwrap().add(&e_sum).unwrap()
    };
    y.backward().unwrap();
    // The decoder's three-element tensors come back first, then the encoder's three
    // two-element ones.
    let log = log.lock().unwrap();
    assert!(log.ends_with(&[2, 2, 2]), "{log:?}");
    assert!(
        log[..log.len() - 3].iter().all(|&n| n == 3) && log.len() > 3,
        "{log:?}"
    );
}

/// What is allocated when the input's gradient arrives (the first layer's region, the
/// last of the pass) in a stack of `layers` checkpointed layers, over what was
/// allocated before the forward.
fn kept_at_the_last_region(layers: usize, device: &Device) -> u64 {
    let alloc = device.allocator().unwrap();
    let w = leaf(&[64, 64], 7, device);
    let x = leaf(&[256, 64], 8, device);
    let base = alloc.memory_allocated();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (hook_seen, hook_device) = (seen.clone(), device.clone());
    let _handle = x
        .register_post_accumulate_grad_hook(move |_| {
            let allocated = hook_device.allocator()?.memory_allocated();
            *hook_seen.lock().unwrap() = Some(allocated);
            Ok(())
        })
        .unwrap();
    let mut h = x.clone();
    for _ in 0..layers {
        let w = w.clone();
        h = labs_core::autograd::checkpoint(
            move |i: &[Tensor]| i[0].matmul(&w)?.unary(UnaryOp::Tanh),
            &[h],
        )
        .unwrap();
    }
    h.sum_all().unwrap().backward().unwrap();
    let at_hook = seen.lock().unwrap().expect("the input's gradient arrived");
    at_hook - base
}

/// A checkpointed region's inputs are freed once backward is through the region, as
/// PyTorch's are, not when the whole pass ends: at the last region's backward, a
/// stack of checkpointed layers keeps the same memory however many layers it has.
#[test]
fn a_checkpointed_region_frees_its_inputs_after_its_backward() {
    let _serial = serial();
    let device = test_device();
    let (two, six) = (
        kept_at_the_last_region(2, &device),
        kept_at_the_last_region(6, &device),
    );
    assert!(two > 0);
    assert_eq!(
        six, two,
        "the inputs of the layers already differentiated are freed"
    );
}
