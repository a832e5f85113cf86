//! `cargo run --release -p lab-04 [-- --device cuda|sim] [--quick] [SECTION]`: the
//! experiments of chapter 4 as tables, on every device of the chosen kind (every GPU;
//! `LABS_SIM_DEVICES` simulated GPUs, two when unset). Without a section, all of them.

use anyhow::Context;
use clap::{Parser, Subcommand};
use labs_core::Device;

use lab_04::{
    bandwidth, caches, default_sim_devices, devices, every_device, mismatch, replicate,
    simulated_note,
};

#[derive(Parser)]
#[command(about = "Lab 4: several GPUs")]
struct Args {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// Smaller sizes and fewer copies (for smoke tests).
    #[arg(long, global = true)]
    quick: bool,
    #[command(subcommand)]
    section: Option<Section>,
}

/// One experiment of the chapter; each later part of it adds its own.
#[derive(Subcommand, Clone, Copy, PartialEq, Eq)]
enum Section {
    /// The devices, their memory and their peer access.
    Devices,
    /// One caching allocator per device.
    Caches,
    /// The error of an operation across two devices.
    Mismatch,
    /// Peer against staged copy bandwidth, 1 MiB to 1 GiB.
    Bandwidth,
    /// The memory of DataParallel-style replication.
    Replicate,
}

const ALL: [Section; 5] = [
    Section::Devices,
    Section::Caches,
    Section::Mismatch,
    Section::Bandwidth,
    Section::Replicate,
];

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    default_sim_devices()?;
    let first = args.device.open().context("choosing a device")?;
    let devices = every_device(&first).context("opening every device")?;
    println!(
        "{} {} device(s): {}",
        devices.len(),
        first.id().kind(),
        devices
            .iter()
            .map(|d| d.id().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(note) = simulated_note(&first) {
        println!("{note}");
    }
    println!();
    let sections = match args.section {
        Some(s) => vec![s],
        None => ALL.to_vec(),
    };
    for section in sections {
        print_section(section, &devices, args.quick)?;
    }
    Ok(())
}

/// The two devices the cross-device sections use; with one device, a note instead.
fn pair(devices: &[Device]) -> Option<(&Device, &Device)> {
    match devices {
        [a, b, ..] => Some((a, b)),
        [only] => {
            let how = if only.is_cuda() {
                "run with --device sim to see it on simulated GPUs"
            } else {
                "set LABS_SIM_DEVICES=2 or more"
            };
            println!("(only {only}: this section needs two devices; {how})\n");
            None
        }
        [] => None,
    }
}

fn print_section(section: Section, devices: &[Device], quick: bool) -> anyhow::Result<()> {
    match section {
        Section::Devices => println!("{}", devices::table(&devices::measure(devices)?)),
        Section::Caches => {
            let unit = if quick { 4 << 20 } else { 64 << 20 };
            println!("{}", caches::table(&caches::measure(devices, unit)?));
        }
        Section::Mismatch => {
            if let Some((a, b)) = pair(devices) {
                println!("{}", mismatch::report(a, b)?);
            }
        }
        Section::Bandwidth => {
            if let Some((a, b)) = pair(devices) {
                let samples = if quick { 2 } else { 7 };
                let rows = bandwidth::measure(a, b, &bandwidth::sizes(quick), samples)?;
                println!("{}", bandwidth::table(a, b, &rows));
                if let Some(r) = rows.iter().find(|r| !r.exact) {
                    anyhow::bail!(
                        "a copy of {} bytes from {a} to {b} arrived changed",
                        r.bytes
                    );
                }
            }
        }
        Section::Replicate => {
            let sizes = replicate::Sizes::for_devices(devices, quick);
            let (_, rows) = replicate::measure(devices, sizes)?;
            println!("{}", replicate::table(sizes, &rows));
        }
    }
    Ok(())
}
