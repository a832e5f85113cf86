//! `cargo run --release -p lab-11 [-- --device cuda|sim|cpu] [SUBCOMMAND]`: the
//! experiments of chapter 11 as tables, or with `--json` as one JSON object. Without a
//! subcommand it runs them all: `bandwidth`, `pin-cost`, `mapped`, `managed`.

use std::process::ExitCode;

use anyhow::bail;
use clap::{Parser, Subcommand};
use labs_core::format::{bytes, parse_bytes};
use labs_core::table::Table;
use labs_core::Device;
use serde_json::{json, Value};

use lab_11::{bandwidth, managed, mapped, pin_cost, sim_note};

#[derive(Parser)]
#[command(about = "Lab 11: pageable, pinned, mapped and managed memory")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Fewer repetitions and smaller sizes (for smoke tests).
    #[arg(long, global = true)]
    quick: bool,
    /// One JSON object instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Copy bandwidth from pageable and from pinned memory, both ways, by size.
    Bandwidth {
        /// The largest size to copy (sizes 64KiB, 1MiB, 16MiB, 64MiB, 256MiB, 1GiB;
        /// default: 1GiB on a GPU, 64MiB on the simulated GPU).
        #[arg(long, value_name = "SIZE")]
        max_size: Option<String>,
    },
    /// What getting host memory costs, by size: cuMemHostAlloc, cuMemFreeHost, a cache
    /// hit of the pinned-memory allocator, pageable memory.
    PinCost {
        /// The largest size (sizes 64KiB, 1MiB, 16MiB, 256MiB; default 256MiB).
        #[arg(long, value_name = "SIZE")]
        max_size: Option<String>,
    },
    /// A kernel reading its input from device memory, from mapped host memory, and
    /// after a copy from pinned memory.
    Mapped {
        /// The input's size (default: 256MiB on a GPU, 16MiB on the simulated GPU).
        #[arg(long, value_name = "SIZE")]
        size: Option<String>,
    },
    /// Managed memory: pages faulted over, prefetched, or kept on the host; then
    /// requests beyond the device.
    Managed {
        /// The managed buffer's size (default: 256MiB on a GPU, 16MiB on the simulated
        /// GPU).
        #[arg(long, value_name = "SIZE")]
        size: Option<String>,
    },
}

fn main() -> ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

/// A size from a flag: exact, and more than zero.
fn size_flag(flag: &str, text: &str) -> anyhow::Result<usize> {
    match parse_bytes(text) {
        Ok(0) => bail!("{flag}: the size must be more than 0 bytes"),
        Ok(n) => usize::try_from(n).map_err(|_| anyhow::anyhow!("{flag} {text}: too large")),
        Err(e) => bail!("{flag}: {e}"),
    }
}

/// The sizes of a ladder up to `--max-size` (or `default`), at least one.
fn ladder(
    max: Option<usize>,
    default: usize,
    up_to: fn(usize) -> Vec<usize>,
) -> anyhow::Result<Vec<usize>> {
    let max = max.unwrap_or(default);
    let sizes = up_to(max);
    if sizes.is_empty() {
        bail!(
            "--max-size {}: below the smallest size measured, {}",
            bytes(max as u64),
            bytes(up_to(usize::MAX)[0] as u64)
        );
    }
    Ok(sizes)
}

/// A kernel experiment's size: `--size`, or `default`, checked against the device.
fn kernel_size(
    device: &Device,
    size: Option<usize>,
    default: usize,
    buffers: usize,
) -> anyhow::Result<usize> {
    let size = size.unwrap_or(default);
    lab_11::check_kernel_size(device, "--size", size, buffers)?;
    Ok(size)
}

fn samples(quick: bool) -> usize {
    if quick {
        3
    } else {
        5
    }
}

/// Prints a table, the lines under it and the simulated GPU's note, then a blank line.
fn show(device: &Device, table: Table, lines: &[String], sim: &str) {
    print!("{table}");
    for l in lines {
        println!("{l}");
    }
    if let Some(note) = sim_note(device, sim) {
        println!("{note}");
    }
    println!();
}

fn run(args: Args) -> anyhow::Result<()> {
    // Sizes first, so that a bad one stops the lab before it opens a device.
    let (quick, json) = (args.quick, args.json);
    let flag =
        |name: &str, text: &Option<String>| text.as_deref().map(|t| size_flag(name, t)).transpose();
    let size = match &args.command {
        Some(Command::Bandwidth { max_size } | Command::PinCost { max_size }) => {
            flag("--max-size", max_size)?
        }
        Some(Command::Mapped { size } | Command::Managed { size }) => flag("--size", size)?,
        None => None,
    };
    let device = args.device.open()?;
    let mut report = serde_json::Map::new();
    report.insert("device".into(), json!(device.to_string()));
    report.insert("device_name".into(), json!(device.properties()?.name));
    let all = args.command.is_none();
    if all && !json {
        println!("Device {device}: {}\n", device.properties()?.name);
    }
    let run_bandwidth = |max: Option<usize>, report: &mut serde_json::Map<String, Value>| {
        let sizes = ladder(
            max,
            bandwidth::default_max(&device, quick),
            bandwidth::sizes_up_to,
        )?;
        let rows = bandwidth::measure(&device, &sizes)?;
        if json {
            report.insert("bandwidth".into(), serde_json::to_value(&rows)?);
        } else {
            let line = bandwidth::largest_line(&rows)
                .into_iter()
                .collect::<Vec<_>>();
            show(
                &device,
                bandwidth::table(&device, &rows),
                &line,
                bandwidth::SIM,
            );
        }
        anyhow::Ok(())
    };
    let run_pin_cost = |max: Option<usize>, report: &mut serde_json::Map<String, Value>| {
        let sizes = ladder(max, pin_cost::default_max(quick), pin_cost::sizes_up_to)?;
        let rows = sizes
            .iter()
            .map(|&s| pin_cost::measure(&device, s))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if json {
            report.insert("pin_cost".into(), serde_json::to_value(&rows)?);
        } else {
            show(&device, pin_cost::table(&device, &rows), &[], pin_cost::SIM);
        }
        anyhow::Ok(())
    };
    let run_mapped = |size: Option<usize>, report: &mut serde_json::Map<String, Value>| {
        let default = mapped::default_size(&device, quick);
        let size = kernel_size(&device, size, default, mapped::DEVICE_BUFFERS)?;
        let m = mapped::measure(&device, size, samples(quick))?;
        if json {
            report.insert("mapped".into(), serde_json::to_value(m)?);
        } else {
            show(&device, mapped::table(&device, &m), &[], mapped::SIM);
        }
        anyhow::Ok(())
    };
    let run_managed = |size: Option<usize>, report: &mut serde_json::Map<String, Value>| {
        let default = managed::default_size(&device, quick);
        let size = kernel_size(&device, size, default, managed::DEVICE_BUFFERS)?;
        let m = managed::measure(&device, size, samples(quick))?;
        let beyond = managed::beyond_device(&device)?;
        if json {
            report.insert("managed".into(), serde_json::to_value(m)?);
            report.insert("beyond_device".into(), serde_json::to_value(&beyond)?);
        } else {
            show(&device, managed::table(&device, &m), &[], managed::SIM);
            let errors: Vec<String> = beyond
                .iter()
                .filter_map(|r| Some(format!("{}: {}", r.what, r.refused.as_ref()?)))
                .collect();
            show(
                &device,
                managed::beyond_table(&device, &beyond),
                &errors,
                managed::BEYOND_SIM,
            );
        }
        anyhow::Ok(())
    };
    match &args.command {
        Some(Command::Bandwidth { .. }) => run_bandwidth(size, &mut report)?,
        Some(Command::PinCost { .. }) => run_pin_cost(size, &mut report)?,
        Some(Command::Mapped { .. }) => run_mapped(size, &mut report)?,
        Some(Command::Managed { .. }) => run_managed(size, &mut report)?,
        None => {
            run_bandwidth(None, &mut report)?;
            run_pin_cost(None, &mut report)?;
            run_mapped(None, &mut report)?;
            run_managed(None, &mut report)?;
        }
    }
    if json {
        println!("{}", Value::Object(report));
    }
    Ok(())
}
