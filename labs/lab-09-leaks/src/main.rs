//! `cargo run --release -p lab-09 [-- --device cuda|sim|cpu] [--quick]`: the
//! experiments of chapter 9 as tables, memory in MiB from the device's allocator.

use anyhow::Context;
use clap::Parser;
use labs_core::Device;

use lab_09::model::Sizes;
use lab_09::{drops, eval, planted, running_loss, unused_result};

#[derive(Parser)]
#[command(about = "Lab 9: memory leaks and graph lifetimes")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Smaller sizes (for smoke tests).
    #[arg(long)]
    quick: bool,
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let device = args.device.open().context("choosing a device")?;
    experiments(&device, args.quick)
}

fn experiments(device: &Device, quick: bool) -> anyhow::Result<()> {
    let props = device.properties()?;
    println!("Device {device}: {}", props.name);
    println!("{}", labs_core::cli::allocator_line(device)?);
    if !device.is_cuda() {
        println!("(no GPU in use: the simulated GPU, whose allocator is the same code)");
    }
    let s = Sizes::for_device(device, quick);
    println!(
        "Model: batch {} x {} inputs, {} hidden layers of {}, one output; {} iterations\n",
        s.batch,
        s.input,
        s.depth + 1,
        s.hidden,
        s.iterations
    );

    println!(
        "{}",
        running_loss::table(device, &running_loss::measure(device, s)?)
    );
    for t in eval::tables(device, s, &eval::measure(device, s)?) {
        println!("{t}");
    }
    let bytes = drops::block_bytes(device, quick);
    println!(
        "{}",
        drops::table(device, bytes, &drops::measure(device, bytes)?)
    );
    let n = unused_result::side(device, quick);
    let mut steps = unused_result::measure(device, n, true)?;
    steps.extend(unused_result::measure(device, n, false)?);
    println!("{}", unused_result::table(device, n, &steps));
    for t in planted::tables(device, &planted::measure(device, s)?) {
        println!("{t}");
    }
    Ok(())
}
