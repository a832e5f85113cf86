//! `cargo run --release -p lab-10 -- train [flags]`: the training driver of chapter 10,
//! on a GPU, the simulated GPU, or the dry-run device (`--dry-run`), which predicts the
//! GPU's peaks without running a kernel.
//!
//! `train --nproc N` trains data-parallel, one rank per device (DDP, or ZeRO-1 with
//! `--zero1`): on GPUs this program relaunches itself as N processes through
//! `dist::launch` (a process that finds `WORLD_SIZE` set is one rank of such a job, as
//! under `torchrun`); on simulated or dry-run GPUs the ranks are threads.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use labs_core::device::ENV_SIM_CAPACITY;
use labs_core::format::parse_bytes;
use labs_core::{Device, DeviceId};

use lab_10::train::{
    self, data_parallel, AmpMode, AttentionMode, CheckpointMode, DataParallel, ModelKind,
    OptimizerKind, TrainConfig,
};

#[derive(Parser)]
#[command(name = "lab-10", about = "Chapter 10: training memory")]
struct Cli {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// The size of the simulated or dry-run device, e.g. 24GiB (default:
    /// LABS_SIM_CAPACITY, else 16GiB).
    #[arg(long, global = true, value_name = "SIZE")]
    capacity: Option<String>,
    /// The same as --device dry: every allocation of the run, no kernels, so the
    /// peaks predict the GPU's.
    #[arg(long, global = true)]
    dry_run: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Trains a Transformer or a GPT-2 for a few steps and reports peak memory, its
    /// split by category, step time and losses. A flag given twice takes its last value.
    #[command(args_override_self = true)]
    Train(TrainArgs),
}

#[derive(Args)]
struct TrainArgs {
    /// The model.
    #[arg(long, value_enum, default_value = "transformer")]
    model: ModelKind,
    /// Model width (default: transformer 512, gpt2 768).
    #[arg(long)]
    d_model: Option<usize>,
    /// Attention heads (default: transformer 8, gpt2 12).
    #[arg(long)]
    nhead: Option<usize>,
    /// Encoder and decoder layers each (transformer, default 6), blocks (gpt2,
    /// default 12).
    #[arg(long)]
    layers: Option<usize>,
    /// Feed-forward width (transformer, default 2048; gpt2 takes only 4 x d_model).
    #[arg(long)]
    ffn: Option<usize>,
    /// Vocabulary (gpt2, default 50257).
    #[arg(long)]
    vocab: Option<usize>,
    /// Dropout (default: transformer 0.1, gpt2 0.0).
    #[arg(long)]
    dropout: Option<f32>,
    /// The micro-batch.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sequence length (default: transformer 100, gpt2 1024).
    #[arg(long)]
    seq: Option<usize>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    accum: usize,
    /// Activation checkpointing: none, every layer (layers), or every layer keeping
    /// matmul and attention outputs (selective).
    #[arg(long, value_enum, default_value = "none")]
    checkpoint: CheckpointMode,
    /// Offload saved activations to pinned host memory during forward.
    #[arg(long)]
    offload: bool,
    /// The attention kernel: naive (math) or fused.
    #[arg(long, value_enum, default_value = "fused")]
    attention: AttentionMode,
    /// Mixed precision: none, bf16, or f16 (with a gradient scaler).
    #[arg(long, value_enum, default_value = "none")]
    amp: AmpMode,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "adam")]
    optimizer: OptimizerKind,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Seed of the model's initial values and of the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Steps left out of the step time.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Draw where the memory goes over the last step, by allocation category (stacked
    /// areas, the cache on top), into this SVG file.
    #[arg(long, value_name = "FILE")]
    timeline: Option<std::path::PathBuf>,
    /// Data-parallel training on N devices, one rank each (as `torchrun
    /// --nproc_per_node N`): on GPUs, N processes started through `dist::launch`; on
    /// the simulated or dry-run device, N threads over N simulated devices.
    #[arg(long, value_name = "N")]
    nproc: Option<usize>,
    /// Data-parallel with DistributedDataParallel, even on one rank (implied by
    /// --nproc, and when WORLD_SIZE is set by a launcher).
    #[arg(long)]
    ddp: bool,
    /// Data-parallel with ZeRO stage 1 instead of DDP: the optimizer's state sharded
    /// across the ranks, the gradients reduce-scattered.
    #[arg(long)]
    zero1: bool,
}

impl TrainArgs {
    fn config(&self) -> TrainConfig {
        let d = TrainConfig::defaults(self.model);
        let d_model = self.d_model.unwrap_or(d.d_model);
        let ffn = match self.model {
            ModelKind::Transformer => d.ffn,
            ModelKind::Gpt2 => 4 * d_model,
        };
        TrainConfig {
            model: self.model,
            d_model,
            nhead: self.nhead.unwrap_or(d.nhead),
            layers: self.layers.unwrap_or(d.layers),
            ffn: self.ffn.unwrap_or(ffn),
            vocab: self.vocab.unwrap_or(d.vocab),
            dropout: self.dropout.unwrap_or(d.dropout),
            batch: self.batch,
            seq: self.seq.unwrap_or(d.seq),
            steps: self.steps,
            accum: self.accum,
            checkpoint: self.checkpoint,
            offload: self.offload,
            offload_min_bytes: d.offload_min_bytes,
            attention: self.attention,
            amp: self.amp,
            optimizer: self.optimizer,
            lr: self.lr,
            seed: self.seed,
            warmup: self.warmup,
            timeline: self.timeline.is_some(),
        }
    }
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    let Some(Command::Train(args)) = cli.command else {
        println!(
            "lab-10: training memory. Commands:\n  train   trains a Transformer or a GPT-2 \
             and reports its memory (lab-10 train --help)"
        );
        return Ok(());
    };
    let config = args.config();
    config.validate()?;
    let launched = std::env::var("WORLD_SIZE").is_ok_and(|w| !w.trim().is_empty());
    let device = if launched {
        launched_device(&cli.device, cli.dry_run)?
    } else {
        open(&cli.device, cli.dry_run, capacity(cli.capacity.as_deref())?)?
    };
    let show = !args.json && std::io::stderr().is_terminal();
    let bar = progress(config.steps, show);
    let how = if args.zero1 {
        DataParallel::Zero1
    } else {
        DataParallel::Ddp
    };
    let report = if launched {
        if args.nproc.is_some() {
            bail!(
                "--nproc: this process is already one rank of a launched job (WORLD_SIZE is set)"
            );
        }
        let rank_device = device.clone();
        let Some(report) = data_parallel::run_launched_rank(&config, rank_device, how, &bar)?
        else {
            return Ok(()); // rank 0 reports
        };
        report
    } else if args.nproc.is_some() || args.ddp || args.zero1 {
        let nproc = args.nproc.unwrap_or(1);
        if nproc == 0 {
            bail!("--nproc must be at least 1");
        }
        if device.is_cuda() {
            return relaunch(nproc);
        }
        let devices = rank_devices(&device, nproc, capacity(cli.capacity.as_deref())?)?;
        data_parallel::run_in_process(&config, &devices, how, &bar)?
    } else {
        train::run_with_progress(&config, &device, &bar)?
    };
    bar.finish_and_clear();
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!("{}", report.tables());
    }
    if let Some(path) = &args.timeline {
        draw_timeline(&report, &device, path)?;
    }
    if let Some(oom) = &report.oom {
        bail!("{oom}");
    }
    Ok(())
}

/// This program again as `nproc` ranks through `dist::launch`, without `--nproc`: rank
/// 0's output as it is (its JSON stays parseable), the others' prefixed, on stderr.
fn relaunch(nproc: usize) -> Result<()> {
    let exe = std::env::current_exe().context("finding this program to relaunch it")?;
    let mut args = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(a) = given.next() {
        if a == "--nproc" {
            given.next();
        } else if !a.starts_with("--nproc=") {
            args.push(a);
        }
    }
    labs_core::dist::launch_with(nproc, &exe.to_string_lossy(), &args, |line| {
        match (line.rank, line.stream) {
            (0, labs_core::dist::OutputStream::Stdout) => println!("{}", line.text),
            _ => eprintln!("{line}"),
        }
    })?;
    Ok(())
}

/// A launched rank's device: the one of the kind `--device` names (else `LABS_DEVICE`,
/// else a GPU if there is one) at `LOCAL_RANK`, as `torchrun`'s processes take
/// `cuda:LOCAL_RANK`. No other device is opened (a GPU context on `cuda:0` in every
/// rank would cost rank 0's GPU memory).
fn launched_device(flag: &labs_core::cli::DeviceFlag, dry_run: bool) -> Result<Device> {
    let local = labs_core::dist::DistEnv::from_env()?.local_rank;
    let named = flag
        .name
        .clone()
        .or_else(|| std::env::var("LABS_DEVICE").ok())
        .filter(|n| !n.trim().is_empty());
    let kind = match (dry_run, named) {
        (true, _) => DeviceId::Dry(0),
        (false, Some(name)) => name.parse::<DeviceId>()?,
        (false, None) => match labs_core::cuda::device_count() {
            Ok(n) if n > 0 => DeviceId::Cuda(0),
            _ => DeviceId::Sim(0),
        },
    };
    let id = match kind {
        DeviceId::Cuda(_) => DeviceId::Cuda(local),
        DeviceId::Sim(_) => DeviceId::Sim(local),
        DeviceId::Dry(_) => DeviceId::Dry(local),
        DeviceId::Cpu => bail!("a launched rank needs a GPU, simulated or real, not the cpu"),
    };
    if !matches!(id, DeviceId::Cuda(_)) {
        let count = labs_core::device::device_count(id.kind())?;
        labs_core::device::set_sim_device_count(count.max(local + 1))?;
    }
    Device::get(id).with_context(|| format!("opening {id} for rank {local}"))
}

/// The devices of `nproc` in-process ranks like `device` (simulated or dry-run):
/// indices 0 to nproc - 1, or fresh ones of the given capacity.
fn rank_devices(device: &Device, nproc: usize, capacity: Option<u64>) -> Result<Vec<Device>> {
    let dry = match device.id() {
        DeviceId::Sim(_) => false,
        DeviceId::Dry(_) => true,
        other => bail!(
            "--nproc on {other}: data-parallel ranks run on GPUs (processes) or on the \
             simulated or dry-run device (threads)"
        ),
    };
    if let Some(c) = capacity {
        return Ok((0..nproc)
            .map(|_| {
                if dry {
                    Device::new_dry(c)
                } else {
                    Device::new_sim(c)
                }
            })
            .collect());
    }
    if labs_core::device::device_count(device.id().kind())? < nproc {
        labs_core::device::set_sim_device_count(nproc)?;
    }
    (0..nproc)
        .map(|i| {
            let id = if dry {
                DeviceId::Dry(i)
            } else {
                DeviceId::Sim(i)
            };
            Device::get(id).context("opening a rank's device")
        })
        .collect()
}

/// The last step's memory by category, as an SVG picture in `path`.
fn draw_timeline(
    report: &train::TrainReport,
    device: &Device,
    path: &std::path::Path,
) -> Result<()> {
    if report.timeline.is_empty() {
        bail!("--timeline: no step completed, so there is no timeline to draw");
    }
    let c = &report.config;
    let mut title = format!(
        "{:?} d_model {} batch {}x{}",
        c.model, c.d_model, c.batch, c.seq
    )
    .to_lowercase();
    for (on, what) in [
        (c.accum > 1, format!("accum {}", c.accum)),
        (
            c.checkpoint != CheckpointMode::None,
            format!("checkpoint {:?}", c.checkpoint).to_lowercase(),
        ),
        (c.offload, "offload".to_string()),
        (
            c.amp != AmpMode::None,
            format!("amp {:?}", c.amp).to_lowercase(),
        ),
        (true, format!("{:?} attention", c.attention).to_lowercase()),
    ] {
        if on {
            title.push_str(", ");
            title.push_str(&what);
        }
    }
    let name = device.properties().map(|p| p.name).unwrap_or_default();
    let title = format!("One training step: {title} ({device}, {name})");
    let svg = lab_03::plots::category_area_svg(&report.timeline, &title)?;
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `--capacity`, else `LABS_SIM_CAPACITY`: exact, and more than zero.
fn capacity(flag: Option<&str>) -> Result<Option<u64>> {
    let (name, text) = match (flag, std::env::var(ENV_SIM_CAPACITY).ok()) {
        (Some(c), _) => ("--capacity", c.to_string()),
        (None, Some(e)) => (ENV_SIM_CAPACITY, e),
        (None, None) => return Ok(None),
    };
    match parse_bytes(&text) {
        Ok(0) => bail!("{name}: the size must be more than 0 bytes"),
        Ok(n) => Ok(Some(n)),
        Err(e) => bail!("{name}: {e}"),
    }
}

/// The device `--device` (or `--dry-run`) names; with a capacity, a fresh simulated or
/// dry-run device of that size instead of the shared one (a GPU's size is its own).
fn open(flag: &labs_core::cli::DeviceFlag, dry_run: bool, capacity: Option<u64>) -> Result<Device> {
    let mut flag = flag.clone();
    if dry_run {
        match flag.name.as_deref() {
            None | Some("dry") => flag.name = Some("dry".into()),
            Some(other) => bail!("--dry-run is --device dry: it cannot go with --device {other}"),
        }
    }
    let device = flag.open().context("choosing a device")?;
    Ok(match (device.id(), capacity) {
        (DeviceId::Sim(_), Some(c)) => Device::new_sim(c),
        (DeviceId::Dry(_), Some(c)) => Device::new_dry(c),
        (_, Some(_)) => {
            eprintln!(
                "note: --capacity applies to the sim and dry devices only; ignored on {device}"
            );
            device
        }
        (_, None) => device,
    })
}

/// A progress bar on stderr, one tick per optimizer step; hidden unless `show`.
fn progress(steps: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("train [{bar:40}] {pos}/{len} steps {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}
