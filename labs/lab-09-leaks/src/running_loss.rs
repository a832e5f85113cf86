//! Experiment 1: the graph a running loss keeps alive. A training loop sums its loss
//! for the log three ways: the loss tensor before `backward` (the graph's saved
//! tensors are still there), the loss tensor after `backward` (released), and
//! `loss.item()` (a host number). Memory per iteration, and the graph the running
//! total keeps.

use labs_core::autograd::{retained_graph, RetainedGraph};
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

use crate::mib;
use crate::model::{batch, Mlp, Sizes};

/// How the loop keeps its running loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// `total = total + loss`, and no `backward` (a loop that only logs, or a loss
    /// logged from a pass that is never backpropagated).
    TensorNoBackward,
    /// `total = total + loss`, then `loss.backward()` and an SGD step.
    TensorWithBackward,
    /// `total += loss.item()`, then `loss.backward()` and an SGD step.
    Item,
}

impl Keep {
    pub const ALL: [Keep; 3] = [Keep::TensorNoBackward, Keep::TensorWithBackward, Keep::Item];

    pub fn name(self) -> &'static str {
        match self {
            Keep::TensorNoBackward => "total += loss, no backward",
            Keep::TensorWithBackward => "total += loss, backward",
            Keep::Item => "total += loss.item(), backward",
        }
    }
}

/// The state after one iteration.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub allocated: u64,
    pub reserved: u64,
    /// The graph behind the running total (nothing for a host number).
    pub graph: RetainedGraph,
}

// ANCHOR: running_loss
/// Trains `s.iterations` steps keeping the running loss as `keep` says; one reading per
/// iteration, taken after the iteration's temporaries are gone. The first reading is
/// taken before the loop.
pub fn run(device: &Device, s: Sizes, keep: Keep) -> Result<(Vec<Reading>, f32)> {
    let alloc = device.allocator()?;
    let model = Mlp::new(device, s, 1)?;
    let mut total_tensor: Option<Tensor> = None;
    let mut total_host = 0.0f32;
    let read = |total: &Option<Tensor>| Reading {
        allocated: alloc.memory_allocated(),
        reserved: alloc.memory_reserved(),
        graph: total.as_ref().map(retained_graph).unwrap_or_default(),
    };
    let mut readings = vec![read(&total_tensor)];
    for i in 0..s.iterations {
        let x = batch(device, s, i)?;
        let loss = model.loss(&x)?;
        match keep {
            Keep::Item => total_host += loss.item::<f32>()?,
            _ => {
                total_tensor = Some(match total_tensor.take() {
                    None => loss.clone(),
                    Some(t) => t.add(&loss)?,
                })
            }
        }
        if keep != Keep::TensorNoBackward {
            loss.backward()?;
            model.sgd_step(1e-3)?;
        }
        drop((x, loss));
        readings.push(read(&total_tensor));
    }
    if let Some(t) = &total_tensor {
        total_host = t.item::<f32>()?;
    }
    Ok((readings, total_host))
}
// ANCHOR_END: running_loss

/// All three ways, one after the other, each from a clean state.
pub fn measure(device: &Device, s: Sizes) -> Result<Vec<(Keep, Vec<Reading>)>> {
    Keep::ALL
        .iter()
        .map(|&k| Ok((k, run(device, s, k)?.0)))
        .collect()
}

pub fn table(device: &Device, rows: &[(Keep, Vec<Reading>)]) -> Table {
    let mut t = Table::new(
        format!(
            "1. The graph a running loss keeps alive, on {device}: memory after each iteration \
             (MiB) and the graph behind the running total"
        ),
        &[
            "running loss",
            "iteration",
            "allocated",
            "reserved",
            "graph nodes",
            "saved by them",
        ],
    );
    for (keep, readings) in rows {
        for (i, r) in readings.iter().enumerate() {
            t.row([
                keep.name().to_string(),
                if i == 0 {
                    "before".into()
                } else {
                    i.to_string()
                },
                mib(r.allocated),
                mib(r.reserved),
                r.graph.nodes.to_string(),
                mib(r.graph.saved_bytes),
            ]);
        }
    }
    t
}
