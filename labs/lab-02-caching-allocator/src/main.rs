//! Lab 02: the caching allocator. With no subcommand, the chapter's experiments as
//! tables; `replay` runs a real allocation trace through the allocator; `mappings`
//! replays every shared trace at several mapping sizes; `bench` times the cached path
//! against the driver.

mod bench;
mod experiments;
mod mappings;
mod pytorch;
mod vm_costs;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use labs_core::alloc::{replay, Allocator};
use labs_core::device::ENV_SIM_CAPACITY;
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
        /// The simulated GPU's size (sim only), e.g. 80GiB (default: LABS_SIM_CAPACITY,
        /// else 80GiB, the GPU the shared traces came from).
        #[arg(long)]
        capacity: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Skip (and count) frees of addresses that are not allocated, instead of
        /// failing: for traces whose recording started mid-run.
        #[arg(long)]
        lenient: bool,
        /// The most CSV text the trace may hold, after decompression (default 256MiB).
        #[arg(long, value_name = "SIZE")]
        max_trace_size: Option<String>,
        /// Also replays the trace through PyTorch's allocator in the same mode with
        /// this script (ci/pytorch-replay.py), and prints the two side by side.
        #[arg(long, value_name = "SCRIPT")]
        pytorch: Option<PathBuf>,
    },
    /// Replays every shared trace with fixed segments and with expandable segments at
    /// several mapping sizes (and through PyTorch's three modes with --pytorch): what
    /// the size of one driver mapping buys.
    Mappings {
        /// The traces to replay, by name (gpt2_fp32, ...); all of them when none.
        traces: Vec<String>,
        /// PyTorch's replay twin (ci/pytorch-replay.py); needs --device cuda.
        #[arg(long, value_name = "SCRIPT")]
        pytorch: Option<PathBuf>,
    },
    /// Times the cached alloc+free pair against the driver's paths.
    Bench {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => experiments::run(&cli.device.open()?),
        Some(Command::Bench { json }) => bench::run(&cli.device.open()?, json),
        Some(Command::Mappings { traces, pytorch }) => {
            mappings::run(&cli.device.open()?, &traces, pytorch.as_deref())
        }
        Some(Command::Replay {
            file,
            capacity,
            json,
            lenient,
            max_trace_size,
            pytorch,
        }) => run_replay(
            &cli.device,
            &file,
            &ReplayFlags {
                capacity,
                json,
                lenient,
                max_trace_size,
                pytorch,
            },
        ),
    }
}

/// The capacity of the GPU the shared traces came from (the simulated GPU's size for
/// `replay` and `mappings`).
const TRACE_GPU: u64 = 80 << 30;

/// `replay`'s options, as given.
struct ReplayFlags {
    capacity: Option<String>,
    json: bool,
    lenient: bool,
    max_trace_size: Option<String>,
    pytorch: Option<PathBuf>,
}

/// A size from a flag or the environment: exact, and more than zero.
fn size_option(name: &str, text: &str) -> Result<u64> {
    match parse_bytes(text) {
        Ok(0) => bail!("{name}: the size must be more than 0 bytes"),
        Ok(n) => Ok(n),
        Err(e) => bail!("{name}: {e}"),
    }
}

fn run_replay(
    device_flag: &labs_core::cli::DeviceFlag,
    file: &std::path::Path,
    flags: &ReplayFlags,
) -> Result<()> {
    // As every allocator of the labs: --conf, else LABS_ALLOC_CONF, else PyTorch's.
    let conf = device_flag.config()?;
    let mut limits = replay::TraceLimits::default();
    if let Some(m) = &flags.max_trace_size {
        limits.max_bytes = size_option("--max-trace-size", m)?;
    }
    // The reader's errors name the file; no context is added that would name it again.
    let trace = replay::read_trace_with(file, limits)?;
    let device = device_flag.open()?;
    if flags.pytorch.is_some() {
        pytorch::require_gpu(&device)?;
    }
    let backend = if matches!(device.id(), DeviceId::Sim(_)) {
        // A fresh simulated GPU the size of the trace's, not the shared sim device.
        let env = std::env::var(ENV_SIM_CAPACITY).ok();
        let capacity = match (&flags.capacity, &env) {
            (Some(c), _) => size_option("--capacity", c)?,
            (None, Some(e)) => size_option(ENV_SIM_CAPACITY, e)?,
            (None, None) => TRACE_GPU,
        };
        labs_core::device::sim_backend(capacity)
    } else {
        if flags.capacity.is_some() {
            eprintln!("note: --capacity applies to the simulated GPU only; ignored on {device}");
        }
        device.backend_arc()
    };
    let allocator = Allocator::new(backend, conf.clone())?;
    let r = replay::replay_with(&trace, &allocator, flags.lenient)?;
    // PyTorch's allocator in the same mode, on the same device, after ours.
    let twin = match &flags.pytorch {
        Some(script) => {
            let t = pytorch::replay(script, file, &conf.to_pytorch_conf_string(), 0)?;
            t.check_same_trace(&r)?;
            Some(t)
        }
        None => None,
    };
    if flags.json {
        let mut object = serde_json::json!({
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
            "num_remaps": r.num_remaps,
            "driver_ns": serde_json::to_value(r.driver).expect("plain numbers"),
            "driver_total_ns": r.driver.total_ns(),
            "driver_calls_per_quarter": r.driver_calls_per_quarter,
            "steady_driver_calls": r.steady_driver_calls(),
            "unknown_frees": r.unknown_frees,
            "ns_per_op": r.ns_per_op(),
        });
        if let Some(t) = &twin {
            object["pytorch"] = t.report.clone();
        }
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
        println!("mappings moved   {}", r.num_remaps);
        let q = r.driver_calls_per_quarter;
        println!(
            "memory calls     {} / {} / {} / {} in each quarter of the trace",
            q[0], q[1], q[2], q[3]
        );
        println!(
            "driver time      {:.1} ms of {:.1} ms",
            r.driver.total_ns() as f64 / 1e6,
            r.elapsed.as_secs_f64() * 1e3
        );
        println!("time per op      {:.0} ns", r.ns_per_op());
        if r.unknown_frees > 0 {
            println!("unknown frees    {} (skipped)", r.unknown_frees);
        }
        if let Some(t) = &twin {
            print_twin(&r, t);
        }
    }
    Ok(())
}

/// PyTorch's figures for the same trace and mode, each beside ours.
fn print_twin(r: &replay::ReplayReport, t: &pytorch::TwinReplay) {
    let loop_note = match t.loop_kind.as_str() {
        "c++" => "a C++ loop",
        _ => "a Python loop: its time per op includes the interpreter's",
    };
    println!();
    println!("PyTorch ({}, {}), {loop_note}:", t.conf, t.device);
    println!(
        "peak reserved    {}  ({:.3}x requested; ours {:.3}x)",
        bytes(t.peak_reserved),
        t.fragmentation(),
        r.fragmentation()
    );
    println!("peak allocated   {}", bytes(t.peak_allocated));
    println!(
        "device allocs    {}  (ours {})",
        t.device_allocs, r.device_allocs
    );
    println!(
        "time per op      {:.0} ns  (ours {:.0} ns, {:.2}x PyTorch's)",
        t.ns_per_op,
        r.ns_per_op(),
        r.ns_per_op() / t.ns_per_op
    );
}
