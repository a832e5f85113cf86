//! The memory a graph keeps. A region run eagerly frees its temporaries as it goes,
//! and the cache keeps them for the next request; captured, the same allocations come
//! from the graph's private pool, which serves nobody else and stays reserved for as
//! long as the graph (or a tensor it made) lives. Two graphs captured one after the
//! other keep two pools; given one pool (`pool=g1.pool()`), the second reuses what the
//! first freed.

use labs_core::device::{Graph, GraphPool};
use labs_core::format::bytes;
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

/// The figures of one way of running the region.
pub struct PoolRow {
    pub how: &'static str,
    /// Bytes the region's memory occupies while nothing runs: the cache's growth for
    /// the eager run, the graphs' pools otherwise.
    pub reserved: u64,
    /// Bytes still allocated there (the outputs).
    pub allocated: u64,
}

/// The region (`crate::chain` of `depth` ops on `n` floats) run eagerly, captured
/// once, captured twice with a pool each, and captured twice sharing one pool.
pub fn measure(device: &Device, n: usize, depth: usize) -> Result<Vec<PoolRow>> {
    let a = device.allocator()?;
    let x = Tensor::full(&[n], 1.0f32, device)?;
    crate::chain(&x, depth)?; // warm-up
    device.synchronize()?;
    a.empty_cache()?;
    let mut rows = Vec::new();

    // Eagerly: what the cache keeps reserved afterwards, beside the input.
    let before = a.memory_reserved();
    let out = crate::chain(&x, depth)?;
    device.synchronize()?;
    rows.push(PoolRow {
        how: "eager",
        reserved: a.memory_reserved() - before,
        allocated: out.nbytes() as u64,
    });
    drop(out);
    a.empty_cache()?;

    // ANCHOR: pools
    let pool_row = |how, pools: &[GraphPool]| -> Result<PoolRow> {
        let mut row = PoolRow {
            how,
            reserved: 0,
            allocated: 0,
        };
        for p in pools {
            let s = a.pool_stats(p.id())?;
            row.reserved += s.reserved;
            row.allocated += s.allocated;
        }
        Ok(row)
    };
    let mut one = Graph::new(device)?;
    let y = one.capture(None, || crate::chain(&x, depth))?;
    rows.push(pool_row("one graph", &[one.pool().expect("captured")])?);

    // Two graphs, each with a pool of its own: the second runs on the first's output.
    let (mut g1, mut g2) = (Graph::new(device)?, Graph::new(device)?);
    let y1 = g1.capture(None, || crate::chain(&x, depth))?;
    let y2 = g2.capture(None, || crate::chain(&y1, depth))?;
    let apart = [g1.pool().expect("captured"), g2.pool().expect("captured")];
    rows.push(pool_row("two graphs, a pool each", &apart)?);

    // The same two sharing the first's pool, replayed in the order they were captured.
    let (mut h1, mut h2) = (Graph::new(device)?, Graph::new(device)?);
    let z1 = h1.capture(None, || crate::chain(&x, depth))?;
    let shared = h1.pool().expect("captured");
    let z2 = h2.capture(Some(&shared), || crate::chain(&z1, depth))?;
    rows.push(pool_row("two graphs, one pool", &[shared])?);
    // ANCHOR_END: pools
    drop((y, y1, y2, z1, z2));
    Ok(rows)
}

pub fn table(device: &Device, n: usize, depth: usize, rows: &[PoolRow]) -> Table {
    let mut t = Table::new(
        format!(
            "A region of {depth} elementwise ops on {} on {device}: what stays reserved for it, eagerly and in graphs' pools",
            bytes((n * 4) as u64)
        ),
        &["run", "reserved", "allocated (outputs)"],
    );
    for r in rows {
        t.row([r.how.to_string(), bytes(r.reserved), bytes(r.allocated)]);
    }
    t
}
