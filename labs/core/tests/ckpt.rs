//! What a training step can give back: saved-tensor hooks, activation offload to pinned
//! host memory, activation checkpointing (full and selective). Gradients are compared
//! bit for bit with the run without hooks; memory by the allocator's categories. Runs
//! on the simulated GPU by default and on the GPU with `LABS_DEVICE=cuda`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use labs_core::alloc::Category;
use labs_core::autograd::{
    checkpoint, checkpoint_with, retained_graph, save_matmul_and_attention, save_on_cpu,
    saved_tensors_hooks, CheckpointOptions, OffloadOptions,
};
use labs_core::testing::{launch_count, launches, serial, test_device};
use labs_core::{Device, Tensor};

/// The parameters of a small MLP block, `x -> ln -> x W1 -> gelu -> dropout -> W2 ->
/// tanh + x`, width `d`, hidden `4d`.
#[derive(Clone)]
struct Block {
    w1: Tensor,
    w2: Tensor,
    ln_w: Tensor,
    p: f32,
}

impl Block {
    fn new(d: usize, p: f32, device: &Device) -> Block {
        let w = |shape: &[usize], seed| {
            Tensor::randn(shape, seed, device)
                .unwrap()
                .scale(0.1)
                .unwrap()
                .requires_grad_(true)
        };
        Block {
            w1: w(&[d, 4 * d], 11),
            w2: w(&[4 * d, d], 12),
            ln_w: Tensor::full(&[d], 1.0f32, device)
                .unwrap()
                .requires_grad_(true),
            p,
        }
    }

    fn forward(&self, x: &Tensor) -> labs_core::Result<Tensor> {
        let d = x.shape()[1];
        let h = x.layer_norm(&[d], Some(&self.ln_w), None, 1e-5)?;
        let h = h.matmul(&self.w1)?.gelu("none")?.dropout(self.p, true)?;
        h.matmul(&self.w2)?
            .unary(labs_core::kernels::UnaryOp::Tanh)?
            .add(x)
    }

    fn params(&self) -> [&Tensor; 3] {
        [&self.w1, &self.w2, &self.ln_w]
    }

    fn grads(&self) -> Vec<Vec<f32>> {
        (self.params().iter())
            .map(|p| p.grad().expect("a gradient").to_vec::<f32>().unwrap())
            .collect()
    }

    fn clear(&self) {
        for p in self.params() {
            p.clear_grad();
        }
    }
}

/// `sum(y * r)` for a fixed random `r` (so that no gradient is trivially 1).
fn loss(y: &Tensor) -> Tensor {
    let r = Tensor::randn(y.shape(), 99, y.device()).unwrap();
    y.mul(&r).unwrap().sum_all().unwrap()
}

/// Runs `layers` blocks (the same parameters) on `x` through `run`, backward, and
/// returns the parameters' and the input's gradients.
fn step(
    block: &Block,
    x: &Tensor,
    layers: usize,
    run: &dyn Fn(&Block, &Tensor) -> Tensor,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    block.clear();
    x.device().manual_seed(7);
    let x = x.detach().requires_grad_(true);
    let mut h = x.clone();
    for _ in 0..layers {
        h = run(block, &h);
    }
    loss(&h).backward().unwrap();
    (block.grads(), x.grad().unwrap().to_vec::<f32>().unwrap())
}

type Grads = (Vec<Vec<f32>>, Vec<f32>);

/// Bit-equal gradients, or a panic naming the first difference (not the whole lists).
fn assert_same(a: &Grads, b: &Grads, what: &str) {
    let flat = |g: &Grads| -> Vec<u32> {
        g.0.iter()
            .flatten()
            .chain(&g.1)
            .map(|v| v.to_bits())
            .collect()
    };
    let (fa, fb) = (flat(a), flat(b));
    assert_eq!(fa.len(), fb.len(), "{what}: gradient lengths");
    if let Some(i) = (0..fa.len()).find(|&i| fa[i] != fb[i]) {
        panic!(
            "{what}: element {i} of the flattened gradients: {} vs {}",
            f32::from_bits(fa[i]),
            f32::from_bits(fb[i])
        );
    }
}

fn activation_bytes(device: &Device) -> u64 {
    device.allocator().unwrap().stats().by_category[Category::Activation.index()].current
}

fn activation_peak(device: &Device) -> u64 {
    device.allocator().unwrap().stats().by_category[Category::Activation.index()].peak
}

#[test]
fn hooks_see_every_saved_tensor_and_nest_innermost_first() {
    let _s = serial();
    let device = test_device();
    let block = Block::new(16, 0.0, &device);
    let x = Tensor::randn(&[8, 16], 1, &device).unwrap();
    let plain = step(&block, &x, 1, &|b, x| b.forward(x).unwrap());

    let (outer_packs, inner_packs, unpacks) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let counting = |packs: &Arc<AtomicUsize>| {
        let (packs, unpacks) = (packs.clone(), unpacks.clone());
        saved_tensors_hooks(
            move |t: &Tensor| {
                packs.fetch_add(1, Ordering::SeqCst);
                Ok(Box::new(t.detach()) as labs_core::tensor::Packed)
            },
            move |p: &labs_core::tensor::Packed| {
                unpacks.fetch_add(1, Ordering::SeqCst);
                Ok(p.downcast_ref::<Tensor>().unwrap().clone())
            },
        )
    };
    let hooked = {
        let _outer = counting(&outer_packs);
        step(&block, &x, 1, &|b, x| {
            let _inner = counting(&inner_packs);
            b.forward(x).unwrap()
        })
    };
    assert_same(&plain, &hooked, "identity hooks change nothing");
    // The block saves: layer norm (x, mean, rstd, weight), matmul (2), gelu (1),
    // dropout (none at p = 0: it returns its input), matmul (2), tanh (1), add (none).
    let inner = inner_packs.load(Ordering::SeqCst);
    assert_eq!(
        inner, 10,
        "every tensor the block saved went through the inner pack"
    );
    // The loss (mul by r: saves both operands) was recorded under the outer hooks only.
    assert_eq!(outer_packs.load(Ordering::SeqCst), 2);
    assert_eq!(
        unpacks.load(Ordering::SeqCst),
        inner + 2,
        "each unpacked once"
    );
}

#[test]
fn a_failing_pack_hook_is_reported_by_backward() {
    let _s = serial();
    let device = test_device();
    let a = Tensor::randn(&[4], 1, &device)
        .unwrap()
        .requires_grad_(true);
    let y = {
        let _h = saved_tensors_hooks(
            |_: &Tensor| Err(labs_core::Error::InvalidArgument("no room".into())),
            |_: &labs_core::tensor::Packed| unreachable!(),
        );
        a.mul(&a).unwrap().sum_all().unwrap()
    };
    let e = y.backward().unwrap_err().to_string();
    assert!(e.contains("pack hook") && e.contains("no room"), "{e}");
}

#[test]
fn checkpointing_gives_bit_equal_gradients_with_dropout() {
    let _s = serial();
    let device = test_device();
    let block = Block::new(32, 0.3, &device);
    let x = Tensor::randn(&[16, 32], 2, &device).unwrap();
    let plain = step(&block, &x, 3, &|b, x| b.forward(x).unwrap());
    let rng_after_plain = device.rng_state();
    let checked = step(&block, &x, 3, &|b, x| {
        let b = b.clone();
        checkpoint(move |xs| b.forward(&xs[0]), std::slice::from_ref(x)).unwrap()
    });
    assert_same(&plain, &checked, "gradients differ bit for bit");
    // The recomputations put the generator back: it ends where the plain run left it.
    assert_eq!(device.rng_state(), rng_after_plain);
    let selective = step(&block, &x, 3, &|b, x| {
        let b = b.clone();
        let options = CheckpointOptions {
            policy: Some(Arc::new(save_matmul_and_attention)),
        };
        checkpoint_with(
            move |xs| b.forward(&xs[0]),
            std::slice::from_ref(x),
            options,
        )
        .unwrap()
    });
    assert_same(
        &plain,
        &selective,
        "selective checkpointing changes gradients",
    );
}

#[test]
fn checkpointing_lowers_the_activation_peak_by_the_region_internals() {
    let _s = serial();
    let device = test_device();
    let (n, d) = (64, 64);
    let block = Block::new(d, 0.1, &device);
    let x = Tensor::randn(&[n, d], 4, &device).unwrap();
    let allocator = device.allocator().unwrap();

    // The region's internal saved bytes: what one block's graph saved, measured.
    let internal = {
        let xi = x.detach().requires_grad_(true);
        let y = block.forward(&xi).unwrap();
        retained_graph(&y).saved_bytes
    };
    assert!(
        internal > (n * 4 * d * 4) as u64,
        "the block saves its hidden layer"
    );

    let peak = |run: &dyn Fn(&Block, &Tensor) -> Tensor| -> u64 {
        allocator.reset_peak_stats();
        let base = activation_bytes(&device);
        step(&block, &x, 4, run);
        activation_peak(&device) - base
    };
    let plain = peak(&|b, x| b.forward(x).unwrap());
    let checked = peak(&|b, x| {
        let b = b.clone();
        checkpoint(move |xs| b.forward(&xs[0]), std::slice::from_ref(x)).unwrap()
    });
    assert!(
        checked + internal <= plain,
        "checkpointed peak {checked} + one region's internals {internal} > plain {plain}"
    );
    let selective = peak(&|b, x| {
        let b = b.clone();
        let options = CheckpointOptions {
            policy: Some(Arc::new(save_matmul_and_attention)),
        };
        checkpoint_with(
            move |xs| b.forward(&xs[0]),
            std::slice::from_ref(x),
            options,
        )
        .unwrap()
    });
    assert!(
        checked < selective && selective < plain,
        "selective ({selective}) lies between full checkpointing ({checked}) and none ({plain})"
    );
}

/// The weights of `relu(x W1) W2` (width `d`, hidden `4d`) and an input of `n` rows.
fn relu_mlp(n: usize, d: usize, device: &Device) -> (Tensor, Tensor, Tensor) {
    let w = |shape: &[usize], seed| {
        Tensor::randn(shape, seed, device)
            .unwrap()
            .requires_grad_(true)
    };
    let x = Tensor::randn(&[n, d], 23, device).unwrap();
    (w(&[d, 4 * d], 21), w(&[4 * d, d], 22), x)
}

/// As PyTorch's selective checkpointing, the policy keeps the outputs of the ops it
/// saves whether or not backward saves them: `relu(x W1) W2` keeps `x W1` (which only
/// relu reads, and relu saves its own output) beyond what full checkpointing keeps.
#[test]
fn selective_checkpointing_keeps_the_saved_ops_outputs() {
    let _s = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let (n, d) = (64, 32);
    let (w1, w2, x) = relu_mlp(n, d, &device);
    let kept_after_forward = |policy: Option<labs_core::autograd::PolicyFn>| {
        let (w1, w2) = (w1.clone(), w2.clone());
        let before = alloc.memory_allocated();
        let y = checkpoint_with(
            move |xs| xs[0].matmul(&w1)?.relu()?.matmul(&w2),
            std::slice::from_ref(&x),
            CheckpointOptions { policy },
        )
        .unwrap();
        let kept = alloc.memory_allocated() - before;
        y.sum_all().unwrap().backward().unwrap();
        kept
    };
    let full = kept_after_forward(None);
    let selective = kept_after_forward(Some(Arc::new(save_matmul_and_attention)));
    // The hidden product x W1 (n x 4d floats); the output x W1' W2 is the caller's in
    // both runs.
    assert_eq!(selective - full, (n * 4 * d * 4) as u64);
}

/// A copy made inside the region from an input that needs no gradient (as a model's
/// first layer folds its batch for a product) has no graph: autograd cannot say which
/// op made it, and the product that saves it did not. The policy recomputes it, as
/// PyTorch's recomputes the copy op; only the product's own output is kept.
#[test]
fn selective_checkpointing_recomputes_a_copy_of_an_input_without_a_graph() {
    let _s = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let (n, d) = (64, 32);
    let (w1, w2, _) = relu_mlp(n, d, &device);
    // Transposed, so that the region's first op makes a dense copy.
    let x = Tensor::randn(&[d, n], 24, &device).unwrap();
    let run = |policy: Option<labs_core::autograd::PolicyFn>| {
        let (w1c, w2c) = (w1.clone(), w2.clone());
        w1.clear_grad();
        w2.clear_grad();
        let before = alloc.memory_allocated();
        let y = checkpoint_with(
            move |xs| {
                let folded = xs[0].transpose(0, 1)?.contiguous()?;
                folded.matmul(&w1c)?.relu()?.matmul(&w2c)
            },
            std::slice::from_ref(&x),
            CheckpointOptions { policy },
        )
        .unwrap();
        let kept = alloc.memory_allocated() - before;
        y.sum_all().unwrap().backward().unwrap();
        let grads = [&w1, &w2].map(|w| w.grad().unwrap().to_vec::<f32>().unwrap());
        (kept, grads)
    };
    let (full, full_grads) = run(None);
    let (selective, selective_grads) = run(Some(Arc::new(save_matmul_and_attention)));
    // The hidden product (n x 4d floats) only, not the n x d copy it was made from.
    assert_eq!(selective - full, (n * 4 * d * 4) as u64);
    assert_eq!(selective_grads, full_grads);
}

/// The selective recomputation hands the kept products their outputs instead of
/// running them: backward through a selectively checkpointed `relu(x W1) W2` launches
/// the products of full checkpointing's backward less the two forward ones.
#[test]
fn selective_recomputation_skips_the_kept_products() {
    let _s = serial();
    let device = test_device();
    let (w1, w2, x) = relu_mlp(64, 32, &device);
    let backward_gemms = |policy: Option<labs_core::autograd::PolicyFn>| {
        let (w1, w2) = (w1.clone(), w2.clone());
        let y = checkpoint_with(
            move |xs| xs[0].matmul(&w1)?.relu()?.matmul(&w2),
            std::slice::from_ref(&x),
            CheckpointOptions { policy },
        )
        .unwrap();
        let loss = y.sum_all().unwrap();
        let (_, seen) = launches(&device, || loss.backward().unwrap());
        launch_count(&seen, "Gemm")
    };
    let full = backward_gemms(None);
    let selective = backward_gemms(Some(Arc::new(save_matmul_and_attention)));
    assert_eq!(full - selective, 2, "full {full}, selective {selective}");
}

#[test]
fn offload_moves_saved_activations_off_the_device_and_back() {
    let _s = serial();
    let device = test_device();
    // 256 x 256 float32: 256 KiB activations, 1 MiB hidden ones.
    let (n, d) = (256, 256);
    let block = Block::new(d, 0.2, &device);
    let x = Tensor::randn(&[n, d], 5, &device).unwrap();
    let plain = step(&block, &x, 3, &|b, x| b.forward(x).unwrap());

    // In forward: activations of the hooked run stay on the host.
    let options = OffloadOptions {
        min_bytes: 64 << 10,
        // No copy in flight beside the newest: forward waits for each, and the
        // results stay exact.
        max_in_flight_bytes: 0,
        ..OffloadOptions::default()
    };
    let base = activation_bytes(&device);
    let allocator = device.allocator().unwrap();
    let deferred = allocator.stats().num_deferred_frees;
    block.clear();
    device.manual_seed(7);
    let (y, hooks) = {
        let (_guard, hooks) = save_on_cpu(options);
        let xi = x.detach().requires_grad_(true);
        let mut h = xi.clone();
        for _ in 0..3 {
            h = block.forward(&h).unwrap();
        }
        (h, hooks)
    };
    let stats = hooks.stats();
    assert!(stats.offloaded >= 3 * 5, "{stats:?}");
    // Left on the device: the layer norms' mean and rstd (1 KiB each) and the
    // parameters (already counted as such); nothing of the offloaded bytes.
    let on_device = activation_bytes(&device) - base;
    assert!(
        on_device < 16 << 10,
        "{on_device} bytes of activations on the device after an offloaded forward"
    );
    assert!(stats.offloaded_bytes > 3 * (n * 4 * d * 4) as u64);
    // What the graph keeps on the device: the parameters, and what is below the
    // threshold: the layer norm's weight (1 KiB, one storage for the three blocks) and
    // each layer norm's mean and rstd (float32 per row); nothing offloaded.
    let kept = block.w1.nbytes() + block.w2.nbytes() + block.ln_w.nbytes() + 3 * 2 * n * 4;
    assert_eq!(retained_graph(&y).saved_bytes, kept as u64);
    // The host does not wait for the copies, and no free waits for the copy stream
    // (`record_stream`): the hooks hold each tensor being copied and let go of it once
    // the compute stream has waited for its copy (all but the newest, with no bytes
    // allowed in flight).
    drop(y);
    assert_eq!(allocator.stats().num_deferred_frees, deferred);
    assert_eq!(stats.compute_waits, stats.offloaded - 1, "{stats:?}");

    let offloaded = step(&block, &x, 3, &|b, x| {
        // One guard per block, as a training loop wraps its model.
        let (_guard, _) = save_on_cpu(options);
        b.forward(x).unwrap()
    });
    assert_same(&plain, &offloaded, "offloading changes gradients");
}

/// A weight used transposed (as `linear` and a tied LM head use theirs) or in part (as
/// a packed projection's query, key and value) is saved as a view: not a leaf, but its
/// memory is the parameter's. Offloading it would copy the weight out and bring a
/// second copy back in backward; the hooks leave it where it is.
#[test]
fn offload_leaves_views_of_parameters_on_the_device() {
    let _s = serial();
    let device = test_device();
    let w = Tensor::randn(&[256, 256], 3, &device).unwrap();
    w.set_category(Category::Parameter).unwrap();
    let w = w.requires_grad_(true);
    let x = Tensor::randn(&[128, 256], 4, &device).unwrap();
    let forward = |x: &Tensor| {
        let y1 = x.matmul(&w.transpose(0, 1).unwrap()).unwrap();
        let part = w.narrow(0, 0, 128).unwrap();
        let y2 = x.narrow(1, 0, 128).unwrap().matmul(&part).unwrap();
        y1.add(&y2).unwrap().sum_all().unwrap()
    };
    forward(&x).backward().unwrap();
    let plain = w.grad().unwrap().to_vec::<f32>().unwrap();
    w.clear_grad();
    let options = OffloadOptions {
        min_bytes: 0,
        time_copies: true,
        ..OffloadOptions::default()
    };
    let (loss, hooks) = {
        let (_guard, hooks) = save_on_cpu(options);
        (forward(&x), hooks)
    };
    let stats = hooks.stats();
    // The input and its part went to the host; the two views of the weight stayed.
    assert_eq!((stats.offloaded, stats.kept_on_device), (2, 2), "{stats:?}");
    assert_eq!(stats.offloaded_bytes, (128 * 256 + 128 * 128) * 4);
    // The part is a view of the input's storage: one copy carried both.
    assert_eq!(stats.copied_out_bytes, 128 * 256 * 4, "{stats:?}");
    loss.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), plain);
    // The storage was copied out and back once, each copy timed on the copy stream.
    device.synchronize().unwrap();
    let times = hooks.take_copy_times().unwrap();
    assert_eq!(times.copies, 2, "{times:?}");
    assert!(times.out_ms > 0.0 && times.back_ms > 0.0, "{times:?}");
    assert_eq!(hooks.take_copy_times().unwrap().copies, 0);
}

/// The host runs ahead of the device: a spin holds the compute stream back while the
/// host queues a whole offloaded step, as a GPU's host queues kernels faster than they
/// run. Every offloaded tensor is then still being copied when the forward pass lets go
/// of it. Freed with `record_stream`, such a block stays pending until the host sees
/// its copy end, and the step's requests meanwhile grow the cache by the whole offloaded
/// volume; the hooks instead hold it while in flight and make the compute stream wait
/// for the copy, so its memory is reused in stream order and the step reserves about
/// what it allocates.
#[test]
fn offload_reserves_what_it_allocates_while_the_host_runs_ahead() {
    let _s = serial();
    let device = test_device();
    // 512 x 256 float32 activations (512 KiB), 2 MiB hidden ones: 12 layers offload
    // about 74 MiB.
    let (n, d, layers) = (512, 256, 12);
    let block = Block::new(d, 0.1, &device);
    let x = Tensor::randn(&[n, d], 9, &device).unwrap();
    let plain = step(&block, &x, layers, &|b, x| b.forward(x).unwrap());
    let compute = device.default_stream().unwrap();
    // Spins in place, so on a tensor of its own.
    let busy = Tensor::zeros(&[1 << 10], labs_core::DType::F32, &device).unwrap();
    let spin =
        labs_core::timing::calibrate_spin(&busy, &compute, Duration::from_millis(400)).unwrap();
    let options = OffloadOptions {
        min_bytes: 64 << 10,
        max_in_flight_bytes: 8 << 20,
        ..OffloadOptions::default()
    };
    let allocator = device.allocator().unwrap();
    let deferred = allocator.stats().num_deferred_frees;
    device.synchronize().unwrap();
    allocator.empty_cache().unwrap();
    allocator.reset_peak_stats();
    let (allocated, reserved) = (allocator.memory_allocated(), allocator.memory_reserved());
    busy.spin_on(spin, &compute).unwrap();
    let (guard, hooks) = save_on_cpu(options);
    let offloaded = step(&block, &x, layers, &|b, x| b.forward(x).unwrap());
    drop(guard);
    let stats = hooks.stats();
    assert_same(&plain, &offloaded, "offloading while the host runs ahead");
    assert!(stats.offloaded_bytes > 64 << 20, "{stats:?}");
    let peak_allocated = allocator.max_memory_allocated() - allocated;
    let peak_reserved = allocator.max_memory_reserved() - reserved;
    // On the simulated GPU: 22 MiB reserved for 10 MiB allocated (a 20 MiB segment and
    // a 2 MiB one of PyTorch's defaults); 80 MiB with the blocks recorded on the copy
    // stream.
    assert!(
        peak_reserved < peak_allocated + (24 << 20),
        "an offloaded step reserved {} MiB for a peak of {} MiB allocated ({stats:?})",
        peak_reserved >> 20,
        peak_allocated >> 20
    );
    // No free waited for the copy stream: nothing was recorded on it.
    assert_eq!(allocator.stats().num_deferred_frees, deferred);
}

#[test]
fn offload_prefetches_the_next_node_while_one_is_unpacked() {
    let _s = serial();
    let device = test_device();
    let block = Block::new(128, 0.0, &device);
    let x = Tensor::randn(&[128, 128], 6, &device).unwrap();
    let plain = step(&block, &x, 2, &|b, x| b.forward(x).unwrap());
    for prefetch in [true, false] {
        let options = OffloadOptions {
            min_bytes: 0,
            prefetch,
            ..OffloadOptions::default()
        };
        let (guard, hooks) = save_on_cpu(options);
        let got = step(&block, &x, 2, &|b, x| b.forward(x).unwrap());
        drop(guard);
        assert_same(&plain, &got, "offload");
        let s = hooks.stats();
        // Parameters stay: w1 and w2 of each of the two blocks (the layer norm saves
        // its weight without its graph, so it travels like any tensor).
        assert_eq!(s.kept_on_device, 2 * 2, "the parameters stay on the device");
        assert_eq!(s.prefetched + s.fetched_on_demand, s.offloaded);
        if prefetch {
            // Every node's tensors were on their way back before it was reached: the
            // first one's since the loss's sum (which saves nothing) was processed.
            assert_eq!(s.fetched_on_demand, 0, "{s:?}");
        } else {
            assert_eq!(s.prefetched, 0);
        }
    }
}

/// A share of the saved bytes goes to the host, spread through forward: the bytes sent
/// stay within the share of those that could have gone, and never lag it by more than
/// one tensor; backward still finds every sent tensor on its way back, however many
/// kept nodes lie between two that sent one.
#[test]
fn offload_of_a_share_sends_that_share_spread_through_forward() {
    let _s = serial();
    let device = test_device();
    let block = Block::new(128, 0.0, &device);
    let x = Tensor::randn(&[128, 128], 6, &device).unwrap();
    let layers = 8;
    let plain = step(&block, &x, layers, &|b, x| b.forward(x).unwrap());
    let all = {
        let (guard, hooks) = save_on_cpu(OffloadOptions {
            min_bytes: 0,
            ..OffloadOptions::default()
        });
        step(&block, &x, layers, &|b, x| b.forward(x).unwrap());
        drop(guard);
        hooks.stats()
    };
    assert_eq!(all.kept_for_share, 0, "{all:?}");
    for share in [0.5, 0.25] {
        let options = OffloadOptions {
            min_bytes: 0,
            share,
            ..OffloadOptions::default()
        };
        let (guard, hooks) = save_on_cpu(options);
        let got = step(&block, &x, layers, &|b, x| b.forward(x).unwrap());
        drop(guard);
        assert_same(&plain, &got, "offload of a share");
        let s = hooks.stats();
        // The same tensors could go as with everything sent; a share of their bytes did.
        assert_eq!(s.offloaded + s.kept_for_share, all.offloaded, "{s:?}");
        assert_eq!(
            s.offloaded_bytes + s.kept_for_share_bytes,
            all.offloaded_bytes
        );
        // The share is kept over storages (none of this block's saved tensors is a
        // view of another's, but some are saved by two ops and count once).
        let could = s.share_could_bytes as f64;
        assert!(could > 0.0 && could <= all.offloaded_bytes as f64, "{s:?}");
        let largest = (128 * 4 * 128 * 4) as f64; // the hidden activation
        assert!(s.share_sent_bytes as f64 <= share * could, "{share}: {s:?}");
        assert!(
            s.share_sent_bytes as f64 >= share * could - largest,
            "{share}: {s:?}"
        );
        // Every sent tensor was on its way back before backward reached its node.
        assert_eq!(s.prefetched, s.offloaded, "{share}: {s:?}");
        assert_eq!(s.fetched_on_demand, 0, "{share}: {s:?}");
    }
}

/// With a share, a storage's fate is one: the views of a storage all go or all stay
/// (sending one of two views frees nothing), a storage counts once however many saved
/// tensors name it, and every forward pass counts afresh, so every step sends the same
/// tensors.
#[test]
fn offload_share_is_kept_over_storages_afresh_each_forward() {
    let _s = serial();
    let device = test_device();
    let (n, d) = (64, 64);
    let w = Tensor::randn(&[d, 96], 21, &device)
        .unwrap()
        .scale(0.1)
        .unwrap()
        .requires_grad_(true);
    let x = Tensor::randn(&[n, d], 22, &device).unwrap();
    // Each layer: h = x W (n x 96), then two overlapping views of h, a = h[:, 0..64]
    // and b = h[:, 32..96], multiplied: mul saves both views, the next product saves
    // mul's output. Storages that could go, per forward: x, four h, four products
    // (the loss saves the last, and its random weights).
    let layers = 4;
    let f32s = 4;
    let h_storage = (n * 96 * f32s) as u64;
    let plain_storage = (n * d * f32s) as u64;
    let could_per_forward =
        plain_storage + layers as u64 * (h_storage + plain_storage) + plain_storage;
    let run = || {
        w.clear_grad();
        let mut h = x.clone();
        for _ in 0..layers {
            let p = h.matmul(&w).unwrap();
            let a = p.narrow(1, 0, d).unwrap();
            let b = p.narrow(1, 32, d).unwrap();
            h = a.mul(&b).unwrap();
        }
        loss(&h).backward().unwrap();
        w.grad().unwrap().to_vec::<f32>().unwrap()
    };
    let plain = run();
    let (guard, hooks) = save_on_cpu(OffloadOptions {
        min_bytes: 0,
        share: 0.5,
        ..OffloadOptions::default()
    });
    let mut steps = Vec::new();
    for _ in 0..3 {
        let before = hooks.stats();
        let got = run();
        let after = hooks.stats();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&plain), bits(&got), "gradients under a share");
        steps.push((
            after.offloaded - before.offloaded,
            after.offloaded_bytes - before.offloaded_bytes,
            after.share_sent_bytes - before.share_sent_bytes,
            after.share_could_bytes - before.share_could_bytes,
        ));
    }
    drop(guard);
    assert!(
        steps.iter().all(|s| *s == steps[0]),
        "every step the same: {steps:?}"
    );
    let (tensors, handed, sent, could) = steps[0];
    assert_eq!(
        could, could_per_forward,
        "each storage counted once: {steps:?}"
    );
    assert!(sent as f64 <= 0.5 * could as f64 && sent > 0, "{steps:?}");
    // A sent h storage hands two views of 64 columns (its 96 columns counted); any
    // other sent storage hands itself. Whole storages went iff the counts agree.
    let view = plain_storage;
    let h_sent = (handed - sent) / (2 * view - h_storage);
    let others_sent = (sent - h_sent * h_storage) / plain_storage;
    assert!(h_sent > 0, "an h storage went: {steps:?}");
    assert_eq!(
        h_sent * h_storage + others_sent * plain_storage,
        sent,
        "{steps:?}"
    );
    assert_eq!(tensors as u64, 2 * h_sent + others_sent, "{steps:?}");
}

#[test]
fn offload_without_pinned_memory_is_a_plain_copy() {
    let _s = serial();
    let device = test_device();
    let block = Block::new(64, 0.2, &device);
    let x = Tensor::randn(&[64, 64], 7, &device).unwrap();
    let plain = step(&block, &x, 2, &|b, x| b.forward(x).unwrap());
    let options = OffloadOptions {
        pin_memory: false,
        min_bytes: 0,
        prefetch: true,
        ..OffloadOptions::default()
    };
    let (guard, hooks) = save_on_cpu(options);
    let got = step(&block, &x, 2, &|b, x| b.forward(x).unwrap());
    drop(guard);
    assert_same(&plain, &got, "pageable offload");
    assert!(hooks.stats().offloaded > 0);
}

/// Two passes through a retained graph: each unpacks again (a checkpointed region is
/// recomputed again, an offloaded tensor copied back again), so the gradients are
/// those of two passes without hooks, bit for bit.
#[test]
fn a_retained_graph_unpacks_again_on_the_second_pass() {
    let _s = serial();
    let device = test_device();
    let block = Block::new(32, 0.3, &device);
    let x = Tensor::randn(&[16, 32], 8, &device).unwrap();
    let twice_of = |run: &dyn Fn(&Block, &Tensor) -> Tensor| -> Grads {
        block.clear();
        device.manual_seed(7);
        let xi = x.detach().requires_grad_(true);
        let mut h = xi.clone();
        for _ in 0..2 {
            h = run(&block, &h);
        }
        let l = loss(&h);
        l.backward_with(None, true).unwrap();
        l.backward_with(None, false).unwrap();
        let e = l.backward().unwrap_err().to_string();
        assert!(e.contains("second time"), "{e}");
        (block.grads(), xi.grad().unwrap().to_vec::<f32>().unwrap())
    };
    let want = twice_of(&|b, x| b.forward(x).unwrap());
    let checked = twice_of(&|b, x| {
        let b = b.clone();
        checkpoint(move |xs| b.forward(&xs[0]), std::slice::from_ref(x)).unwrap()
    });
    assert_same(&want, &checked, "checkpointing, retained");
    let offloaded = twice_of(&|b, x| {
        let (_guard, _) = save_on_cpu(OffloadOptions {
            min_bytes: 0,
            ..OffloadOptions::default()
        });
        b.forward(x).unwrap()
    });
    assert_same(&want, &offloaded, "offload, retained");
}

/// A checkpointed region around the fused attention kernel, selective or not, gives
/// the gradients of the plain run bit for bit.
#[test]
fn checkpointing_a_fused_attention_region() {
    let _s = serial();
    let device = test_device();
    let (b, h, t, d) = (1, 2, 17, 8);
    let q = Tensor::randn(&[b, h, t, d], 21, &device)
        .unwrap()
        .requires_grad_(true);
    let region = |xs: &[Tensor]| -> labs_core::Result<Tensor> {
        let a = Tensor::fused_attention(&xs[0], &xs[0], &xs[0], true, None, 0.0)?;
        a.gelu("tanh")?.mul(&xs[0])
    };
    let grads = |options: Option<CheckpointOptions>| -> Vec<f32> {
        q.clear_grad();
        let x = q.scale(0.5).unwrap();
        let y = match options {
            None => region(std::slice::from_ref(&x)).unwrap(),
            Some(o) => checkpoint_with(region, std::slice::from_ref(&x), o).unwrap(),
        };
        loss(&y).backward().unwrap();
        q.grad().unwrap().to_vec::<f32>().unwrap()
    };
    let plain = grads(None);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for policy in [None, Some(Arc::new(save_matmul_and_attention) as _)] {
        let got = grads(Some(CheckpointOptions { policy }));
        assert_eq!(bits(&plain), bits(&got));
    }
}
