//! `cargo run --release -p lab-13 [-- --device cuda|sim]`: the experiments of CUDA
//! graphs and memory pools, printed as tables.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use lab_13::{launches, pools, rules, scoped};

#[derive(Parser)]
#[command(about = "Lab 13: CUDA graphs and memory pools")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Fewer repeats and smaller regions (for smoke tests).
    #[arg(long)]
    quick: bool,
}

fn main() -> ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let device = args.device.open().context("choosing a device")?;
    println!("Device {device}: {}", device.properties()?.name);
    println!("{}\n", labs_core::cli::allocator_line(&device)?);
    let repeats = if args.quick { 3 } else { 21 };
    let lengths: &[usize] = if args.quick {
        &[10, 100]
    } else {
        &[10, 100, 1000]
    };
    let rows = lengths
        .iter()
        .map(|&k| launches::measure(&device, k, repeats))
        .collect::<labs_core::Result<Vec<_>>>()?;
    println!("{}", launches::table(&device, &rows));
    let (n, depth) = if args.quick {
        (1 << 18, 4)
    } else {
        (1 << 22, 8)
    };
    println!(
        "{}",
        pools::table(&device, n, depth, &pools::measure(&device, n, depth)?)
    );
    println!("{}", rules::table(&device, &rules::measure(&device)?));
    println!(
        "{}",
        scoped::table(&device, &scoped::measure(&device, n, depth)?)
    );
    Ok(())
}
