//! `cargo run --release -p lab-10 -- train [flags]`: the training driver of chapter 10,
//! on a GPU, the simulated GPU, or the dry-run device (`--dry-run`), which predicts the
//! GPU's peaks without running a kernel.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use labs_core::device::ENV_SIM_CAPACITY;
use labs_core::format::parse_bytes;
use labs_core::{Device, DeviceId};

use lab_10::train::{
    self, AmpMode, AttentionMode, CheckpointMode, ModelKind, OptimizerKind, TrainConfig,
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
    /// Time every kernel launch with events and print the kernel families by GPU time
    /// to stderr: where a step's time goes.
    #[arg(long)]
    profile: bool,
    /// Draw where the memory goes over the last step, by allocation category (stacked
    /// areas, the cache on top), into this SVG file.
    #[arg(long, value_name = "FILE")]
    timeline: Option<std::path::PathBuf>,
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
    let device = open(&cli.device, cli.dry_run, capacity(cli.capacity.as_deref())?)?;
    let show = !args.json && std::io::stderr().is_terminal();
    let bar = progress(config.steps, show);
    if args.profile {
        labs_core::device::profile::start();
    }
    let report = train::run_with_progress(&config, &device, &bar)?;
    bar.finish_and_clear();
    if args.profile {
        labs_core::device::profile::stop();
        eprint_profile(config.steps)?;
    }
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

/// The kernel families by total time over the run, per optimizer step.
fn eprint_profile(steps: usize) -> Result<()> {
    let rows = labs_core::device::profile::take()?;
    let total: f64 = rows.iter().map(|r| r.total.as_secs_f64()).sum();
    eprintln!(
        "GPU time in kernels per step: {:.2} ms in {} launches",
        total * 1e3 / steps.max(1) as f64,
        rows.iter().map(|r| r.launches).sum::<u64>() / steps.max(1) as u64
    );
    for r in rows.iter().take(30) {
        let t = r.total.as_secs_f64();
        eprintln!(
            "{:>9.3} ms {:>5.1}% {:>7} launches  {}",
            t * 1e3 / steps.max(1) as f64,
            100.0 * t / total.max(1e-12),
            r.launches / steps.max(1) as u64,
            r.label
        );
    }
    Ok(())
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
