//! Experiment 6: the collectives' bandwidth, as `nccl-tests` measures it: for each size
//! from 8 B to 1 GiB (doubling), one collective over every device, checked once, then
//! timed over `iters` calls; the algorithm bandwidth (size / time) and the bus bandwidth
//! (scaled by what each rank sends and receives, comparable with the links' speed).
//! Beside ours, PyTorch's figures for the same sizes, from the JSON that
//! `ci/pytorch-collectives.py --json` prints under `torchrun` on the same machine.
//!
//! The ranks here are threads of one process (one communicator per GPU, NCCL's
//! `ncclCommInitAll` way); PyTorch's are processes. The time of a size is the slowest
//! rank's, as in PyTorch's script.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use labs_core::dist::{self, BenchOp};
use labs_core::table::Table;
use labs_core::{DType, Device};
use serde::Deserialize;

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub op: BenchOp,
    pub dtype: DType,
    pub minbytes: usize,
    pub maxbytes: usize,
    pub warmup: usize,
    pub iters: usize,
}

/// One size: the slowest rank's time per call and its bandwidths (bytes per second).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bytes: usize,
    pub count: usize,
    pub time: Duration,
    pub algbw: f64,
    pub busbw: f64,
}

/// The sizes from `min` to `max`, doubling (PyTorch's script's and nccl-tests' way).
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut size = min.max(1);
    while size <= max {
        out.push(size);
        size *= 2;
    }
    out
}

/// The elements of the whole buffer for `size` bytes, as PyTorch's script counts them:
/// at least one, and for all_gather and reduce_scatter a multiple of the world size.
pub fn element_count(op: BenchOp, size: usize, elem: usize, world: usize) -> usize {
    let count = (size / elem).max(1);
    match op {
        BenchOp::AllGather | BenchOp::ReduceScatter => world.max(count - count % world),
        _ => count,
    }
}

/// Every size of `o` on every device of `devices`, each rank on its own thread.
pub fn measure(devices: &[Device], o: Options) -> Result<Vec<Row>> {
    let comms = dist::group(devices).context("forming the group")?;
    let world = comms.len();
    let elem = o.dtype.size();
    let mut counts: Vec<usize> = Vec::new();
    for size in sizes(o.minbytes, o.maxbytes) {
        let count = element_count(o.op, size, elem, world);
        if counts.last() != Some(&count) {
            counts.push(count);
        }
    }
    let per_rank: Vec<Result<Vec<dist::CollectiveTiming>>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let counts = &counts;
                std::thread::Builder::new().spawn_scoped(s, move || {
                    counts
                        .iter()
                        .map(|&count| {
                            dist::time_collective(c, o.op, count * elem, o.dtype, o.warmup, o.iters)
                        })
                        .collect::<labs_core::Result<Vec<_>>>()
                        .map_err(anyhow::Error::from)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| bail!("a rank's thread panicked")),
                Err(e) => bail!("cannot start the rank's thread: {e}"),
            })
            .collect()
    });
    let mut timings = Vec::with_capacity(world);
    for (rank, t) in per_rank.into_iter().enumerate() {
        timings.push(t.with_context(|| format!("rank {rank}"))?);
    }
    let factor = dist::bus_bandwidth_factor(o.op, world);
    Ok(counts
        .iter()
        .enumerate()
        .map(|(i, &count)| {
            let time = timings.iter().map(|t| t[i].time).max().unwrap_or_default();
            let bytes = timings[0][i].bytes;
            let algbw = bytes as f64 / time.as_secs_f64().max(1e-12);
            Row {
                bytes,
                count,
                time,
                algbw,
                busbw: algbw * factor,
            }
        })
        .collect())
}

/// What `ci/pytorch-collectives.py --json` prints (the fields used here).
#[derive(Debug, Clone, Deserialize)]
pub struct PyTorchReport {
    pub op: String,
    pub dtype: String,
    pub world_size: usize,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub nccl: Option<String>,
    pub results: Vec<PyTorchRow>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PyTorchRow {
    pub bytes: usize,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    #[serde(default = "yes")]
    pub correct: bool,
}

fn yes() -> bool {
    true
}

/// The name PyTorch's script gives `dtype`.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Reads PyTorch's JSON from `path`, refused unless it measured what `o` measures on
/// `world` ranks (else the columns would compare different things).
pub fn read_pytorch(path: &std::path::Path, o: Options, world: usize) -> Result<PyTorchReport> {
    let text = labs_core::input::read_report(path)
        .with_context(|| format!("reading {}", path.display()))?;
    // torchrun may prefix nothing, but the JSON is the one line that parses.
    let report: PyTorchReport = text
        .lines()
        .find_map(|l| serde_json::from_str(l.trim()).ok())
        .with_context(|| {
            format!(
                "{}: no line is the JSON object of ci/pytorch-collectives.py --json",
                path.display()
            )
        })?;
    let ours = (o.op.to_string(), dtype_name(o.dtype).to_string(), world);
    let theirs = (report.op.clone(), report.dtype.clone(), report.world_size);
    if ours != theirs {
        bail!(
            "--pytorch {}: it measured {} of {} on {} ranks, this run {} of {} on {}: pass \
             the same --op and --dtype, on as many GPUs",
            path.display(),
            theirs.0,
            theirs.1,
            theirs.2,
            ours.0,
            ours.1,
            ours.2
        );
    }
    Ok(report)
}

/// A size as nccl-tests prints it: bytes, K, M or G (binary).
fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The table: ours, and PyTorch's beside when given (GB/s are 10^9 bytes per second).
pub fn table(
    o: Options,
    devices: &[Device],
    rows: &[Row],
    pytorch: Option<&PyTorchReport>,
) -> Table {
    let n = devices.len();
    let mut headers = vec!["size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)"];
    if pytorch.is_some() {
        headers.extend(["PyTorch time (us)", "PyTorch busbw (GB/s)"]);
    }
    let mut t = Table::new(
        format!(
            "6. {} of {} over {n} device(s) ({}), bus factor {:.3}: {} warm-up and {} timed \
             calls per size, the slowest rank's time",
            o.op,
            dtype_name(o.dtype),
            devices
                .iter()
                .map(|d| d.id().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            dist::bus_bandwidth_factor(o.op, n),
            o.warmup,
            o.iters
        ),
        &headers,
    );
    for r in rows {
        let mut cells = vec![
            size(r.bytes),
            r.count.to_string(),
            format!("{:.2}", r.time.as_secs_f64() * 1e6),
            format!("{:.2}", r.algbw / 1e9),
            format!("{:.2}", r.busbw / 1e9),
        ];
        if let Some(p) = pytorch {
            match p.results.iter().find(|x| x.bytes == r.bytes) {
                Some(x) => cells.extend([
                    format!("{:.2}", x.time_us),
                    format!(
                        "{:.2}{}",
                        x.busbw_gbps,
                        if x.correct { "" } else { " (wrong)" }
                    ),
                ]),
                None => cells.extend(["-".to_string(), "-".to_string()]),
            }
        }
        t.row(cells);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_double_and_counts_split_over_the_ranks() {
        assert_eq!(sizes(8, 64), vec![8, 16, 32, 64]);
        assert_eq!(element_count(BenchOp::AllReduce, 8, 4, 3), 2);
        assert_eq!(element_count(BenchOp::AllGather, 8, 4, 3), 3);
        assert_eq!(element_count(BenchOp::ReduceScatter, 64, 4, 3), 15);
        assert_eq!(size(1 << 30), "1G");
        assert_eq!(size(3 << 10), "3K");
        assert_eq!(size(24), "24");
    }
}
