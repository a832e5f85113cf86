//! `lab-02 mappings`: what the size of one driver mapping buys, on every shared trace.
//!
//! Each trace goes through PyTorch's defaults (fixed segments), PyTorch's expandable
//! segments (grown, never moved), the labs' preset at several mapping sizes, and the
//! driver's stream-ordered pool (`backend:cudaMallocAsync`, no cache of ours).
//! An expandable segment maps memory in driver mappings of at most `max_mapping_mb`,
//! and gives memory back a whole mapping at a time. Each mapping costs tens of
//! microseconds of driver time (create, map, grant access), so larger mappings replay a
//! trace faster, and strand more memory: the idle pages of a mapping that one block
//! still uses cannot go anywhere else. This replays each trace with fixed segments and
//! with expandable segments at several mapping sizes, and, with `--pytorch SCRIPT`,
//! through PyTorch's allocator in its three modes on the same GPU, so that the whole
//! trade-off is one table per trace.
//!
//! Before a trace's rows, the trace is replayed once untimed (ours on a throwaway
//! allocator, PyTorch's with `--warmup 1`), so that no row pays for a driver that has
//! not yet done this work: the first replay in a process is the slowest, and without
//! the warm-up the first row would be measured cold and the others warm.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use labs_core::alloc::replay::{self, ReplayReport, Trace};
use labs_core::alloc::{Allocator, Config};
use labs_core::backend::Backend;
use labs_core::format::bytes;
use labs_core::{Device, DeviceId};

use crate::pytorch;

/// The mapping sizes compared, in MiB; the last stands for "one mapping per block"
/// (larger than any block of the traces).
const SIZES_MB: [u64; 4] = [2, 16, 64, 1 << 20];

/// PyTorch's modes, as PYTORCH_CUDA_ALLOC_CONF.
const PYTORCH_MODES: [(&str, &str); 3] = [
    ("PyTorch native", "expandable_segments:False"),
    ("PyTorch expandable_segments", "expandable_segments:True"),
    ("PyTorch cudaMallocAsync", "backend:cudaMallocAsync"),
];

/// One row of a trace's table.
struct Row {
    name: String,
    fragmentation: f64,
    /// Driver mappings for expandable segments, segments (`cuMemAlloc`) for fixed ones,
    /// stream-ordered allocations for ours with `backend:cudaMallocAsync`, PyTorch's
    /// `num_device_alloc` for its rows (0 for its `cudaMallocAsync`, which counts none).
    calls: u64,
    /// Ours: the calls that take, give back or remap memory, in each quarter of the
    /// trace (`ReplayReport::driver_calls_per_quarter`).
    quarters: Option<[u64; 4]>,
    ns_per_op: f64,
}

impl Row {
    fn ours(name: String, r: &ReplayReport, calls: u64) -> Row {
        Row {
            name,
            fragmentation: r.fragmentation(),
            calls,
            quarters: Some(r.driver_calls_per_quarter),
            ns_per_op: r.ns_per_op(),
        }
    }
}

pub fn run(device: &Device, names: &[String], pytorch_script: Option<&Path>) -> Result<()> {
    let on_sim = matches!(device.id(), DeviceId::Sim(_));
    if pytorch_script.is_some() {
        pytorch::require_gpu(device)?;
    }
    let files = trace_files(names)?;
    let per_trace = 4 + SIZES_MB.len() + pytorch_script.map_or(0, |_| PYTORCH_MODES.len());
    let bar = progress((files.len() * per_trace) as u64);
    let mut tables = Vec::new();
    for path in &files {
        let trace = replay::read_trace(path)?;
        bar.set_message(trace.name.clone());
        let mut rows = Vec::new();
        // The warm-up, untimed: a fresh allocator for each row below all the same.
        replay_once(device, on_sim, &trace, Config::labs())?;
        bar.inc(1);
        let fixed = replay_once(device, on_sim, &trace, Config::default())?;
        bar.inc(1);
        rows.push(Row::ours(
            "ours, PyTorch's defaults (fixed segments)".into(),
            &fixed,
            fixed.device_allocs,
        ));
        let grow = replay_once(
            device,
            on_sim,
            &trace,
            Config::parse("expandable_segments:True")?,
        )?;
        bar.inc(1);
        rows.push(Row::ours(
            "ours, expandable_segments:True".into(),
            &grow,
            grow.num_maps,
        ));
        for mb in SIZES_MB {
            let conf = Config::parse(&format!("preset:labs,max_mapping_mb:{mb}"))?;
            let preset = conf == Config::labs();
            let r = replay_once(device, on_sim, &trace, conf)?;
            bar.inc(1);
            let size = match mb {
                m if m >= 1 << 20 => "one mapping per block".to_string(),
                m => format!("mappings of up to {m} MiB"),
            };
            rows.push(Row::ours(
                format!(
                    "ours, preset labs, {size}{}",
                    if preset { " (its default)" } else { "" }
                ),
                &r,
                r.num_maps,
            ));
        }
        // The driver's pool, last of ours, beside PyTorch's rows: one stream-ordered allocation per request.
        let pool = replay_once(device, on_sim, &trace, Config::cuda_malloc_async())?;
        bar.inc(1);
        rows.push(Row::ours(
            "ours, backend:cudaMallocAsync".into(),
            &pool,
            pool.device_allocs,
        ));
        if let Some(script) = pytorch_script {
            for (name, conf) in PYTORCH_MODES {
                let t = pytorch::replay(script, path, conf, 1)?;
                bar.inc(1);
                t.check_same_trace(&fixed)?;
                rows.push(Row {
                    name: name.into(),
                    fragmentation: t.fragmentation(),
                    calls: t.device_allocs,
                    quarters: None,
                    ns_per_op: t.ns_per_op,
                });
            }
        }
        tables.push((trace.name.clone(), fixed, rows));
    }
    bar.finish_and_clear();
    for (name, fixed, rows) in &tables {
        print_table(name, fixed, rows);
    }
    println!(
        "(reserved/requested: peak reserved over peak requested; calls: driver mappings for \
         expandable segments, segments for fixed ones, stream-ordered allocations for \
         backend:cudaMallocAsync, PyTorch's num_device_alloc for its rows; \
         calls by quarter: every call that takes, gives back or remaps memory, in each quarter \
         of the trace's operations; \
         x fixed: time per operation over ours with fixed segments; every row after one \
         untimed replay of the trace in its process)"
    );
    Ok(())
}

/// The `*.trace.csv.gz` files of `dir`, sorted by name (the chapter's fragmentation
/// table lists them too).
pub(crate) fn trace_files_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = (std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path())))
    .filter(|p| p.to_string_lossy().ends_with(SUFFIX))
    .collect();
    files.sort();
    Ok(files)
}

/// The shared traces named (all of them when none is), in the order given.
fn trace_files(names: &[String]) -> Result<Vec<PathBuf>> {
    let dir = labs_core::testing::data_dir().join("traces");
    let Ok(files) = trace_files_in(&dir) else {
        bail!("no traces at {} (set LABS_DATA_DIR)", dir.display());
    };
    if files.is_empty() {
        bail!("no *{SUFFIX} in {}", dir.display());
    }
    if names.is_empty() {
        return Ok(files);
    }
    let name_of = |p: &PathBuf| {
        let file = p.file_name().unwrap_or_default().to_string_lossy();
        file.trim_end_matches(SUFFIX).to_string()
    };
    let known: Vec<String> = files.iter().map(name_of).collect();
    names
        .iter()
        .map(|n| match known.iter().position(|k| k == n) {
            Some(i) => Ok(files[i].clone()),
            None => bail!(
                "no trace {n} in {} (known: {})",
                dir.display(),
                known.join(", ")
            ),
        })
        .collect()
}

const SUFFIX: &str = ".trace.csv.gz";

/// Replays `trace` through a new allocator of `conf` on the device (a fresh simulated
/// GPU the size of the traces' on sim), and gives its memory back afterwards so that
/// the next replay starts from nothing.
fn replay_once(device: &Device, on_sim: bool, trace: &Trace, conf: Config) -> Result<ReplayReport> {
    let backend: Arc<dyn Backend> = if on_sim {
        labs_core::device::sim_backend(crate::TRACE_GPU)
    } else {
        device.backend_arc()
    };
    let allocator = Allocator::new(backend, conf)?;
    let r = replay::replay(trace, &allocator)?;
    allocator.empty_cache()?;
    Ok(r)
}

fn print_table(name: &str, fixed: &ReplayReport, rows: &[Row]) {
    println!(
        "{name}: {} operations, peak requested {}",
        fixed.ops,
        bytes(fixed.peak_requested)
    );
    println!();
    println!(
        "  {:<58} {:>18} {:>7} {:>22} {:>9} {:>8}",
        "allocator", "reserved/requested", "calls", "calls by quarter", "ns/op", "x fixed"
    );
    for r in rows {
        let quarters = r.quarters.map_or("-".to_string(), |q| {
            q.iter().map(u64::to_string).collect::<Vec<_>>().join("/")
        });
        println!(
            "  {:<58} {:>18.4} {:>7} {:>22} {:>9.0} {:>8.2}",
            r.name,
            r.fragmentation,
            r.calls,
            quarters,
            r.ns_per_op,
            r.ns_per_op / fixed.ns_per_op()
        );
    }
    println!();
}

fn progress(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>28} [{bar:40}] {pos}/{len} replays {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}
