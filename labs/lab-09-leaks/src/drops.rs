//! Experiment 3: what dropping frees and what it does not. A block goes back to the
//! cache when the last thing using it goes: another reference (a clone), a view (a
//! `narrow` of one row keeps the whole block), or a graph node that saved the tensor.
//! Then `empty_cache` hands the cached memory back to the driver.

use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

use crate::mib;

/// `memory_allocated` and `memory_reserved` after one step of the experiment.
#[derive(Debug, Clone)]
pub struct Step {
    pub what: &'static str,
    pub allocated: u64,
    pub reserved: u64,
}

/// The tensor size of the experiment: 64 MiB on a GPU, 8 MiB on the simulator.
pub fn block_bytes(device: &Device, quick: bool) -> usize {
    if device.is_cuda() && !quick {
        64 << 20
    } else {
        8 << 20
    }
}

// ANCHOR: drops
pub fn measure(device: &Device, bytes: usize) -> Result<Vec<Step>> {
    let alloc = device.allocator()?;
    let mut steps = Vec::new();
    let mut note = |what| {
        steps.push(Step {
            what,
            allocated: alloc.memory_allocated(),
            reserved: alloc.memory_reserved(),
        })
    };
    let rows = bytes / (4 * 1024);
    note("start");

    // Another reference: a clone shares the storage.
    let a = Tensor::randn(&[rows, 1024], 1, device)?;
    let b = a.clone();
    note("a = randn(...); b = a");
    drop(a);
    note("del a (b still refers to it)");
    drop(b);
    note("del b");

    // A view: one row of the tensor keeps the whole block.
    let a = Tensor::randn(&[rows, 1024], 2, device)?;
    let row = a.narrow(0, 0, 1)?;
    drop(a);
    note("row = a[0:1]; del a (the view keeps the block)");
    let copy = row.deep_clone()?;
    drop(row);
    note("row = row.clone() (a copy of 4 KiB; the view goes)");
    drop(copy);
    note("del row");

    // A graph: a product saves its operands for backward.
    let w = Tensor::randn(&[1024, 1], 3, device)?.requires_grad_(true);
    let x = Tensor::randn(&[rows, 1024], 4, device)?;
    let y = x.matmul(&w)?;
    drop(x);
    note("y = x @ w (w requires grad); del x (y's node saved x)");
    drop(y);
    note("del y (the node goes, and x with it)");
    drop(w);

    alloc.empty_cache()?;
    note("empty_cache()");
    Ok(steps)
}
// ANCHOR_END: drops

pub fn table(device: &Device, bytes: usize, steps: &[Step]) -> Table {
    let mut t = Table::new(
        format!(
            "3. What dropping frees, with tensors of {} MiB on {device} (MiB)",
            bytes >> 20
        ),
        &["step", "allocated", "reserved"],
    );
    for s in steps {
        t.row([s.what.to_string(), mib(s.allocated), mib(s.reserved)]);
    }
    t
}
