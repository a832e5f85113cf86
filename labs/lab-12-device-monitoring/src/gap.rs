//! `gap`: why NVML's line for a process is more than `memory_reserved()`. The process
//! makes tensors through the caching allocator, runs a matrix product (which lends the
//! product library its workspace from the allocator), takes memory from the driver
//! itself as a library calling `cudaMalloc` would, drops half its tensors and empties the
//! cache; after each step it reads `memory_allocated()`, `memory_reserved()`,
//! `mem_get_info()`'s used memory and NVML's figures, and then takes the process's line
//! apart.

use labs_core::alloc::Category;
use labs_core::format::bytes;
use labs_core::table::Table;
use labs_core::{DType, Device, Tensor};

use crate::smi::{self, Source};

/// The experiment's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes of each tensor made through the allocator.
    pub tensor: usize,
    /// How many such tensors; half of them are dropped.
    pub tensors: usize,
    /// Bytes taken from the driver directly, outside the allocator.
    pub direct: usize,
    /// The side of the square float32 matrices multiplied.
    pub side: usize,
}

impl Sizes {
    /// Large enough on a GPU to read in MiB beside its context; smaller on the simulated
    /// GPU, whose memory is host memory.
    pub fn for_device(device: &Device) -> Sizes {
        if device.is_cuda() {
            Sizes {
                tensor: 64 << 20,
                tensors: 8,
                direct: 256 << 20,
                side: 1024,
            }
        } else {
            Sizes {
                tensor: 16 << 20,
                tensors: 8,
                direct: 32 << 20,
                side: 128,
            }
        }
    }
}

/// The figures after one step. `None`: not read at that step (reading the allocator or
/// the driver before the first step would make the CUDA context this experiment
/// measures), or, for NVML's line of this process, not in NVML's process table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub step: &'static str,
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    /// `mem_get_info()`: `total - free`, device-wide, from the driver.
    pub driver_used: Option<u64>,
    /// NVML's line for this process.
    pub process: Option<u64>,
    /// NVML's used memory of the whole device.
    pub device: u64,
}

// ANCHOR: figures
/// What a process can read about its memory on one GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// `memory_allocated()`: the live blocks, the matrix products' workspace included.
    pub allocated: u64,
    /// `memory_reserved()`: the allocator's segments.
    pub reserved: u64,
    /// The matrix products' workspace, lent from the allocator (so part of `allocated`),
    /// as PyTorch lends cuBLAS its workspaces.
    pub workspace: u64,
    /// Bytes the process took from the driver itself, outside the allocator.
    pub direct: u64,
    /// NVML's line for this process; `None` where NVML does not list it.
    pub process: Option<u64>,
    /// NVML's used memory of the whole device.
    pub device: u64,
    /// A GPU: every process has a CUDA context on it, and other processes may share it.
    /// False on the simulated GPU, which has neither.
    pub real_gpu: bool,
}

/// The same memory, taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// Live blocks other than the workspace.
    pub tensors: u64,
    pub workspace: u64,
    /// Reserved but not allocated: the allocator's cache.
    pub cache: u64,
    /// Taken outside the allocator.
    pub direct: u64,
    /// The rest of the process's line: its CUDA context, the kernel images it loaded,
    /// the libraries' own memory. `None` where it cannot be known.
    pub context: Option<u64>,
    /// The device's used memory beyond this process's line: other processes and the
    /// driver's own. `None` where it cannot be known.
    pub others: Option<u64>,
}
// ANCHOR_END: figures

// ANCHOR: attribute
/// Takes the figures apart: each figure holds the one before it, and the difference of
/// two neighbours is one part.
pub fn attribute(f: &Figures) -> Parts {
    let outside_the_allocator = f.reserved + f.direct;
    let (context, others) = match f.process {
        Some(process) if f.real_gpu => (
            process.checked_sub(outside_the_allocator),
            f.device.checked_sub(process),
        ),
        _ => (None, None),
    };
    Parts {
        tensors: f.allocated.saturating_sub(f.workspace),
        workspace: f.workspace,
        cache: f.reserved.saturating_sub(f.allocated),
        direct: f.direct,
        context,
        others,
    }
}
// ANCHOR_END: attribute

/// The experiment's record.
#[derive(Debug, Clone)]
pub struct Gap {
    pub device: String,
    pub sizes: Sizes,
    pub rows: Vec<Row>,
    /// The step the parts are taken at (half the tensors dropped: every part present).
    pub at: &'static str,
    pub figures: Figures,
    pub parts: Parts,
    pub pid: u32,
}

/// The allocator's workspace bytes: what it holds as `Other`, memory no tensor made.
fn workspace(device: &Device) -> labs_core::Result<u64> {
    Ok(device
        .allocator()?
        .memory_by_category()
        .into_iter()
        .find(|(c, _)| *c == Category::Other)
        .map_or(0, |(_, s)| s.current))
}

// ANCHOR: gap_steps
/// Runs the steps on `device`, reading NVML through `source` (the simulated GPU's model
/// on `sim`). Starts from an empty cache and leaves one.
pub fn run(device: &Device, source: &Source, sizes: Sizes) -> anyhow::Result<Gap> {
    let mut rows = Vec::new();
    // NVML first, then the allocator, then the driver: nothing this process reads
    // after NVML can have made it grow.
    let read = |step, allocator: bool, driver: bool| -> anyhow::Result<Row> {
        let (allocated, reserved) = if allocator {
            let a = device.allocator()?;
            (Some(a.memory_allocated()), Some(a.memory_reserved()))
        } else {
            (None, None)
        };
        let driver_used = if driver {
            let m = device.mem_info()?;
            Some(m.total - m.free)
        } else {
            None
        };
        let report = source.sample_one()?;
        Ok(Row {
            step,
            allocated,
            reserved,
            driver_used,
            process: smi::this_process(&report).and_then(|p| p.used),
            device: report.used,
        })
    };
    // Before anything: on a GPU the process has no context yet, and NVML does not list it.
    rows.push(read("start", false, false)?);
    // The driver's figure needs a context, and makes it.
    let _ = device.mem_info()?;
    device.allocator()?.empty_cache()?;
    rows.push(read("mem_get_info()", true, true)?);

    let mut tensors = (0..sizes.tensors)
        .map(|_| Tensor::zeros(&[sizes.tensor / 4], DType::F32, device))
        .collect::<labs_core::Result<Vec<_>>>()?;
    device.synchronize()?;
    rows.push(read("tensors made", true, true)?);

    let a = Tensor::randn(&[sizes.side, sizes.side], 1, device)?;
    let b = Tensor::randn(&[sizes.side, sizes.side], 2, device)?;
    let c = a.matmul(&b)?;
    device.synchronize()?;
    rows.push(read("a matrix product", true, true)?);

    // What a library that calls cudaMalloc itself does: memory the allocator never sees.
    let direct = device.raw_buffer(sizes.direct)?;
    rows.push(read("a direct allocation", true, true)?);

    tensors.truncate(sizes.tensors / 2);
    let at = "half the tensors dropped";
    let row = read(at, true, true)?;
    let figures = Figures {
        allocated: row.allocated.unwrap_or(0),
        reserved: row.reserved.unwrap_or(0),
        workspace: workspace(device)?,
        direct: direct.len() as u64,
        process: row.process,
        device: row.device,
        real_gpu: device.is_cuda(),
    };
    rows.push(row);

    device.allocator()?.empty_cache()?;
    rows.push(read("empty_cache()", true, true)?);

    drop((tensors, a, b, c, direct));
    device.allocator()?.empty_cache()?;
    Ok(Gap {
        device: device.to_string(),
        sizes,
        rows,
        at,
        parts: attribute(&figures),
        figures,
        pid: std::process::id(),
    })
}
// ANCHOR_END: gap_steps

fn or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), bytes)
}

/// The steps' table, the parts' table, and what the device cannot show.
pub fn print(g: &Gap) {
    println!(
        "2. The gap between NVML and memory_reserved on {}: {} tensors of {}, a product of \
         {}x{} matrices, {} taken from the driver directly (pid {})",
        g.device,
        g.sizes.tensors,
        bytes(g.sizes.tensor as u64),
        g.sizes.side,
        g.sizes.side,
        bytes(g.sizes.direct as u64),
        g.pid
    );
    let mut steps = Table::new(
        "What each figure sees, step by step",
        &[
            "after",
            "allocated",
            "reserved",
            "mem_get_info used",
            "NVML: this process",
            "NVML: device",
            "process - reserved",
        ],
    );
    for r in &g.rows {
        steps.row([
            r.step.to_string(),
            or_dash(r.allocated),
            or_dash(r.reserved),
            or_dash(r.driver_used),
            or_dash(r.process),
            bytes(r.device),
            or_dash(match (r.process, r.reserved) {
                (Some(p), Some(res)) => p.checked_sub(res),
                _ => None,
            }),
        ]);
    }
    println!("{steps}");
    let p = &g.parts;
    let f = &g.figures;
    let mut parts = Table::new(
        format!("Where the memory is, after \"{}\"", g.at),
        &[
            "part",
            "bytes",
            "in allocated",
            "in reserved",
            "in NVML's process line",
            "in the device's used",
        ],
    );
    let yes = |b: bool| if b { "yes" } else { "" };
    for (name, value, depth) in [
        ("tensors", Some(p.tensors), 0),
        ("matrix products' workspace", Some(p.workspace), 0),
        ("the allocator's cache", Some(p.cache), 1),
        ("taken from the driver directly", Some(p.direct), 2),
        ("context, kernel images, libraries", p.context, 2),
        ("other processes, the driver", p.others, 3),
    ] {
        parts.row([
            name.to_string(),
            or_dash(value),
            yes(depth < 1).into(),
            yes(depth < 2).into(),
            yes(depth < 3).into(),
            "yes".into(),
        ]);
    }
    parts.row([
        "NVML: this process".to_string(),
        or_dash(f.process),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ]);
    parts.row([
        "NVML: device used".to_string(),
        bytes(f.device),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ]);
    println!("{parts}");
    if !f.real_gpu {
        println!(
            "(the simulated GPU has no CUDA context, kernel images or libraries, and no \
             other process: NVML's figures are the simulator's own, and this process's \
             line is memory_reserved plus the memory taken directly, to the byte; a GPU \
             shows the rest)"
        );
    } else if f.process.is_none() {
        println!(
            "(this process, pid {}, is not in NVML's process table: inside a container NVML \
             may list processes by their ids outside it)",
            g.pid
        );
    }
    println!();
}

/// The record as one JSON object (bytes; figures not read or not known are null).
pub fn json(g: &Gap) -> serde_json::Value {
    let f = &g.figures;
    let p = &g.parts;
    serde_json::json!({
        "device": g.device,
        "pid": g.pid,
        "sizes": {
            "tensor": g.sizes.tensor,
            "tensors": g.sizes.tensors,
            "direct": g.sizes.direct,
            "side": g.sizes.side,
        },
        "rows": g.rows.iter().map(|r| serde_json::json!({
            "step": r.step,
            "allocated": r.allocated,
            "reserved": r.reserved,
            "mem_get_info_used": r.driver_used,
            "nvml_process": r.process,
            "nvml_device": r.device,
        })).collect::<Vec<_>>(),
        "at": g.at,
        "figures": {
            "allocated": f.allocated,
            "reserved": f.reserved,
            "workspace": f.workspace,
            "direct": f.direct,
            "nvml_process": f.process,
            "nvml_device": f.device,
            "real_gpu": f.real_gpu,
        },
        "parts": {
            "tensors": p.tensors,
            "workspace": p.workspace,
            "cache": p.cache,
            "direct": p.direct,
            "context": p.context,
            "others": p.others,
        },
    })
}
