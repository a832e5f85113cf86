//! The book's memory calculator: "will this training step fit on this GPU, and what
//! takes the memory?", answered by lab-10's dry run itself, compiled to WebAssembly so
//! that it runs in the reader's browser with no server.
//!
//! A [`Request`] is what `lab-10 --dry-run train` takes (its flags, the GPU's capacity,
//! the matrix products' workspace, the allocator's configuration); the [`Answer`] is
//! its report (peaks, the split by category at the peak, the out-of-memory error when
//! the step does not fit), the last step's timeline as the SVG `lab-10 --timeline`
//! draws, and, when asked, the largest micro-batch that fits (lab-05 fit's search).
//! [`Answer::command`] is the same dry run on the command line: its figures are the
//! page's, to the byte.
//!
//! [`answer`] and [`answer_json`] calculate, natively or in the browser.

use anyhow::{bail, Context, Result};
use labs_core::alloc::Config;
use labs_core::format::parse_bytes;
use labs_core::Device;
use labs_train::{DataParallel, TrainConfig, TrainReport};
use serde::{Deserialize, Serialize};

/// The largest micro-batch the fit search tries.
pub const MAX_FIT_BATCH: usize = 4096;

/// What the page asks: a dry run as `lab-10` takes it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// `lab-10 train`'s flags (`--model gpt2 --batch 8 --amp bf16 …`; `--nproc N` with
    /// `--ddp`, `--zero1`, `--zero2` or `--zero3` for data parallelism).
    pub flags: String,
    /// The GPU's memory (`--capacity`), e.g. `80GiB`.
    pub capacity: String,
    /// The matrix products' workspace (`--gemm-workspace`), e.g. `32MiB` as on an H100;
    /// empty for none.
    #[serde(default)]
    pub gemm_workspace: String,
    /// The allocator's configuration (`LABS_ALLOC_CONF`); empty for PyTorch's
    /// defaults.
    #[serde(default)]
    pub alloc_conf: String,
    /// Also search the largest micro-batch that fits (`lab-05 fit`).
    #[serde(default)]
    pub fit: bool,
}

/// The largest micro-batch that fits, and the search that found it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    pub batch: usize,
    /// The smallest batch tried whose tensors this build cannot describe (one of 4 GiB
    /// or more in the browser's 32-bit WebAssembly): `batch` is then a lower bound.
    pub beyond_this_build: Option<usize>,
    /// Each batch tried, and whether it fitted, in order.
    pub trials: Vec<(usize, bool)>,
    /// The peaks at the batch found (none when not even a batch of 1 fits).
    pub peak_allocated: Option<u64>,
    pub peak_reserved: Option<u64>,
}

/// The dry run's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// The same dry run on the command line.
    pub command: String,
    /// The GPU's memory, bytes.
    pub capacity_bytes: u64,
    /// `lab-10 train --json`'s report (`oom` set when the step does not fit).
    pub report: TrainReport,
    /// The last step's memory by category, as `lab-10 --timeline` draws it (none when
    /// no step completed).
    pub timeline_svg: Option<String>,
    pub fit: Option<Fit>,
}

/// The request's parts, read and checked.
struct Parsed {
    config: TrainConfig,
    capacity: u64,
    workspace: u64,
    alloc: Config,
    /// Ranks and how, for a data-parallel run.
    data_parallel: Option<(usize, DataParallel)>,
}

fn parse(req: &Request) -> Result<Parsed> {
    let args = labs_train::parse_train_args(&req.flags)?;
    for (asked, flag) in [
        (args.timeline.is_some(), "--timeline"),
        (args.snapshot.is_some(), "--snapshot"),
        (args.profile, "--profile"),
    ] {
        if asked {
            bail!("{flag} writes a file or profiles kernels: the calculator draws the timeline itself and runs no kernel");
        }
    }
    let capacity =
        parse_bytes(req.capacity.trim()).map_err(|e| anyhow::anyhow!("the GPU's memory: {e}"))?;
    if capacity == 0 {
        bail!("the GPU's memory: give more than 0 bytes");
    }
    let workspace = match req.gemm_workspace.trim() {
        "" => 0,
        w => parse_bytes(w).map_err(|e| anyhow::anyhow!("the matrix products' workspace: {e}"))?,
    };
    let alloc = Config::parse(req.alloc_conf.trim()).context("the allocator's configuration")?;
    if usize::BITS < 64 && alloc.expandable_segments {
        bail!(
            "the allocator's configuration: expandable segments reserve more address space \
             than the browser's 32-bit WebAssembly can describe; the calculator runs fixed \
             segments (PyTorch's defaults and their knobs), the command line (lab-10 --dry-run) \
             runs every configuration"
        );
    }
    let data_parallel = match args.nproc {
        Some(0) => bail!("--nproc: give at least 1 rank"),
        n if args.data_parallel() => Some((n.unwrap_or(1), args.how())),
        _ => None,
    };
    let mut config = args.config();
    config.timeline = true;
    Ok(Parsed {
        config,
        capacity,
        workspace,
        alloc,
        data_parallel,
    })
}

/// A new dry-run device of the request's size, workspace and allocator, as `lab-10
/// --dry-run --capacity C --gemm-workspace W` makes it.
fn device(p: &Parsed) -> Result<Device> {
    let device = Device::new_dry(p.capacity);
    device.configure_allocator(p.alloc.clone())?;
    if p.workspace > 0 {
        device.set_gemm_workspace_bytes(p.workspace as usize)?;
    }
    Ok(device)
}

/// One dry run of `config` on a new device; its report, and the device's name.
fn run(p: &Parsed, config: &TrainConfig) -> Result<(TrainReport, String)> {
    let device = device(p)?;
    let report = match p.data_parallel {
        None => labs_train::run(config, &device),
        Some((world, how)) => labs_train::data_parallel::run_lone_rank(config, &device, world, how),
    };
    // The dry device stays in the registry: give back what its cache holds.
    device.allocator()?.empty_cache()?;
    Ok((report?, device.properties()?.name))
}

/// The command line of the same dry run.
fn command(req: &Request) -> String {
    let mut c = String::new();
    if !req.alloc_conf.trim().is_empty() {
        c.push_str(&format!("LABS_ALLOC_CONF={} ", req.alloc_conf.trim()));
    }
    c.push_str(&format!(
        "lab-10 --dry-run --capacity {}",
        req.capacity.trim()
    ));
    if !req.gemm_workspace.trim().is_empty() {
        c.push_str(&format!(" --gemm-workspace {}", req.gemm_workspace.trim()));
    }
    c.push_str(" train ");
    c.push_str(&req.flags.split_whitespace().collect::<Vec<_>>().join(" "));
    c.push_str(" --json");
    c
}

/// The largest micro-batch of `p`'s configuration that fits, by lab-05's search.
fn fit(p: &Parsed) -> Result<Fit> {
    let mut peaks = None;
    let mut beyond: Option<usize> = None;
    let search = lab_05::finder::search(1, MAX_FIT_BATCH, |batch| {
        let config = TrainConfig {
            batch,
            ..p.config.clone()
        };
        // A batch whose sizes no device holds does not fit.
        if config.validate().is_err() {
            return Ok(false);
        }
        match run(p, &config) {
            Ok((report, _)) => Ok::<_, anyhow::Error>(report.oom.is_none()),
            Err(e) if beyond_this_build(&e) => {
                beyond = Some(beyond.map_or(batch, |b| b.min(batch)));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    })?;
    if search.batch > 0 {
        let (report, _) = run(
            p,
            &TrainConfig {
                batch: search.batch,
                ..p.config.clone()
            },
        )?;
        peaks = Some((report.peak_allocated, report.peak_reserved));
    }
    Ok(Fit {
        batch: search.batch,
        beyond_this_build: beyond,
        trials: search.trials,
        peak_allocated: peaks.map(|p| p.0),
        peak_reserved: peaks.map(|p| p.1),
    })
}

/// The dry run the request describes, and the fit search when asked.
pub fn answer(req: &Request) -> Result<Answer> {
    let p = parse(req)?;
    let (report, name) = run(&p, &p.config)?;
    let timeline_svg = if report.timeline.is_empty() {
        None
    } else {
        let title = report.timeline_title(&name);
        Some(labs_core::plot::category_area_svg(
            &report.timeline,
            &title,
        )?)
    };
    let fit = if req.fit { Some(fit(&p)?) } else { None };
    Ok(Answer {
        command: command(req),
        capacity_bytes: p.capacity,
        report,
        timeline_svg,
        fit,
    })
}

/// [`answer`] from JSON to JSON, as the page calls it: `{"answer": …}`, or `{"error":
/// "one line"}` for a request that cannot run (bad flags, an impossible size).
pub fn answer_json(request: &str) -> String {
    let result = serde_json::from_str::<Request>(request)
        .context("the request")
        .and_then(|r| answer(&r));
    match result {
        Ok(a) => serde_json::json!({ "answer": a }).to_string(),
        Err(e) => serde_json::json!({ "error": one_line(&e) }).to_string(),
    }
}

/// Whether `e` is a tensor too large for this build to describe: its bytes do not fit a
/// `usize`, which in the browser's WebAssembly is 32 bits (natively, no device has such
/// a tensor either).
fn beyond_this_build(e: &anyhow::Error) -> bool {
    usize::BITS < 64 && format!("{e:#}").contains("is too large")
}

/// An error and its causes on one line (clap's messages span several).
fn one_line(e: &anyhow::Error) -> String {
    if beyond_this_build(e) {
        return format!(
            "{}: a tensor of this configuration has 4 GiB or more, more than the browser's \
             32-bit WebAssembly can describe; the command line (lab-10 --dry-run) has no such limit",
            e.root_cause()
        );
    }
    let text = format!("{e:#}");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more"))
        .collect();
    lines.join(" ")
}
