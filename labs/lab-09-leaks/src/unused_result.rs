//! Experiment 4: a graph kept by an unused result (tutorial 002). `c = a @ b` with
//! inputs that require a gradient records a node that saves `a` and `b`; `c` is never
//! backpropagated. While `c` lives, its node keeps both operands, even after the
//! program dropped its own names for them; dropping `c` releases everything. Without
//! `requires_grad` there is no node at all.

use labs_core::autograd::retained_graph;
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

use crate::mib;

#[derive(Debug, Clone)]
pub struct Step {
    pub what: String,
    pub allocated: u64,
    /// The graph behind `c` at that point.
    pub nodes: usize,
    pub saved: u64,
}

// ANCHOR: unused_result
pub fn measure(device: &Device, n: usize, requires_grad: bool) -> Result<Vec<Step>> {
    let alloc = device.allocator()?;
    let base = alloc.memory_allocated();
    let mut steps = Vec::new();
    let mut note = |what: &str, c: Option<&Tensor>| {
        let g = c.map(retained_graph).unwrap_or_default();
        steps.push(Step {
            what: format!("{what} (requires_grad={requires_grad})"),
            allocated: alloc.memory_allocated() - base,
            nodes: g.nodes,
            saved: g.saved_bytes,
        });
    };
    let a = Tensor::randn(&[n, n], 1, device)?.requires_grad_(requires_grad);
    let b = Tensor::randn(&[n, n], 2, device)?.requires_grad_(requires_grad);
    let c = a.matmul(&b)?;
    note("c = a @ b", Some(&c));
    drop((a, b));
    note("del a, b", Some(&c));
    drop(c);
    note("del c", None);
    Ok(steps)
}
// ANCHOR_END: unused_result

pub fn side(device: &Device, quick: bool) -> usize {
    if device.is_cuda() && !quick {
        4096
    } else {
        1024
    }
}

pub fn table(device: &Device, n: usize, steps: &[Step]) -> Table {
    let mut t = Table::new(
        format!("4. c = a @ b with {n}x{n} float32 operands, never backpropagated, on {device}"),
        &[
            "step",
            "allocated (MiB)",
            "c's graph nodes",
            "saved by them (MiB)",
        ],
    );
    for s in steps {
        t.row([
            s.what.clone(),
            mib(s.allocated),
            s.nodes.to_string(),
            mib(s.saved),
        ]);
    }
    t
}
