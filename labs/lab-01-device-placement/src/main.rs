//! `cargo run --release -p lab-01 [-- --device cuda|sim|cpu] [--json]`: the experiments of
//! chapter 1, printed as tables.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use labs_core::format::bytes;

use lab_01::{async_timing, bandwidth, lazy_init, placement, raw_alloc};

#[derive(Parser)]
#[command(about = "Lab 1: device placement, transfers, lazy initialisation, raw allocation cost")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Fewer repetitions and smaller sizes (for smoke tests).
    #[arg(long)]
    quick: bool,
}

fn main() -> ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    // ANCHOR: select
    let device = args.device.open().context("choosing a device")?;
    // ANCHOR_END: select

    // Lazy initialisation must be measured before anything else touches the device.
    let lazy = lazy_init::measure(&device)?;
    let props = device.properties()?;
    let capability = match props.compute_capability {
        (0, 0) => "none (simulated)".to_string(),
        (major, minor) => format!("{major}.{minor}"),
    };
    println!(
        "Device {device}: {} | {} | {} multiprocessors | compute capability {capability}",
        props.name,
        bytes(props.total_memory),
        props.multiprocessors,
    );
    println!("{}\n", labs_core::cli::allocator_line(&device)?);
    println!("{}", lazy_init::table(&device, &lazy));

    println!("{}", placement::creation(&device)?);
    println!("{}", placement::to_semantics(&device)?);
    if device.id() == labs_core::DeviceId::Cpu {
        println!("(on cpu every tensor is a host tensor: there are no two devices to mix)\n");
    } else {
        println!(
            "Adding a tensor on {device} to one on cpu fails:\n  Error: {}\n",
            placement::mismatch_error(&device)?
        );
    }

    let samples = if args.quick { 3 } else { 20 };
    let mut costs = Vec::new();
    for size in raw_alloc::sizes(&device)? {
        if args.quick && size > 20 << 20 {
            continue;
        }
        let n = if size >= 256 << 20 {
            samples.min(5)
        } else {
            samples
        };
        costs.push(raw_alloc::measure(&device, size, n)?);
    }
    println!("{}", raw_alloc::table(&device, &costs));

    let sizes: &[usize] = if args.quick {
        &[1 << 20]
    } else {
        &[1 << 20, 64 << 20, 1 << 30]
    };
    let mut rows = Vec::new();
    for &size in sizes {
        rows.push(bandwidth::measure(
            &device,
            size,
            if size >= 1 << 30 { 3 } else { 5 },
        )?);
    }
    println!("{}", bandwidth::table(&device, &rows));

    let target = Duration::from_millis(if args.quick { 20 } else { 100 });
    let timing = async_timing::measure(&device, target)?;
    println!("{}", async_timing::table(&device, &timing));
    Ok(())
}
