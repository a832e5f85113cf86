//! Reference solutions to the exercises in `starter.rs`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use labs_core::alloc::LiveBlock;
use labs_core::tensor::{no_grad, Edge, Node};
use labs_core::{Result, Tensor};

use super::{Growth, Site};
use crate::model::Mlp;

pub fn evaluate(model: &Mlp, batches: &[Tensor]) -> Result<f32> {
    let _off = no_grad();
    let mut total = 0.0f32;
    for x in batches {
        total += model.loss(x)?.item::<f32>()?;
    }
    Ok(total / batches.len().max(1) as f32)
}

pub fn log_losses(model: &Mlp, batches: &[Tensor]) -> Result<Vec<Tensor>> {
    batches
        .iter()
        .map(|x| Ok(model.loss(x)?.detach()))
        .collect()
}

pub fn graph_bytes(t: &Tensor) -> u64 {
    let Some(root) = t.grad_fn() else { return 0 };
    let mut nodes: HashSet<*const Node> = HashSet::from([Arc::as_ptr(&root)]);
    let mut storages = HashSet::new();
    let mut bytes = 0;
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        for s in node.saved.lock().unwrap().iter().flatten() {
            if storages.insert(s.allocation().ptr()) {
                bytes += s.allocation().requested();
            }
        }
        for edge in node.inputs.iter().flatten() {
            if let Edge::Node(next) = edge {
                if nodes.insert(Arc::as_ptr(next)) {
                    stack.push(next.clone());
                }
            }
        }
    }
    bytes
}

pub fn attribute_growth(before: &[LiveBlock], after: &[LiveBlock]) -> Vec<Growth> {
    // A block is its allocation, not its address: the cache hands a freed block's
    // address out again, to a new allocation with a new serial.
    let serials = |blocks: &[LiveBlock]| blocks.iter().map(|b| b.serial).collect::<HashSet<_>>();
    let (was, is) = (serials(before), serials(after));
    let mut sites: BTreeMap<Site, Growth> = BTreeMap::new();
    let mut count = |b: &LiveBlock, new: bool| {
        let origin = b.origin();
        let site = Site {
            at: origin.as_ref().and_then(|o| o.at.clone()),
            op: origin.and_then(|o| o.op),
            category: b.category,
        };
        let g = sites.entry(site.clone()).or_insert(Growth {
            site,
            new_blocks: 0,
            freed_blocks: 0,
            net_bytes: 0,
        });
        if new {
            g.new_blocks += 1;
            g.net_bytes += b.size as i64;
        } else {
            g.freed_blocks += 1;
            g.net_bytes -= b.size as i64;
        }
    };
    for b in after.iter().filter(|b| !was.contains(&b.serial)) {
        count(b, true);
    }
    for b in before.iter().filter(|b| !is.contains(&b.serial)) {
        count(b, false);
    }
    let mut report: Vec<Growth> = sites.into_values().collect();
    // Stable: sites with equal growth stay in the order of `Site`.
    report.sort_by_key(|g| std::cmp::Reverse(g.net_bytes));
    report
}
