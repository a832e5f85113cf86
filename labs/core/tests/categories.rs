//! Allocation categories: what each byte of a training step holds (parameters,
//! gradients, activations saved for backward, temporaries …), kept by the allocator as
//! the step runs. Runs on the simulated GPU by default and on the GPU with
//! `LABS_DEVICE=cuda`.

use labs_core::alloc::Category;
use labs_core::testing::{serial, test_device};
use labs_core::{Device, Tensor};

/// Bytes allocated now in each category.
fn by_category(device: &Device) -> [u64; Category::COUNT] {
    let mut out = [0; Category::COUNT];
    for (c, stat) in device.allocator().unwrap().memory_by_category() {
        out[c.index()] = stat.current;
    }
    out
}

fn bytes(device: &Device, c: Category) -> u64 {
    by_category(device)[c.index()]
}

#[test]
fn raw_allocations_take_the_scope_and_default_to_other() {
    let _s = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    let stream = d.default_stream().unwrap();
    let before = by_category(&d);
    let other = a.malloc(1 << 20, &stream).unwrap();
    let state = {
        let _scope = Category::OptimizerState.scope();
        a.malloc(3 << 20, &stream).unwrap()
    };
    assert_eq!(a.category(&other).unwrap(), Category::Other);
    assert_eq!(a.category(&state).unwrap(), Category::OptimizerState);
    let after = by_category(&d);
    assert_eq!(
        after[Category::Other.index()] - before[Category::Other.index()],
        other.size()
    );
    assert_eq!(
        after[Category::OptimizerState.index()] - before[Category::OptimizerState.index()],
        state.size()
    );
    // Moving a block moves its bytes, and freeing takes them from its last category.
    a.set_category(&other, Category::Input).unwrap();
    assert_eq!(
        bytes(&d, Category::Input) - before[Category::Input.index()],
        other.size()
    );
    assert_eq!(bytes(&d, Category::Other), before[Category::Other.index()]);
    a.free(other).unwrap();
    a.free(state).unwrap();
    assert_eq!(by_category(&d), before);
    a.check_invariants().unwrap();
    // A freed handle has no category any more.
    assert!(a.category(&other).is_err());
}

#[test]
fn a_training_step_is_split_into_parameters_activations_and_gradients() {
    let _s = serial();
    let d = test_device();
    let base = by_category(&d);
    let delta = |c: Category| bytes(&d, c) - base[c.index()];
    let w = {
        let _p = Category::Parameter.scope();
        Tensor::full(&[64, 64], 0.01f32, &d)
            .unwrap()
            .requires_grad_(true)
    };
    let x = Tensor::full(&[32, 64], 1.0f32, &d).unwrap();
    x.set_category(Category::Input).unwrap();
    assert_eq!(w.category().unwrap(), Category::Parameter);
    assert_eq!(delta(Category::Parameter), w.nbytes() as u64);
    assert_eq!(delta(Category::Input), x.nbytes() as u64);

    // relu saves its output (as PyTorch does); matmul saves x (an input) and w (a
    // parameter), which keep their categories.
    let h = x.matmul(&w).unwrap();
    assert_eq!(h.category().unwrap(), Category::Temporary);
    let r = h.relu().unwrap();
    assert_eq!(r.category().unwrap(), Category::Activation);
    assert_eq!(h.category().unwrap(), Category::Temporary);
    assert_eq!(x.category().unwrap(), Category::Input);
    assert_eq!(w.category().unwrap(), Category::Parameter);
    assert_eq!(delta(Category::Activation), r.nbytes() as u64);
    let loss = r.sum_all().unwrap();
    drop((h, r));
    // The graph still holds relu's output: it stays counted as an activation.
    assert_eq!(delta(Category::Activation), (32 * 64 * 4) as u64);

    loss.backward().unwrap();
    let g = w.grad().expect("w has a gradient");
    assert_eq!(g.category().unwrap(), Category::Gradient);
    assert_eq!(delta(Category::Gradient), g.nbytes() as u64);
    // Backward released what the graph saved.
    assert_eq!(delta(Category::Activation), 0);
    drop((g, loss));
    w.clear_grad();
    assert_eq!(delta(Category::Gradient), 0);
    drop((w, x));
    assert_eq!(by_category(&d), base);
    let total: u64 = by_category(&d).iter().sum();
    assert_eq!(total, d.allocator().unwrap().memory_allocated());
}

#[test]
fn categories_appear_in_memory_stats_and_live_blocks() {
    let _s = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    let t = {
        let _scope = Category::Parameter.scope();
        Tensor::zeros(&[1000], labs_core::DType::F32, &d).unwrap()
    };
    let stats = a.memory_stats();
    assert!(stats["allocated_bytes.category.parameter.current"] >= t.nbytes() as u64);
    assert!(
        stats["allocated_bytes.category.parameter.peak"]
            >= stats["allocated_bytes.category.parameter.current"]
    );
    let table = a.stats().category_summary();
    assert_eq!(table.lines().count(), Category::COUNT + 1, "{table}");
    assert!(
        table.lines().any(|l| l.starts_with("parameter ")),
        "{table}"
    );
    let live = a.live_blocks();
    let mine = live.iter().find(|b| b.addr == t.ptr()).expect("t is live");
    assert_eq!(mine.category, Category::Parameter);
}

#[test]
fn the_memory_history_names_the_op_that_saved_a_tensor() {
    let _s = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    a.record_memory_history(10_000, false);
    let w = Tensor::full(&[8, 8], 0.5f32, &d)
        .unwrap()
        .requires_grad_(true);
    let x = Tensor::full(&[4, 8], 1.0f32, &d).unwrap();
    let h = x.matmul(&w).unwrap();
    let y = h.exp().unwrap();
    let live = a.live_blocks();
    let saved_by = |t: &Tensor| {
        live.iter()
            .find(|b| b.addr == t.ptr())
            .and_then(|b| b.saved_by.clone())
    };
    // matmul saved x and w; exp saved its output.
    assert_eq!(saved_by(&x).as_deref(), Some("MmBackward"));
    assert_eq!(saved_by(&w).as_deref(), Some("MmBackward"));
    assert_eq!(saved_by(&y).as_deref(), Some("ExpBackward"));
    // h is an input of exp, which needs only its output: nothing saved it.
    assert_eq!(saved_by(&h), None);
    drop((w, x, h, y));
    a.record_memory_history(0, false);
}

#[test]
fn snapshots_carry_each_blocks_category_and_summaries_add_them_up() {
    let _s = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    let w = {
        let _p = Category::Parameter.scope();
        Tensor::zeros(&[4096], labs_core::DType::F32, &d).unwrap()
    };
    let snapshot = a.snapshot();
    let block = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == w.ptr())
        .expect("w's block is in the snapshot");
    assert_eq!(block.category.as_deref(), Some("parameter"));
    let summary = labs_core::snapshot::Summary::of(&snapshot);
    assert!(summary.allocated_by_category["parameter"] >= w.nbytes() as u64);
    let total: u64 = summary.allocated_by_category.values().sum();
    assert_eq!(total, summary.allocated_bytes);
    // The category survives the JSON round trip lab-03 reads.
    let json = labs_core::snapshot::dump(&snapshot);
    let back = labs_core::snapshot::load_json(json.as_bytes()).unwrap();
    assert_eq!(back, snapshot);
}

#[test]
fn the_category_timeline_follows_every_byte_of_a_step() {
    let _s = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    let stream = d.default_stream().unwrap();
    a.record_category_timeline(1 << 16);
    let start = by_category(&d);
    let weight = {
        let _scope = Category::Parameter.scope();
        Tensor::from_slice(&[0.5f32; 4096], &[64, 64], &d)
            .unwrap()
            .requires_grad_(true)
    };
    let x = {
        let _scope = Category::Input.scope();
        Tensor::from_slice(&[1.0f32; 8192], &[128, 64], &d).unwrap()
    };
    // relu saves its output: an activation until backward frees it.
    let y = x.matmul(&weight).unwrap().relu().unwrap();
    let during = by_category(&d);
    y.sum_all().unwrap().backward().unwrap();
    drop(y);
    let raw = a.malloc(1 << 20, &stream).unwrap();
    a.free(raw).unwrap();
    let (samples, dropped) = a.category_timeline();
    a.record_category_timeline(0);
    assert_eq!(dropped, 0);
    // The first sample is the state when recording started, the last the state now;
    // the samples in between saw the activation come and go.
    assert_eq!(samples[0].bytes, start);
    assert_eq!(samples.last().unwrap().bytes, by_category(&d));
    let act = Category::Activation.index();
    assert!(during[act] > start[act]);
    assert!(samples.iter().any(|s| s.bytes[act] == during[act]));
    assert_eq!(samples.last().unwrap().bytes[act], start[act]);
    let grad = Category::Gradient.index();
    // The weight's gradient, 64 × 64 float32 (a multiple of the 512-byte rounding).
    assert!(weight.grad().is_some());
    assert_eq!(
        samples.last().unwrap().bytes[grad] - start[grad],
        64 * 64 * 4
    );
    // Reserved memory covers what is allocated at every sample; consecutive samples
    // differ (repeats are not recorded); the raw 1 MiB block shows as `other`.
    let other = Category::Other.index();
    assert!(samples.iter().all(|s| s.reserved >= s.allocated()));
    assert!(samples.windows(2).all(|w| w[0] != w[1]));
    assert!(samples
        .iter()
        .any(|s| s.bytes[other] >= start[other] + (1 << 20)));
    assert!(samples.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    // Stopped: nothing more is recorded.
    let again = a.malloc(1 << 20, &stream).unwrap();
    a.free(again).unwrap();
    assert!(a.category_timeline().0.is_empty());
}
