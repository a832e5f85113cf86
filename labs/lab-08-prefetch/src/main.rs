//! `cargo run --release -p lab-08 [-- --device cuda|sim|cpu]`: the experiments of
//! chapter 8 as tables. `bench [--json] [--pytorch FILE]`: bandwidth and the prefetching
//! loop side by side, and PyTorch's bandwidth from `ci/pytorch-reference.py`'s JSON.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use labs_core::Device;

use lab_08::{bench, non_blocking};

#[derive(Parser)]
#[command(about = "Lab 8: pinned memory, non-blocking copies, prefetching")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Fewer repetitions and smaller sizes (for smoke tests).
    #[arg(long, global = true)]
    quick: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Bandwidth (pageable and pinned) and the training loop, naive and prefetched.
    Bench {
        /// One JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// PyTorch's figures to print beside ours: the JSON object that
        /// `python3 ci/pytorch-reference.py` printed on the same machine.
        #[arg(long, value_name = "FILE")]
        pytorch: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let device = args.device.open().context("choosing a device")?;
    match args.command {
        Some(Command::Bench { json, pytorch }) => {
            // Read first, so that a bad file stops the bench before it measures.
            let pytorch = pytorch.as_deref().map(bench::read_pytorch).transpose()?;
            let report = bench::run(
                &device,
                args.quick,
                std::io::stderr().is_terminal(),
                pytorch,
            )?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", bench::text(&device, &report));
            }
        }
        None => experiments(&device, args.quick)?,
    }
    Ok(())
}

fn experiments(device: &Device, quick: bool) -> anyhow::Result<()> {
    let props = device.properties()?;
    println!("Device {device}: {}", props.name);
    println!("{}\n", labs_core::cli::allocator_line(device)?);

    let busy = Duration::from_millis(if quick { 10 } else { 50 });
    let size = if device.is_cuda() && !quick {
        64 << 20
    } else {
        8 << 20
    };
    let nb = non_blocking::measure(device, size, busy)?;
    println!("{}", non_blocking::table(device, &nb));

    let config = bench::loader_config(device, quick);
    let steps = lab_08::training::measure(device, config, std::io::stderr().is_terminal())?;
    let report_line = format!(
        "copy {:.3} ms, compute {:.3} ms: naive step {:.3} ms, prefetched step {:.3} ms",
        steps.copy_ms, steps.compute_ms, steps.naive_step_ms, steps.prefetch_step_ms
    );
    println!("Training-like loop on {device}: {report_line}");
    // The same figures as `bench` prints, so that the two runs compare directly.
    println!(
        "prefetched / max(copy, compute) = {:.3} (slowest of {} passes {:.3} ms); driver calls in the timed steps: {}\n",
        steps.prefetch_ratio,
        lab_08::training::PASSES,
        steps.prefetch_step_worst_ms,
        bench::driver_work_summary(&steps.timed_driver_work)
    );
    println!("{}", lab_08::training::pool_table(device, &steps));
    Ok(())
}
