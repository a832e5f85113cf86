//! `cargo run --release -p lab-07 [-- --device cuda|sim|cpu] [--quick] [--pytorch
//! ci/pytorch-train.py]`: the experiments of chapter 7 as tables, memory in MiB from the
//! device's allocator.

use anyhow::Context;
use clap::Parser;
use labs_core::Device;

use lab_07::model::Sizes;
use lab_07::{categories, curves, driver, full_vs_mixed, gemm, pytorch, scaler};

#[derive(Parser)]
#[command(about = "Lab 7: mixed precision")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Smaller sizes and fewer steps (for smoke tests).
    #[arg(long)]
    quick: bool,
    /// PyTorch's figures beside ours in experiment 6: ci/pytorch-train.py (run per
    /// configuration, on the GPU) or a .jsonl file of its reports.
    #[arg(long, value_name = "PATH")]
    pytorch: Option<std::path::PathBuf>,
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let pytorch = args
        .pytorch
        .as_deref()
        .map(pytorch::Source::open)
        .transpose()?;
    let device = args.device.open().context("choosing a device")?;
    experiments(&device, args.quick, pytorch.as_ref())
}

fn experiments(
    device: &Device,
    quick: bool,
    pytorch: Option<&pytorch::Source>,
) -> anyhow::Result<()> {
    let props = device.properties()?;
    println!("Device {device}: {}", props.name);
    println!("{}", labs_core::cli::allocator_line(device)?);
    if !device.is_cuda() {
        println!(
            "(no GPU in use: the simulated GPU, whose allocator is the same code; its kernels \
             run on the CPU, so its times say nothing about a GPU)"
        );
    }
    println!();
    let s = Sizes::for_device(device, quick);
    let steps = if quick { 2 } else { 10 };
    println!(
        "{}",
        full_vs_mixed::table(device, s, &full_vs_mixed::measure(device, s, steps)?)
    );
    println!(
        "{}",
        categories::table(device, s, &categories::measure(device, s)?)
    );
    let shifts = [0, 8, 16, 24];
    println!(
        "{}",
        scaler::underflow_table(device, s, &scaler::underflow(device, s, &shifts)?)
    );
    println!(
        "{}",
        scaler::overflow_table(device, &scaler::overflow(device, s, 5, 2)?)
    );
    let cs = curves::sizes(device, quick);
    let (n_steps, every) = if quick { (40, 10) } else { (300, 25) };
    println!(
        "{}",
        curves::table(device, cs, &curves::measure(device, cs, n_steps)?, every)
    );
    let n = gemm::side(device, quick);
    let samples = if quick { 2 } else { 10 };
    println!(
        "{}",
        gemm::table(device, n, &gemm::measure(device, n, samples)?)
    );
    if device.id() == labs_core::DeviceId::Cpu {
        println!("6. The training driver: skipped on cpu (autocast here is CUDA's; use sim)");
    } else {
        println!("{}", driver::run(device, quick, pytorch)?);
    }
    Ok(())
}
