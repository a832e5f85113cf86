//! A graph's reason to exist: a step of many small kernels spends its time launching
//! them. Replayed as a graph, the same kernels are one launch. Timed on the host, each
//! run synchronised, over `kernels` in-place updates of a small tensor.

use std::time::{Duration, Instant};

use labs_core::device::Graph;
use labs_core::format::duration;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

/// One chain length's figures.
pub struct Launches {
    pub kernels: usize,
    pub eager: Duration,
    pub graph: Duration,
    /// The nodes the capture recorded (the kernels, on a device that runs them).
    pub nodes: usize,
}

/// Elements of the tensor each kernel updates: small, so that launching dominates.
pub const ELEMENTS: usize = 1024;

// ANCHOR: launches
/// The median of `repeats` runs of `kernels` in-place updates (`x += 1e-3 y`), launched
/// one by one, then captured once and replayed.
pub fn measure(device: &Device, kernels: usize, repeats: usize) -> Result<Launches> {
    let x = Tensor::zeros(&[ELEMENTS], DType::F32, device)?;
    let y = Tensor::full(&[ELEMENTS], 1.0f32, device)?;
    let work = || -> Result<()> {
        for _ in 0..kernels {
            x.axpy_(1e-3, &y)?;
        }
        Ok(())
    };
    work()?; // kernels loaded, caches warm
    let eager = median(repeats, || {
        work()?;
        device.synchronize()
    })?;
    let mut graph = Graph::new(device)?;
    graph.capture(None, work)?;
    let replayed = median(repeats, || {
        graph.replay()?;
        device.synchronize()
    })?;
    // ANCHOR_END: launches
    Ok(Launches {
        kernels,
        eager,
        graph: replayed,
        nodes: graph.nodes(),
    })
}

fn median(repeats: usize, mut run: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        run()?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

pub fn table(device: &Device, rows: &[Launches]) -> Table {
    let mut t = Table::new(
        format!(
            "A chain of small kernels ({ELEMENTS} floats each) on {device}: launched one by one, and replayed as a graph (host time, synchronised, median)"
        ),
        &["kernels", "eager", "graph", "eager / graph", "graph nodes"],
    );
    for r in rows {
        t.row([
            r.kernels.to_string(),
            duration(r.eager),
            duration(r.graph),
            format!(
                "{:.1}",
                r.eager.as_secs_f64() / r.graph.as_secs_f64().max(1e-12)
            ),
            r.nodes.to_string(),
        ]);
    }
    t
}
