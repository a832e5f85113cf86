//! `cargo run --release -p lab-04 [-- --device cuda|sim] [--quick] [SECTION]`: the
//! experiments of chapter 4 as tables, on every device of the chosen kind (every GPU;
//! `LABS_SIM_DEVICES` simulated GPUs, two when unset). Without a section, the first five.
//!
//! Besides: `collectives` (nccl-tests' table, PyTorch's beside with `--pytorch FILE`),
//! `ddp` (one training step: DataParallel-style, DDP, ZeRO-1) and `launch --nproc
//! N -- COMMAND...` (a `torchrun`: one process per rank).

use anyhow::Context;
use clap::{Parser, Subcommand};
use labs_core::dist::BenchOp;
use labs_core::format::parse_bytes;
use labs_core::{DType, Device};

use lab_04::{
    bandwidth, caches, collectives, data_parallel, default_sim_devices, devices, every_device,
    mismatch, outside, replicate, simulated_note,
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
#[derive(Subcommand, Clone, PartialEq, Eq)]
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
    /// Collective bandwidth, nccl-tests' table, 8 B to 1 GiB (16 MiB on simulated GPUs).
    Collectives(CollectivesArgs),
    /// One training step: DataParallel-style replication, DDP, ZeRO-1.
    Ddp,
    /// The memory outside the caching allocator: the CUDA context and NCCL's
    /// communicator (run it alone: it measures from the devices' first use).
    Outside,
    /// Runs COMMAND as N ranks (`torchrun --nproc_per_node N`), each line prefixed by
    /// its rank.
    Launch(LaunchArgs),
}

#[derive(clap::Args, Clone, PartialEq, Eq)]
struct CollectivesArgs {
    #[arg(long, value_enum, default_value = "all-reduce")]
    op: Op,
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dt,
    /// The smallest size (8, 64K, 1M, 1G).
    #[arg(long, default_value = "8")]
    minbytes: String,
    /// The largest size (default 1G on GPUs, 16M on simulated ones).
    #[arg(long)]
    maxbytes: Option<String>,
    /// Untimed calls per size.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed calls per size.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// PyTorch's figures: the JSON of `torchrun --nproc_per_node N
    /// ci/pytorch-collectives.py --json`, run on the same machine.
    #[arg(long, value_name = "FILE")]
    pytorch: Option<std::path::PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Dt {
    F32,
    F16,
    Bf16,
}

#[derive(clap::Args, Clone, PartialEq, Eq)]
struct LaunchArgs {
    /// Ranks (processes) to start on this machine.
    #[arg(long)]
    nproc: usize,
    /// Machines in the job, each running this launcher with its own --node-rank (and
    /// LABS_JOB_TOKEN set to one value on all of them).
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This machine's place among the --nnodes: its ranks are node-rank x nproc onward.
    #[arg(long, default_value_t = 0, requires = "master_addr")]
    node_rank: usize,
    /// The address of node 0, where rank 0 listens (with --nnodes above 1).
    #[arg(long, value_name = "ADDR")]
    master_addr: Option<String>,
    /// The port rank 0 listens on (with --nnodes above 1).
    #[arg(long, value_name = "PORT", default_value_t = 29500)]
    master_port: u16,
    /// Seconds the ranks wait for each other, at the rendezvous and in each collective
    /// on simulated GPUs (LABS_DIST_TIMEOUT for them; 60 by default).
    #[arg(long, value_name = "SECONDS", requires = "master_addr", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout: Option<u64>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
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
    if let Some(Section::Launch(l)) = &args.section {
        return launch(l);
    }
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
    println!("{}", labs_core::cli::allocator_line(&first)?);
    println!();
    let sections = match args.section {
        Some(s) => vec![s.clone()],
        None => ALL.to_vec(),
    };
    for section in &sections {
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

/// `lab-04 launch`: the ranks' output forwarded, rank 0's status returned.
fn launch(l: &LaunchArgs) -> anyhow::Result<()> {
    let (program, rest) = l.command.split_first().context("launch: no command")?;
    let status = if l.nnodes == 1 && l.master_addr.is_none() {
        labs_core::dist::launch(l.nproc, program, rest)?
    } else {
        let Some(master_addr) = l.master_addr.clone() else {
            anyhow::bail!(
                "launch: --nnodes {}: give --master-addr, node 0's address, on every node",
                l.nnodes
            );
        };
        let timeout = l.timeout.map(std::time::Duration::from_secs);
        let nodes = labs_core::dist::Nodes {
            nnodes: l.nnodes,
            node_rank: l.node_rank,
            master_addr,
            master_port: l.master_port,
            job_token: std::env::var(labs_core::dist::ENV_JOB_TOKEN).unwrap_or_default(),
            timeout,
        };
        labs_core::dist::launch_nodes(l.nproc, &nodes, program, rest)?
    };
    if !status.success() {
        anyhow::bail!("rank 0 of {program} ended with {status}");
    }
    Ok(())
}

fn print_section(section: &Section, devices: &[Device], quick: bool) -> anyhow::Result<()> {
    match section {
        Section::Launch(_) => unreachable!("launch opens no device"),
        Section::Collectives(c) => {
            let size = |flag: &str, text: &str| {
                parse_bytes(text).map_err(|e| anyhow::anyhow!("--{flag} {text}: {e}"))
            };
            let default_max = if devices[0].is_cuda() { "1G" } else { "16M" };
            let o = collectives::Options {
                op: match c.op {
                    Op::AllReduce => BenchOp::AllReduce,
                    Op::AllGather => BenchOp::AllGather,
                    Op::ReduceScatter => BenchOp::ReduceScatter,
                    Op::Broadcast => BenchOp::Broadcast,
                },
                dtype: match c.dtype {
                    Dt::F32 => DType::F32,
                    Dt::F16 => DType::F16,
                    Dt::Bf16 => DType::BF16,
                },
                minbytes: size("minbytes", &c.minbytes)? as usize,
                maxbytes: size("maxbytes", c.maxbytes.as_deref().unwrap_or(default_max))? as usize,
                warmup: c.warmup,
                iters: c.iters,
            };
            if o.minbytes == 0 || o.minbytes > o.maxbytes || o.iters == 0 {
                anyhow::bail!(
                    "collectives: need 0 < --minbytes <= --maxbytes and --iters of at least 1"
                );
            }
            let pytorch = match &c.pytorch {
                Some(path) => Some(collectives::read_pytorch(path, o, devices.len())?),
                None => None,
            };
            let rows = collectives::measure(devices, o)?;
            println!(
                "{}",
                collectives::table(o, devices, &rows, pytorch.as_ref())
            );
            if let Some(p) = &pytorch {
                println!(
                    "PyTorch's figures: {} ranks on {}, NCCL {}",
                    p.world_size,
                    p.device.as_deref().unwrap_or("?"),
                    p.nccl.as_deref().unwrap_or("?")
                );
            }
        }
        Section::Ddp => {
            let sizes = data_parallel::Sizes::for_devices(devices, quick);
            let rows = data_parallel::measure(devices, sizes)?;
            println!("{}", data_parallel::table(sizes, &rows));
        }
        Section::Outside => {
            println!("{}", outside::table(&outside::run(devices)?));
            if !devices[0].is_cuda() {
                println!("(a simulated GPU has no CUDA context and its collectives no NCCL: only the allocator uses its memory)");
            }
        }
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
