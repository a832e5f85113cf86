//! A scoped pool (`torch.cuda.MemPool` with `torch.cuda.use_mem_pool`): a region's
//! allocations come from a pool of their own, its free blocks serve only it, and
//! releasing the pool gives its memory back once its blocks are freed, without touching
//! the default pool's cache.

use labs_core::alloc::{MemPoolId, MemPoolStats};
use labs_core::format::bytes;
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

/// The pools' figures at each point of the experiment.
pub struct Scoped {
    pub points: Vec<(&'static str, MemPoolStats, MemPoolStats)>,
}

// ANCHOR: scoped
/// A region of `depth` ops on `n` floats inside a pool's scope, beside the same region
/// outside it; the pool's and the default pool's figures after each step.
pub fn measure(device: &Device, n: usize, depth: usize) -> Result<Scoped> {
    let a = device.allocator()?;
    let x = Tensor::full(&[n], 1.0f32, device)?;
    let pool = a.create_pool();
    let figures = |what| -> Result<(&'static str, MemPoolStats, MemPoolStats)> {
        device.synchronize()?;
        Ok((what, a.pool_stats(pool)?, a.pool_stats(MemPoolId::DEFAULT)?))
    };
    let mut points = Vec::new();
    let inside = {
        let _scope = a.use_pool(pool)?;
        crate::chain(&x, depth)?
    };
    points.push(figures("after the region in the pool's scope")?);
    let outside = crate::chain(&x, depth)?;
    points.push(figures("after the same region outside it")?);
    drop(inside);
    points.push(figures("the pool's output freed")?);
    a.release_pool(pool)?;
    points.push(figures("the pool released")?);
    drop(outside);
    // ANCHOR_END: scoped
    Ok(Scoped { points })
}

pub fn table(device: &Device, s: &Scoped) -> Table {
    let mut t = Table::new(
        format!("A scoped pool on {device}: the pool's and the default pool's memory"),
        &[
            "point",
            "pool reserved",
            "pool allocated",
            "default reserved",
            "default allocated",
        ],
    );
    for (what, pool, default) in &s.points {
        t.row([
            what.to_string(),
            bytes(pool.reserved),
            bytes(pool.allocated),
            bytes(default.reserved),
            bytes(default.allocated),
        ]);
    }
    t
}
