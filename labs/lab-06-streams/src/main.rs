//! `cargo run --release -p lab-06 [-- --device cuda|sim|cpu]`: the experiments of
//! chapter 6, printed as tables.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use lab_06::{events, hazard, overlap, priorities, timing};

#[derive(Parser)]
#[command(about = "Lab 6: streams, priorities and events")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Shorter kernels (for smoke tests).
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
    let kernel = Duration::from_millis(if args.quick { 10 } else { 50 });

    println!(
        "{}",
        events::lifecycle_table(&device, &events::lifecycle(&device, kernel)?)
    );
    println!(
        "{}",
        timing::table(&device, &timing::measure(&device, kernel / 5, 10)?)
    );
    println!(
        "{}",
        overlap::table(&device, &overlap::measure(&device, kernel)?)
    );
    println!(
        "{}",
        events::ordering_table(&device, events::ordering(&device, kernel)?)
    );
    println!(
        "{}",
        priorities::table(&device, &priorities::measure(&device, kernel / 2, 6)?)
    );
    let hazards = [
        hazard::run(&device, kernel, false)?,
        hazard::run(&device, kernel, true)?,
    ];
    println!("{}", hazard::table(&device, &hazards));
    if !device.is_cuda() {
        println!(
            "(On {device} every stream is its own thread: streams overlap, but priorities \
             are not modelled.)"
        );
    }
    Ok(())
}
