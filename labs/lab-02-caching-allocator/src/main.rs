//! Lab 02: the caching allocator. With no subcommand, the chapter's experiments as
//! tables; `replay` runs a real allocation trace through the allocator; `bench` times
//! the cached path against the driver.

mod bench;
mod experiments;
mod vm_costs;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use labs_core::alloc::{replay, Allocator, Config};
use labs_core::format::{bytes, parse_bytes};
use labs_core::DeviceId;

#[derive(Parser)]
#[command(name = "lab-02", about = "Chapter 2: a caching allocator")]
struct Cli {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Replays an allocation trace (CSV, gzip'd or not) through the allocator.
    Replay {
        file: PathBuf,
        /// Allocator configuration in LABS_ALLOC_CONF syntax (default: ours).
        #[arg(long)]
        conf: Option<String>,
        /// The simulated GPU's size (sim only), e.g. 80GiB.
        #[arg(long)]
        capacity: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Times the cached alloc+free pair against the driver's paths.
    Bench {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> std::process::ExitCode {
    labs_core::cli::exit(run(Cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => experiments::run(&cli.device.open()?),
        Some(Command::Bench { json }) => bench::run(&cli.device.open()?, json),
        Some(Command::Replay {
            file,
            conf,
            capacity,
            json,
        }) => run_replay(
            cli.device.name.as_deref(),
            &file,
            conf.as_deref(),
            capacity.as_deref(),
            json,
        ),
    }
}

/// The capacity of the GPU the shared traces came from.
const TRACE_GPU: u64 = 80 << 30;

fn run_replay(
    device_flag: Option<&str>,
    file: &std::path::Path,
    conf: Option<&str>,
    capacity: Option<&str>,
    json: bool,
) -> Result<()> {
    let conf = match conf {
        Some(c) => Config::parse(c)?,
        None => Config::default(),
    };
    let trace = replay::read_trace(file).with_context(|| format!("reading {}", file.display()))?;
    let device = labs_core::cli::open_device(device_flag)?;
    let backend = if matches!(device.id(), DeviceId::Sim(_)) {
        // A fresh simulated GPU the size of the trace's, not the shared sim device.
        let capacity = match capacity {
            Some(c) => parse_bytes(c).map_err(anyhow::Error::msg)?,
            None => TRACE_GPU,
        };
        labs_core::device::sim_backend(capacity)
    } else {
        if capacity.is_some() {
            eprintln!("note: --capacity applies to the simulated GPU only; ignored on {device}");
        }
        device.backend_arc()
    };
    let allocator = Allocator::new(backend, conf)?;
    let r = replay::replay(&trace, &allocator)?;
    if json {
        let object = serde_json::json!({
            "trace": r.trace,
            "conf": r.conf,
            "ops": r.ops,
            "peak_requested": r.peak_requested,
            "peak_allocated": r.peak_allocated,
            "peak_reserved": r.peak_reserved,
            "device_allocs": r.device_allocs,
            "num_maps": r.num_maps,
            "num_unmaps": r.num_unmaps,
            "num_sync_all_streams": r.num_sync_all_streams,
            "ns_per_op": r.ns_per_op(),
        });
        println!("{object}");
    } else {
        println!("trace            {}", r.trace);
        println!("conf             {}", r.conf);
        println!("ops              {}", r.ops);
        println!("peak requested   {}", bytes(r.peak_requested));
        println!("peak allocated   {}", bytes(r.peak_allocated));
        println!(
            "peak reserved    {}  ({:.3}x requested)",
            bytes(r.peak_reserved),
            r.fragmentation()
        );
        println!("device allocs    {}", r.device_allocs);
        println!("maps / unmaps    {} / {}", r.num_maps, r.num_unmaps);
        println!("device syncs     {}", r.num_sync_all_streams);
        println!("time per op      {:.0} ns", r.ns_per_op());
        if r.unknown_frees > 0 {
            println!("unknown frees    {} (skipped)", r.unknown_frees);
        }
    }
    Ok(())
}
