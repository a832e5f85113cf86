//! `cargo run --release -p lab-12 [-- --device cuda|cuda:N|sim] [--json] [COMMAND]`: the
//! experiments of chapter 12, NVML's figures (the simulated GPU's own on `sim`) beside the
//! allocator's. Without a command it runs them all, in the chapter's order.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use labs_core::cli::DeviceFlag;
use labs_core::format::parse_bytes;
use labs_core::Device;

use lab_12::{gap, poll, processes, smi};

#[derive(Parser)]
#[command(
    name = "lab-12",
    about = "Lab 12: device-wide monitoring: nvidia-smi's figures (NVML) beside the allocator's"
)]
struct Cli {
    #[command(flatten)]
    device: DeviceFlag,
    /// Print JSON instead of tables: one object (one a line for `smi --loop`).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The device-wide view, as nvidia-smi prints it: memory, utilisation, temperature,
    /// power, processes (`cuda`: every GPU; `cuda:N`: that one).
    Smi {
        /// Report again every SECONDS (until --count reports, or forever). Fractions
        /// are allowed.
        #[arg(long = "loop", value_name = "SECONDS", value_parser = parse_period)]
        period: Option<Duration>,
        /// Number of reports (default: 1, or unlimited with --loop; one second apart
        /// unless --loop says otherwise).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// The gap between NVML's line for this process and memory_reserved(), step by
    /// step, and taken apart: tensors, workspace, cache, direct memory, context.
    Gap {
        /// The matrix products' workspace, lent from the allocator (default: the
        /// device's own: 32MiB on an H100, none on the simulated GPU).
        #[arg(long, value_name = "SIZE")]
        gemm_workspace: Option<String>,
    },
    /// NVML sampled on a thread while a small training loop runs, beside the
    /// allocator's counters.
    Poll {
        /// How long the loop runs.
        #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = parse_period)]
        seconds: Duration,
        /// How often NVML is sampled.
        #[arg(long, value_name = "SECONDS", default_value = "0.1", value_parser = parse_period)]
        interval: Duration,
    },
    /// NVML's process table, this process found by its id (and on a GPU a child's),
    /// each line beside that process's memory_reserved().
    Processes {
        /// The tensor this process holds (default: 1GiB on a GPU, 64MiB on the
        /// simulated GPU); a child holds half of it.
        #[arg(long, value_name = "SIZE")]
        bytes: Option<String>,
        /// Start no child process.
        #[arg(long)]
        no_child: bool,
    },
    /// The child `processes` starts: holds BYTES until its standard input closes.
    #[command(hide = true)]
    Hold {
        #[arg(long)]
        bytes: u64,
    },
}

fn parse_period(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!(
            "`{text}`: the period must be a positive number of seconds"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A size flag: more than 0 bytes.
fn size(flag: &str, text: &str) -> anyhow::Result<u64> {
    match parse_bytes(text) {
        Ok(0) => bail!("{flag}: the size must be more than 0 bytes"),
        Ok(n) => Ok(n),
        Err(e) => bail!("{flag}: {e}"),
    }
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Cli::parse()))
}

/// NVML restricted to the device's own GPU (the simulated GPU's model on `sim`).
fn source(device: &Device) -> anyhow::Result<smi::Source> {
    Ok(smi::Source::for_device(device, true)?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let json = cli.json;
    // `cuda` shows every GPU, as nvidia-smi does; `cuda:N` just that one.
    let named = cli
        .device
        .name
        .clone()
        .or_else(|| std::env::var(labs_core::device::ENV_DEVICE).ok())
        .is_some_and(|d| d.contains(':'));
    // Checked before the device opens, so that a bad flag fails first.
    let workspace = match &cli.command {
        Some(Command::Gap {
            gemm_workspace: Some(w),
        }) => Some(parse_bytes(w).map_err(|e| anyhow::anyhow!("--gemm-workspace: {e}"))?),
        _ => None,
    };
    let bytes = match &cli.command {
        Some(Command::Processes { bytes: Some(b), .. }) => Some(size("--bytes", b)?),
        _ => None,
    };
    let device = cli.device.open().context("choosing a device")?;
    match cli.command {
        None => all(&device, named, json),
        Some(Command::Smi { period, count }) => {
            let source = smi::Source::for_device(&device, named)?;
            let count = count.unwrap_or(if period.is_some() { u64::MAX } else { 1 });
            // Several reports without a period come a second apart, as `nvidia-smi -l`.
            let period = period.unwrap_or(Duration::from_secs(1));
            for i in 0..count {
                if i > 0 {
                    std::thread::sleep(period);
                }
                print_smi(&device, &source.sample()?, json);
            }
            Ok(())
        }
        Some(Command::Gap { .. }) => {
            let source = source(&device)?;
            if let Some(w) = workspace {
                device.set_gemm_workspace_bytes(w as usize)?;
            }
            let g = gap::run(&device, &source, gap::Sizes::for_device(&device))?;
            if json {
                println!("{}", gap::json(&g));
            } else {
                gap::print(&g);
            }
            Ok(())
        }
        Some(Command::Poll { seconds, interval }) => {
            let source = source(&device)?;
            let options = poll::Options {
                duration: seconds,
                interval,
            };
            let p = poll::run(&device, &source, options)?;
            if json {
                println!("{}", poll::json(&p));
            } else {
                poll::print(&p);
            }
            Ok(())
        }
        Some(Command::Processes { no_child, .. }) => {
            let source = source(&device)?;
            let exe = if no_child { None } else { Some(this_exe()?) };
            let mut options = processes::Options::for_device(&device, exe);
            if let Some(b) = bytes {
                options.bytes = b;
                if let Some(c) = &mut options.child {
                    c.bytes = (b / 2).max(4);
                }
            }
            let p = processes::run(&device, &source, &options)?;
            if json {
                println!("{}", processes::json(&p));
            } else {
                processes::print(&p);
            }
            Ok(())
        }
        Some(Command::Hold { bytes }) => processes::hold(&device, bytes),
    }
}

fn this_exe() -> anyhow::Result<std::path::PathBuf> {
    std::env::current_exe().context("finding this program, to start the child process")
}

fn print_smi(device: &Device, reports: &[smi::GpuReport], json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({ "device": device.to_string(), "gpus": smi::json(reports) })
        );
    } else {
        let heading = format!("{} at {}", device, utc_now());
        for t in smi::tables(&heading, reports) {
            println!("{t}");
        }
    }
}

/// Every experiment, in the chapter's order. The gap's first step must come before
/// anything else touches the GPU: it reads NVML before this process has a context.
fn all(device: &Device, named: bool, json: bool) -> anyhow::Result<()> {
    let smi_source = smi::Source::for_device(device, named)?;
    let reports = smi_source.sample()?;
    drop(smi_source);
    let source = source(device)?;
    if !json {
        println!("1. The device-wide view, as nvidia-smi prints it");
        print_smi(device, &reports, false);
        println!();
    }
    let g = gap::run(device, &source, gap::Sizes::for_device(device))?;
    if !json {
        gap::print(&g);
    }
    let p = poll::run(device, &source, poll::Options::default())?;
    if !json {
        poll::print(&p);
    }
    let options = processes::Options::for_device(device, Some(this_exe()?));
    let pr = processes::run(device, &source, &options)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "device": device.to_string(),
                "smi": smi::json(&reports),
                "gap": gap::json(&g),
                "poll": poll::json(&p),
                "processes": processes::json(&pr),
            })
        );
    } else {
        processes::print(&pr);
    }
    Ok(())
}

/// `HH:MM:SS UTC`: enough to tell successive `--loop` reports apart.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}
