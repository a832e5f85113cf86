//! `cargo run --release -p lab-05 [-- --device cuda|sim|dry|cpu]`: the experiments of
//! chapter 5. `share` runs two processes on one device under memory fractions; `fit`
//! finds the largest batch that fits a GPU of a given size on the dry-run device (of an
//! MLP, or of the Transformer or GPT-2 training step of `labs-train`, the driver
//! `lab-10 train` runs).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use labs_core::cli::sized;
use labs_core::device::ENV_SIM_CAPACITY;
use labs_core::format::parse_bytes;
use labs_core::{Device, DeviceId};

use lab_05::model::MlpSpec;
use lab_05::{explain, finder, fit, fit_train, fragmentation, pending_free, recovery, share};
use labs_train::{AmpMode, CheckpointMode, ModelKind, TrainConfig};

#[derive(Parser)]
#[command(name = "lab-05", about = "Chapter 5: out of memory")]
struct Cli {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// The size of the simulated or dry-run device, e.g. 24GiB (default:
    /// LABS_SIM_CAPACITY, else 16GiB); for `fit`, the GPU's size to fit.
    #[arg(long, global = true, value_name = "SIZE")]
    capacity: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Two children of this program share the device, each capped at a fraction of 0.4.
    Share,
    /// One child of `share` (started by it).
    #[command(hide = true)]
    ShareChild {
        #[arg(long)]
        index: usize,
        #[arg(long)]
        fraction: f64,
        #[arg(long)]
        hold_ms: u64,
    },
    /// The largest batch that fits a GPU of --capacity, found on the dry-run device
    /// and, on a GPU, checked by a real run.
    Fit {
        /// The model: mlp (an nn::Mlp with Adam), or transformer or gpt2 (the training
        /// driver `lab-10 train` runs, with its defaults and the flags below).
        #[arg(long, default_value = "mlp")]
        model: String,
        /// Model width (transformer, gpt2; default: 512, 768).
        #[arg(long)]
        d_model: Option<usize>,
        /// Encoder and decoder layers each (transformer, default 6), blocks (gpt2,
        /// default 12).
        #[arg(long)]
        layers: Option<usize>,
        /// Sequence length (transformer, gpt2; default: 100, 1024).
        #[arg(long)]
        seq: Option<usize>,
        /// Activation checkpointing (transformer, gpt2).
        #[arg(long, value_enum, default_value = "none")]
        checkpoint: CheckpointMode,
        /// Mixed precision (transformer, gpt2).
        #[arg(long, value_enum, default_value = "none")]
        amp: AmpMode,
        /// Micro-batches per optimizer step (transformer, gpt2): the batch searched is
        /// the micro-batch.
        #[arg(long, default_value_t = 1)]
        accum: usize,
        /// Input features.
        #[arg(long, default_value_t = 2048)]
        input: usize,
        /// Hidden layers' width.
        #[arg(long, default_value_t = 2048)]
        width: usize,
        /// Hidden layers.
        #[arg(long, default_value_t = 8)]
        depth: usize,
        /// Training steps per trial.
        #[arg(long, default_value_t = 2)]
        steps: usize,
        /// The largest batch tried.
        #[arg(long, default_value_t = 1 << 22)]
        max_batch: usize,
    },
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    let flag = cli.device.name.as_deref();
    let capacity = match (&cli.capacity, std::env::var(ENV_SIM_CAPACITY).ok()) {
        (Some(c), _) => Some(size("--capacity", c)?),
        (None, Some(e)) => Some(size(ENV_SIM_CAPACITY, &e)?),
        (None, None) => None,
    };
    match cli.command {
        None => experiments(&open(&cli.device, cli.capacity.as_ref().and(capacity))?),
        Some(Command::Share) => {
            let device = cli.device.open()?;
            let children =
                share::run_children(Some(&device.id().to_string()), Duration::from_millis(1500))?;
            share::print(&device.to_string(), &children);
            if !device.is_cuda() {
                println!(
                    "(on the simulated GPU each process has a simulated device of its own: \
                     the fractions cap each process, but only a GPU is really shared)"
                );
            }
            if children.iter().any(|c| !c.success) {
                bail!("a child failed");
            }
            Ok(())
        }
        Some(Command::ShareChild {
            index,
            fraction,
            hold_ms,
        }) => Ok(share::child(
            &labs_core::cli::open_device(flag)?,
            index,
            fraction,
            Duration::from_millis(hold_ms),
        )?),
        Some(Command::Fit {
            model,
            d_model,
            layers,
            seq,
            checkpoint,
            amp,
            accum,
            input,
            width,
            depth,
            steps,
            max_batch,
        }) => {
            let capacity = capacity.unwrap_or(labs_core::device::DEFAULT_SIM_CAPACITY);
            if max_batch == 0 {
                bail!("--max-batch must be at least 1");
            }
            let kind = match model.as_str() {
                "mlp" => None,
                "transformer" => Some(ModelKind::Transformer),
                "gpt2" => Some(ModelKind::Gpt2),
                _ => bail!("--model {model}: unknown model; available: mlp, transformer, gpt2"),
            };
            if let Some(kind) = kind {
                let mut base = TrainConfig::defaults(kind);
                base.d_model = d_model.unwrap_or(base.d_model);
                if kind == ModelKind::Gpt2 {
                    // Saturated: `validate` refuses a width whose products overflow.
                    base.ffn = base.d_model.saturating_mul(4);
                }
                base.layers = layers.unwrap_or(base.layers);
                base.seq = seq.unwrap_or(base.seq);
                base.checkpoint = checkpoint;
                base.amp = amp;
                base.accum = accum;
                base.steps = steps;
                base.validate()?;
                let device = cli.device.open()?;
                let prediction = fit_train::predict(&device, capacity, &base, max_batch)?;
                let check = if device.is_cuda() {
                    Some(fit_train::check(&device, &prediction, &base)?)
                } else {
                    None
                };
                fit_train::print(&base, &prediction, check.as_ref());
                return Ok(());
            }
            let spec = MlpSpec {
                input,
                hidden: width,
                layers: depth,
                output: 16,
            };
            check_mlp(spec, steps, max_batch)?;
            let device = cli.device.open()?;
            let prediction = fit::predict(&device, capacity, spec, steps, max_batch)?;
            let check = if device.is_cuda() {
                Some(fit::check(&device, &prediction, spec, steps)?)
            } else {
                None
            };
            fit::print(spec, steps, &prediction, check.as_ref());
            Ok(())
        }
    }
}

/// The device `--device` names; with `--capacity`, a fresh simulated or dry-run
/// device of that size instead of the shared one (a GPU's size is its own).
fn open(flag: &labs_core::cli::DeviceFlag, capacity: Option<u64>) -> Result<Device> {
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

/// Refuses `fit`'s MLP sizes that cannot run: zero sizes, and sizes whose memory
/// overflows or exceeds what any device holds, before anything is allocated.
fn check_mlp(spec: MlpSpec, steps: usize, max_batch: usize) -> Result<()> {
    for (flag, v) in [
        ("--input", spec.input),
        ("--width", spec.hidden),
        ("--steps", steps),
    ] {
        if v == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if steps > MAX_STEPS {
        bail!("--steps {steps}: at most {MAX_STEPS} steps a trial");
    }
    if spec.layers > MAX_DEPTH {
        bail!("--depth {}: at most {MAX_DEPTH} hidden layers", spec.layers);
    }
    // Each parameter costs itself, its gradient and Adam's two moments.
    let (input, width) = (("--input", spec.input), ("--width", spec.hidden));
    sized("the first layer", &[input, width], 16)?;
    sized(
        "the hidden layers",
        &[("--depth", spec.layers), width, width],
        16,
    )?;
    sized(
        "the largest batch's input",
        &[("--max-batch", max_batch), input],
        4,
    )?;
    sized(
        "the largest batch's activations",
        &[("--max-batch", max_batch), width],
        4,
    )?;
    Ok(())
}

/// The most training steps of one trial of `fit`.
const MAX_STEPS: usize = 1_000_000;

/// The most hidden layers of `fit`'s MLP.
const MAX_DEPTH: usize = 10_000;

/// A size from a flag or the environment: exact, and more than zero.
fn size(name: &str, text: &str) -> Result<u64> {
    match parse_bytes(text) {
        Ok(0) => bail!("{name}: the size must be more than 0 bytes"),
        Ok(n) => Ok(n),
        Err(e) => bail!("{name}: {e}"),
    }
}

fn experiments(device: &Device) -> Result<()> {
    let props = device.properties()?;
    println!("Device {device}: {}", props.name);
    println!("{}", labs_core::cli::allocator_line(device)?);
    if device.is_dry() {
        println!("(a dry run: every allocation of the simulated GPU, no kernels, no values)");
    } else if !device.is_cuda() {
        println!("(no GPU in use: the simulated GPU, whose allocator is the same code)");
    }
    println!();
    for fraction in [1.0, 0.25] {
        explain::print(device, &explain::provoke(device, fraction)?);
    }
    explain::print_too_large(device, &explain::too_large(device)?);
    let rows = [
        fragmentation::run(device, false)?,
        fragmentation::run(device, true)?,
    ];
    fragmentation::print(device, &rows);
    if device.is_dry() {
        println!("3. (skipped on a dry run: it needs a stream that really works)\n");
    } else {
        let busy = Duration::from_millis(300);
        pending_free::print(device, &pending_free::run(device, busy)?, busy);
    }
    let spec = MlpSpec::for_device(device);
    recovery::print(device, spec, &recovery::run(device, spec)?);
    finder::print(device, spec, &finder::run(device, spec)?);
    Ok(())
}
