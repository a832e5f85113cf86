//! Experiment 2: `no_grad` for evaluation, `detach` for logged values. The peak of an
//! evaluation pass with and without `no_grad` (with a graph, every layer's activation
//! is saved until the loss goes; without, two at a time), and what a list of logged
//! losses holds with and without `detach`.

use labs_core::autograd::retained_by;
use labs_core::table::Table;
use labs_core::tensor::no_grad;
use labs_core::{Device, Result, Tensor};

use crate::mib;
use crate::model::{batch, Mlp, Sizes};

/// One evaluation pass: its peak above what was allocated before it.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    pub no_grad: bool,
    pub before: u64,
    pub peak: u64,
    pub after: u64,
}

// ANCHOR: eval_pass
/// Evaluates `s.iterations` batches, keeping `loss.item()`, with or without `no_grad`.
pub fn eval_pass(device: &Device, model: &Mlp, s: Sizes, with_no_grad: bool) -> Result<Pass> {
    let alloc = device.allocator()?;
    let before = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    let _off = with_no_grad.then(no_grad);
    let mut total = 0.0f32;
    for i in 0..s.iterations {
        let x = batch(device, s, i)?;
        total += model.loss(&x)?.item::<f32>()?;
    }
    std::hint::black_box(total);
    Ok(Pass {
        no_grad: with_no_grad,
        before,
        peak: alloc.max_memory_allocated(),
        after: alloc.memory_allocated(),
    })
}
// ANCHOR_END: eval_pass

/// A list of logged losses after `s.iterations` evaluation batches (no `no_grad`).
#[derive(Debug, Clone, Copy)]
pub struct Logged {
    pub detach: bool,
    /// Allocated above the baseline while the list lives.
    pub held: u64,
    /// The graphs the list's tensors keep, summed.
    pub graph_bytes: u64,
    pub graph_nodes: usize,
}

// ANCHOR: logged_losses
/// Keeps each batch's loss in a list, as is or detached, and measures what the list
/// holds.
pub fn logged_losses(device: &Device, model: &Mlp, s: Sizes, detach: bool) -> Result<Logged> {
    let alloc = device.allocator()?;
    let before = alloc.memory_allocated();
    let mut losses: Vec<Tensor> = Vec::new();
    for i in 0..s.iterations {
        let x = batch(device, s, i)?;
        let loss = model.loss(&x)?;
        losses.push(if detach { loss.detach() } else { loss });
    }
    let graphs = retained_by(&losses);
    Ok(Logged {
        detach,
        held: alloc.memory_allocated() - before,
        graph_bytes: graphs.saved_bytes,
        graph_nodes: graphs.nodes,
    })
}
// ANCHOR_END: logged_losses

pub struct Outcome {
    pub passes: Vec<Pass>,
    pub logged: Vec<Logged>,
}

pub fn measure(device: &Device, s: Sizes) -> Result<Outcome> {
    let model = Mlp::new(device, s, 2)?;
    let passes = [false, true]
        .iter()
        .map(|&n| eval_pass(device, &model, s, n))
        .collect::<Result<_>>()?;
    let logged = [false, true]
        .iter()
        .map(|&d| logged_losses(device, &model, s, d))
        .collect::<Result<_>>()?;
    Ok(Outcome { passes, logged })
}

pub fn tables(device: &Device, s: Sizes, o: &Outcome) -> [Table; 2] {
    let mut t = Table::new(
        format!(
            "2a. An evaluation pass of {} batches on {device}, with and without no_grad (MiB)",
            s.iterations
        ),
        &["pass", "allocated before", "peak", "peak - before", "after"],
    );
    for p in &o.passes {
        t.row([
            if p.no_grad {
                "with no_grad"
            } else {
                "without no_grad"
            }
            .to_string(),
            mib(p.before),
            mib(p.peak),
            mib(p.peak - p.before),
            mib(p.after),
        ]);
    }
    let mut u = Table::new(
        format!(
            "2b. {} logged losses from an evaluation loop without no_grad, on {device}",
            s.iterations
        ),
        &[
            "list of",
            "held on the device (MiB)",
            "graph nodes",
            "saved by them (MiB)",
        ],
    );
    for l in &o.logged {
        u.row([
            if l.detach { "loss.detach()" } else { "loss" }.to_string(),
            mib(l.held),
            l.graph_nodes.to_string(),
            mib(l.graph_bytes),
        ]);
    }
    [t, u]
}
