//! Experiment 5: the leak guard finds a planted leak. A loop keeps every loss, graph and
//! all, in a list; the memory history records a backtrace per allocation, and the
//! guard's report names, for each block that outlived its iteration, the op that
//! allocated it and the line of the program that called the op.

use labs_core::alloc::{LeakGuard, LeakReport};
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

use crate::mib;
use crate::model::{batch, Mlp, Sizes};

/// Entries of the memory history kept while the experiment runs.
const HISTORY_ENTRIES: usize = 100_000;

pub struct Outcome {
    /// One report per leaking iteration.
    pub leaking: Vec<LeakReport>,
    /// The same loop keeping `loss.item()`.
    pub fixed: LeakReport,
}

// ANCHOR: planted
pub fn measure(device: &Device, s: Sizes) -> Result<Outcome> {
    let alloc = device.allocator()?;
    alloc.record_memory_history(HISTORY_ENTRIES, true);
    let model = Mlp::new(device, s, 5)?;
    let mut losses: Vec<Tensor> = Vec::new();
    let mut guard = LeakGuard::new(alloc);
    let mut leaking = Vec::new();
    for i in 0..3 {
        let loss = model.loss(&batch(device, s, i)?)?;
        losses.push(loss); // the leak: the loss, and the graph behind it
        leaking.push(guard.end_iteration());
    }
    drop(losses);
    let mut logged: Vec<f32> = Vec::new();
    let mut guard = LeakGuard::new(alloc);
    let loss = model.loss(&batch(device, s, 3)?)?;
    logged.push(loss.item()?); // the fix: a number on the host
    drop(loss);
    let fixed = guard.end_iteration();
    alloc.record_memory_history(0, false);
    Ok(Outcome { leaking, fixed })
}
// ANCHOR_END: planted

pub fn tables(device: &Device, o: &Outcome) -> [Table; 2] {
    let mut t = Table::new(
        format!("5. The leak guard on a loop that keeps its losses in a list, on {device}"),
        &["iteration", "blocks that outlived it", "MiB", "kept by"],
    );
    for (i, r) in o.leaking.iter().enumerate() {
        t.row([
            (i + 1).to_string(),
            r.blocks.len().to_string(),
            mib(r.bytes()),
            "losses.append(loss)".to_string(),
        ]);
    }
    t.row([
        "fixed".to_string(),
        o.fixed.blocks.len().to_string(),
        mib(o.fixed.bytes()),
        "losses.append(loss.item())".to_string(),
    ]);
    let mut u = Table::new(
        "The last leaking iteration's blocks, by the op that allocated each and the line that called it",
        &["block (KiB)", "op", "at"],
    );
    if let Some(r) = o.leaking.last() {
        for b in &r.blocks {
            let origin = b.origin();
            let (op, at) = origin
                .map(|o| (o.op.unwrap_or_default(), o.at.unwrap_or_default()))
                .unwrap_or_default();
            u.row([format!("{:.1}", b.size as f64 / 1024.0), op, at]);
        }
    }
    [t, u]
}
