//! Lab 9's experiments and exercises on the device under test (the simulated GPU here,
//! the GPU with `LABS_DEVICE=cuda`). The tests measure the device's allocator, so they
//! run one at a time.

use std::collections::HashSet;

use lab_09::exercises::{attribute_growth, evaluate, graph_bytes, log_losses, Growth, Site};
use lab_09::model::{batch, Mlp, Sizes};
use lab_09::running_loss::{self, Keep};
use lab_09::{drops, eval, planted, unused_result};
use labs_core::alloc::{Category, LeakGuard, LiveBlock};
use labs_core::autograd::retained_graph;
use labs_core::tensor::no_grad;
use labs_core::testing::{serial, test_device};
use labs_core::{Device, Tensor};

/// The allocator's smallest block: every request is rounded up to a multiple of it.
const ROUND: u64 = 512;

fn sizes(device: &Device) -> Sizes {
    Sizes::for_device(device, true)
}

/// Bytes of one activation and of one input batch.
fn activation(s: Sizes) -> u64 {
    (s.batch * s.hidden * 4) as u64
}
fn input(s: Sizes) -> u64 {
    (s.batch * s.input * 4) as u64
}

#[test]
fn a_running_loss_tensor_without_backward_grows_by_one_graph_per_iteration() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let (r, _) = running_loss::run(&d, s, Keep::TensorNoBackward).unwrap();
    // New each iteration: the batch, and per hidden layer its ReLU's output (which the
    // next product saves too; the products themselves are not saved).
    let per_iteration = input(s) + (s.depth as u64 + 1) * activation(s);
    for w in r.windows(2).skip(1) {
        let grew = w[1].allocated - w[0].allocated;
        let saved = w[1].graph.saved_bytes - w[0].graph.saved_bytes;
        assert_eq!(saved, per_iteration, "{r:?}");
        // A handful of new blocks, each rounded up by at most one unit.
        assert!(
            grew >= saved && grew - saved < 8 * ROUND,
            "{grew} vs {saved}"
        );
        assert_eq!(w[1].graph.nodes - w[0].graph.nodes, 9, "8 ops and an add");
    }
    assert_eq!(r.last().unwrap().graph.released_nodes, 0);
}

#[test]
fn after_backward_the_running_loss_keeps_nodes_but_no_device_memory() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let (r, total) = running_loss::run(&d, s, Keep::TensorWithBackward).unwrap();
    let (flat, total_item) = running_loss::run(&d, s, Keep::Item).unwrap();
    // The running total's own block (one element) is all that stays on the device.
    assert_eq!(r[1].allocated - r[0].allocated, ROUND, "{r:?}");
    for (i, reading) in r.iter().enumerate().skip(1) {
        assert_eq!(reading.allocated, r[1].allocated, "{r:?}");
        assert_eq!(reading.graph.saved_bytes, 0);
        // Backward released each iteration's 8 nodes; the adds were never run.
        assert_eq!(reading.graph.released_nodes, 8 * i);
    }
    assert_eq!(r.last().unwrap().graph.nodes, 9 * s.iterations - 1);
    for reading in &flat {
        assert_eq!(reading.allocated, flat[0].allocated);
        assert_eq!(reading.graph.nodes, 0);
    }
    // The same training: the same losses, summed on the device or on the host.
    assert!(
        (total - total_item).abs() <= 1e-4 * total.abs().max(1.0),
        "{total} {total_item}"
    );
}

#[test]
fn no_grad_keeps_an_evaluation_pass_to_two_activations() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let o = eval::measure(&d, s).unwrap();
    let (with_graph, without) = (o.passes[0], o.passes[1]);
    assert!(!with_graph.no_grad && without.no_grad);
    let layers = s.depth as u64 + 1;
    // With a graph, one batch's input and every activation are alive at the end.
    assert!(with_graph.peak - with_graph.before >= input(s) + layers * activation(s));
    // Without, the input and three activations at most (a layer's input, the product,
    // its ReLU), plus tiny blocks.
    assert!(without.peak - without.before <= input(s) + 3 * activation(s) + 4 * ROUND);
    assert_eq!(with_graph.after, with_graph.before);
    assert_eq!(without.after, without.before);
    let (kept, detached) = (o.logged[0], o.logged[1]);
    assert_eq!(
        detached.held,
        s.iterations as u64 * ROUND,
        "one small block per loss"
    );
    assert_eq!(detached.graph_nodes, 0);
    assert_eq!(kept.graph_nodes, 8 * s.iterations);
    let per_loss = input(s) + layers * activation(s);
    assert!(kept.held >= s.iterations as u64 * per_loss, "{kept:?}");
}

#[test]
fn dropping_frees_only_the_last_reference_and_empty_cache_returns_the_rest() {
    let _g = serial();
    let d = test_device();
    let bytes = 8 << 20;
    let steps = drops::measure(&d, bytes).unwrap();
    let base = steps[0].allocated;
    let at = |what: &str| {
        steps
            .iter()
            .find(|s| s.what.starts_with(what))
            .unwrap_or_else(|| panic!("{what}: {steps:?}"))
            .allocated
            - base
    };
    let b = bytes as u64;
    assert_eq!(at("a = randn(...); b = a"), b);
    assert_eq!(at("del a (b still"), b);
    assert_eq!(at("del b"), 0);
    assert_eq!(at("row = a[0:1]; del a"), b, "a view keeps the whole block");
    assert_eq!(at("row = row.clone()"), 4096);
    assert_eq!(at("del row"), 0);
    // x, and y's own block (rows x 1 floats) and w's (1024 floats).
    let rows = (bytes / 4096) as u64;
    assert_eq!(at("y = x @ w"), b + (rows * 4).max(ROUND) + 4096);
    assert_eq!(at("del y"), 4096, "only w, the leaf, is left");
    let before_empty = &steps[steps.len() - 2];
    let after_empty = steps.last().unwrap();
    assert_eq!(after_empty.allocated, base);
    assert!(
        after_empty.reserved + b <= before_empty.reserved,
        "{steps:?}"
    );
}

#[test]
fn an_unused_result_keeps_its_operands_until_it_goes() {
    let _g = serial();
    let d = test_device();
    let n = 256;
    let block = (n * n * 4) as u64;
    let steps = unused_result::measure(&d, n, true).unwrap();
    assert_eq!(
        steps.iter().map(|s| s.allocated).collect::<Vec<_>>(),
        [3 * block, 3 * block, 0],
        "c's node keeps a and b after del a, b"
    );
    assert_eq!((steps[1].nodes, steps[1].saved), (1, 2 * block));
    let plain = unused_result::measure(&d, n, false).unwrap();
    assert_eq!(
        plain
            .iter()
            .map(|s| (s.allocated, s.nodes))
            .collect::<Vec<_>>(),
        [(3 * block, 0), (block, 0), (0, 0)],
        "no input requires grad: no graph"
    );
}

#[test]
fn the_leak_guard_names_the_op_and_the_model_line_of_each_leaked_block() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let o = planted::measure(&d, s).unwrap();
    let layers = s.depth as u64 + 1;
    for r in &o.leaking {
        // The batch, each ReLU's output, and the loss.
        assert_eq!(r.blocks.len(), layers as usize + 2, "{r}");
        assert!(r.bytes() >= input(s) + layers * activation(s));
        for b in &r.blocks {
            let origin = b.origin().expect("backtraces are recorded");
            assert!(
                origin
                    .op
                    .as_deref()
                    .is_some_and(|op| op.starts_with("Tensor::")),
                "{r}"
            );
            let at = origin.at.unwrap();
            assert!(
                at.starts_with("labs/lab-09-leaks/src/model.rs:"),
                "{at}\n{r}"
            );
        }
    }
    assert!(o.fixed.is_clean(), "{}", o.fixed);
}

/// The report's "at" is the planting line of this file.
#[test]
fn the_leak_report_points_at_the_planting_line() {
    let _g = serial();
    let d = test_device();
    let alloc = d.allocator().unwrap();
    alloc.record_memory_history(10_000, true);
    let x = Tensor::randn(&[64, 128], 1, &d).unwrap();
    let w = Tensor::randn(&[128, 256], 2, &d)
        .unwrap()
        .requires_grad_(true);
    let mut losses = Vec::new();
    let mut guard = LeakGuard::new(alloc);
    let (h, h_line) = (x.matmul(&w).unwrap().relu().unwrap(), line!());
    let (loss, loss_line) = (h.mean_all().unwrap(), line!());
    drop(h);
    losses.push(loss); // the leak
    let report = guard.end_iteration();
    alloc.record_memory_history(0, false);
    let origins: Vec<_> = report.blocks.iter().map(|b| b.origin().unwrap()).collect();
    assert_eq!(
        origins.len(),
        2,
        "h (relu's output, which relu saved) and the loss:\n{report}"
    );
    let file = "labs/lab-09-leaks/tests/lab09.rs";
    assert_eq!(origins[0].at, Some(format!("{file}:{h_line}")), "{report}");
    assert!(
        origins[0]
            .op
            .as_deref()
            // `relu` is a thin wrapper that a release build may fold into the op
            // it calls.
            .is_some_and(|op| op.starts_with("Tensor::relu") || op.starts_with("Tensor::unary")),
        "{report}"
    );
    assert_eq!(
        origins[1].at,
        Some(format!("{file}:{loss_line}")),
        "{report}"
    );
    assert_eq!(
        origins[1].op.as_deref(),
        Some("Tensor::mean_all"),
        "{report}"
    );
    assert!(
        report.to_string().contains(&format!("at {file}:{h_line}")),
        "{report}"
    );
    drop(losses);
}

#[test]
fn item_is_one_element_only() {
    let _g = serial();
    let d = test_device();
    let t = Tensor::from_slice(&[2.5f32], &[1, 1], &d).unwrap();
    assert_eq!(t.item::<f32>().unwrap(), 2.5);
    let two = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap();
    let err = two.item::<f32>().unwrap_err().to_string();
    assert!(err.contains("item") && err.contains("[2]"), "{err}");
    assert!(t.item::<i64>().is_err(), "the dtype must match");
}

fn batches(d: &Device, s: Sizes, n: usize) -> Vec<Tensor> {
    (0..n).map(|i| batch(d, s, i).unwrap()).collect()
}

#[test]
fn exercise_1_evaluation_stays_flat() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let model = Mlp::new(&d, s, 7).unwrap();
    let xs = batches(&d, s, 3);
    let expected: f32 = {
        let _off = no_grad();
        let sum: f32 = xs
            .iter()
            .map(|x| model.loss(x).unwrap().item::<f32>().unwrap())
            .sum();
        sum / 3.0
    };
    let alloc = d.allocator().unwrap();
    let before = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    let got = evaluate(&model, &xs).unwrap();
    assert!(
        (got - expected).abs() <= 1e-5 * expected.abs().max(1.0),
        "{got} {expected}"
    );
    let peak = alloc.max_memory_allocated() - before;
    assert!(
        peak <= 3 * activation(s) + 4 * ROUND,
        "peak {peak}: is a graph recorded?"
    );
    assert_eq!(alloc.memory_allocated(), before);
}

#[test]
fn exercise_2_logged_losses_keep_no_graph() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let model = Mlp::new(&d, s, 8).unwrap();
    let xs = batches(&d, s, 4);
    let alloc = d.allocator().unwrap();
    let before = alloc.memory_allocated();
    let logged = log_losses(&model, &xs).unwrap();
    assert_eq!(
        alloc.memory_allocated() - before,
        4 * ROUND,
        "one small block per loss"
    );
    for (l, x) in logged.iter().zip(&xs) {
        assert!(l.grad_fn().is_none() && !l.requires_grad());
        let expected = model.loss(x).unwrap().item::<f32>().unwrap();
        assert_eq!(l.item::<f32>().unwrap(), expected);
    }
}

#[test]
fn exercise_3_graph_bytes_counts_each_saved_storage_once() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let model = Mlp::new(&d, s, 9).unwrap();
    let loss = model.loss(&batch(&d, s, 0).unwrap()).unwrap();
    assert_eq!(graph_bytes(&loss), retained_graph(&loss).saved_bytes);
    let weights: u64 = model.weights.iter().map(|w| w.nbytes() as u64).sum();
    let layers = s.depth as u64 + 1;
    assert_eq!(
        graph_bytes(&loss),
        weights + input(s) + layers * activation(s)
    );
    // A tensor saved twice (a @ a) counts once; views of one storage count once.
    let a = Tensor::randn(&[32, 32], 3, &d)
        .unwrap()
        .requires_grad_(true);
    let sq = a.matmul(&a).unwrap();
    assert_eq!(graph_bytes(&sq), 32 * 32 * 4);
    let at = a.matmul(&a.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(graph_bytes(&at), 32 * 32 * 4);
    // A leaf has no graph; a released graph saves nothing.
    assert_eq!(graph_bytes(&a), 0);
    loss.backward().unwrap();
    assert_eq!(graph_bytes(&loss), 0);
}

/// The live blocks and `memory_allocated` after each of `n` iterations of a loop that
/// computes a loss and hands it to `keep`.
fn marks(
    d: &Device,
    s: Sizes,
    model: &Mlp,
    n: usize,
    mut keep: impl FnMut(Tensor),
) -> Vec<(Vec<LiveBlock>, u64)> {
    let alloc = d.allocator().unwrap();
    (0..n)
        .map(|i| {
            keep(model.loss(&batch(d, s, i).unwrap()).unwrap());
            (alloc.live_blocks(), alloc.memory_allocated())
        })
        .collect()
}

/// The report between the first mark and the last, checked against the allocator's
/// own count and for its order.
fn growth_between(marks: &[(Vec<LiveBlock>, u64)]) -> Vec<Growth> {
    let ((before, at_first), (after, at_last)) = (&marks[0], marks.last().unwrap());
    let report = attribute_growth(before, after);
    let net: i64 = report.iter().map(|g| g.net_bytes).sum();
    assert_eq!(
        net,
        *at_last as i64 - *at_first as i64,
        "the report's net bytes against memory_allocated's change:\n{report:#?}"
    );
    for w in report.windows(2) {
        let key = |g: &Growth| (std::cmp::Reverse(g.net_bytes), g.site.clone());
        assert!(
            key(&w[0]) < key(&w[1]),
            "largest growth first, then by site:\n{report:#?}"
        );
    }
    for g in &report {
        assert!(g.new_blocks + g.freed_blocks > 0, "{g:?}");
    }
    report
}

fn is_relu(op: &Option<String>) -> bool {
    // A release build may fold `relu` into the op it calls.
    op.as_deref()
        .is_some_and(|op| op.starts_with("Tensor::relu") || op.starts_with("Tensor::unary"))
}

#[test]
fn exercise_4_a_list_of_losses_grows_at_the_model_lines_that_made_its_graphs() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let alloc = d.allocator().unwrap();
    alloc.record_memory_history(100_000, true);
    let model = Mlp::new(&d, s, 10).unwrap();
    let mut losses = Vec::new();
    let marks = marks(&d, s, &model, 4, |loss| losses.push(loss));
    alloc.record_memory_history(0, false);
    let report = growth_between(&marks);
    // Three iterations' graphs, kept whole: per iteration the batch (saved by the first
    // product), each hidden layer's ReLU output (saved by the ReLU and the next
    // product) and the loss itself. Nothing was freed.
    let kept = 3;
    let relus = s.depth + 1;
    assert_eq!(report.len(), 3, "{report:#?}");
    for g in &report {
        assert_eq!(g.freed_blocks, 0, "{g:?}");
        let at = g.site.at.as_deref().unwrap_or_default();
        assert!(at.starts_with("labs/lab-09-leaks/src/model.rs:"), "{g:?}");
    }
    let (relu, batch_site, loss) = (&report[0], &report[1], &report[2]);
    assert!(is_relu(&relu.site.op), "{relu:?}");
    assert_eq!(relu.site.category, Category::Activation);
    assert_eq!(relu.new_blocks, kept * relus);
    assert_eq!(relu.net_bytes, (kept * relus) as i64 * activation(s) as i64);
    assert_eq!(
        batch_site.site.op.as_deref(),
        Some("Tensor::randn"),
        "{batch_site:?}"
    );
    assert_eq!(batch_site.site.category, Category::Activation);
    assert_eq!(
        (batch_site.new_blocks, batch_site.net_bytes),
        (kept, kept as i64 * input(s) as i64)
    );
    assert_eq!(
        loss.site.op.as_deref(),
        Some("Tensor::mean_all"),
        "{loss:?}"
    );
    assert_eq!(
        (loss.new_blocks, loss.net_bytes),
        (kept, kept as i64 * ROUND as i64)
    );
    let lines: HashSet<_> = report.iter().map(|g| g.site.at.clone()).collect();
    assert_eq!(lines.len(), 3, "three lines of model.rs: {report:#?}");
    drop(losses);
}

#[test]
fn exercise_4_a_loss_replaced_every_iteration_is_turnover_not_growth() {
    let _g = serial();
    let d = test_device();
    let s = sizes(&d);
    let alloc = d.allocator().unwrap();
    alloc.record_memory_history(100_000, true);
    let model = Mlp::new(&d, s, 11).unwrap();
    // Python's loop variable: the last loss, graph and all, outlives each iteration,
    // and the next one replaces it.
    let mut last = None;
    let marks = marks(&d, s, &model, 4, |loss| last = Some(loss));
    alloc.record_memory_history(0, false);
    let report = growth_between(&marks);
    // The same three sites as a leak, each with as many blocks made as freed: a guard
    // that only lists new blocks would call this a leak every iteration.
    assert_eq!(report.len(), 3, "{report:#?}");
    let mut per_iteration: Vec<usize> = report.iter().map(|g| g.new_blocks).collect();
    per_iteration.sort();
    assert_eq!(per_iteration, [1, 1, s.depth + 1], "{report:#?}");
    for g in &report {
        assert_eq!(g.net_bytes, 0, "{g:?}");
        assert_eq!(g.new_blocks, g.freed_blocks, "{g:?}");
    }
    drop(last);
}

#[test]
fn exercise_4_a_block_is_its_allocation_not_its_address() {
    let _g = serial();
    let d = test_device();
    let alloc = d.allocator().unwrap();
    alloc.record_memory_history(0, false);
    // Alive at both points: not in the report.
    let kept = Tensor::randn(&[128, 128], 1, &d).unwrap();
    let a = Tensor::randn(&[256, 256], 2, &d).unwrap();
    let before = alloc.live_blocks();
    drop(a);
    let b = Tensor::randn(&[256, 256], 3, &d).unwrap();
    let weight = {
        let _p = Category::Parameter.scope();
        Tensor::randn(&[64, 64], 4, &d).unwrap()
    };
    let after = alloc.live_blocks();
    // a, the newest block before, and b, at a's address after: the cache hands a's
    // block to b.
    let freed = before.iter().max_by_key(|x| x.serial).unwrap().clone();
    let made = after.iter().find(|x| x.addr == freed.addr).unwrap().clone();
    assert_eq!(made.size, freed.size);
    assert_ne!(made.serial, freed.serial);
    let report = attribute_growth(&before, &after);
    // No backtraces: sites are categories alone. The weight is growth; b replaced a.
    let param = Site {
        at: None,
        op: None,
        category: Category::Parameter,
    };
    let turnover = Site {
        at: None,
        op: None,
        category: made.category,
    };
    assert_eq!(
        report,
        [
            Growth {
                site: param,
                new_blocks: 1,
                freed_blocks: 0,
                net_bytes: 64 * 64 * 4
            },
            Growth {
                site: turnover,
                new_blocks: 1,
                freed_blocks: 1,
                net_bytes: 0
            },
        ]
    );
    drop((kept, b, weight));
}
