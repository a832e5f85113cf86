//! `cargo run --release -p lab-10 [-- --device cuda|sim] [--quick] [--pytorch PATH]
//! [--pictures DIR] [--check]`: the experiments of chapter 10 as tables.
//! `lab-10 train [flags]`: the training driver, on a GPU, the simulated GPU, or the
//! dry-run device (`--dry-run`), which predicts the GPU's peaks without running a kernel.
//! `lab-10 configs [--quick]`: the configurations the experiments compare, as flags.
//! `lab-10 formula [flags]`: the activation memory by formula beside the dry run's
//! activation category (and the GPU's, with `--device cuda`).
//!
//! `train --nproc N` trains data-parallel, one rank per device (DDP, or ZeRO-1 with
//! `--zero1`, ZeRO-2 with `--zero2`, ZeRO-3 with `--zero3`): on GPUs this program relaunches itself as N processes through
//! `dist::launch` (a process that finds `WORLD_SIZE` set is one rank of such a job, as
//! under `torchrun`); on simulated or dry-run GPUs the ranks are threads.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use labs_core::cli::{check_outputs, PathArg, Written};
use labs_core::device::ENV_SIM_CAPACITY;
use labs_core::format::parse_bytes;
use labs_core::{Device, DeviceId};

use lab_10::experiments::{self, configs, pytorch::PyTorchSource, Options};
use labs_train::{data_parallel, snapshot, TrainArgs};

#[derive(Parser)]
#[command(name = "lab-10", about = "Chapter 10: training memory")]
struct Cli {
    #[command(flatten)]
    device: labs_core::cli::DeviceFlag,
    /// The size of the simulated or dry-run device, e.g. 24GiB (default:
    /// LABS_SIM_CAPACITY, else 16GiB); on a GPU, the most its allocator may reserve
    /// (PyTorch's set_per_process_memory_fraction).
    #[arg(long, global = true, value_name = "SIZE")]
    capacity: Option<String>,
    /// The same as --device dry: every allocation of the run, no kernels, so the
    /// peaks predict the GPU's.
    #[arg(long, global = true)]
    dry_run: bool,
    /// The matrix products' workspace on the sim or dry device, e.g. 32MiB to predict
    /// an H100, whose cuBLAS workspace (PyTorch's size) comes from the allocator
    /// (default: none; a GPU's is its own).
    #[arg(long, global = true, value_name = "SIZE")]
    gemm_workspace: Option<String>,
    /// Smaller models: a scaled-down GPT-2 on a GPU, tiny models on the simulated one.
    #[arg(long, global = true)]
    quick: bool,
    /// PyTorch's figures beside ours: ci/pytorch-train.py (a .py, run for each
    /// configuration on the same GPU after ours) or the JSON lines of
    /// ci/train-compare.py --out (.jsonl or .json).
    #[arg(long, value_name = "PATH")]
    pytorch: Option<std::path::PathBuf>,
    /// The Python that runs --pytorch *.py.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Write one picture of the last step's memory by category per tutorial run here
    /// (<model>-<technique>.svg).
    #[arg(long, value_name = "DIR")]
    pictures: Option<std::path::PathBuf>,
    /// Check the chapter's targets against PyTorch's figures: exit non-zero with the
    /// list of those missed.
    #[arg(long)]
    check: bool,
    /// Write every run (ours, its dry run, and PyTorch's when run) as JSON lines,
    /// ci/train-compare.py --out's format, which --pytorch FILE.jsonl reads back.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Trains a Transformer or a GPT-2 for a few steps and reports peak memory, its
    /// split by category, step time and losses. A flag given twice takes its last value.
    #[command(args_override_self = true)]
    Train(Box<TrainArgs>),
    /// Prints the configurations the experiments compare (name, then the flags both
    /// `lab-10 train` and ci/pytorch-train.py take), at the GPU's sizes (with --quick,
    /// the quick ones).
    Configs {
        /// The simulated GPU's sizes instead of the GPU's.
        #[arg(long)]
        sim: bool,
    },
    /// The activation memory of a step by formula (per layer, in s, b, h, a), beside
    /// what the dry run counts as activations (and the GPU, with --device cuda). With
    /// no flag, the chapter's configurations; with any, one configuration and its
    /// terms.
    Formula(Box<FormulaArgs>),
    /// What offloading a share of the saved storages (`train --offload --offload-share
    /// S`) leaves at the peak, by dry run, for the chapter's two models at the GPU's
    /// sizes: the peak allocated and the share of the bytes actually sent.
    Shares,
    /// What GPT-2 small's step keeps at its peak with the classifier as written and
    /// fused (`train --fused-classifier`) in chunks of 512 to 8192 rows, by dry run at
    /// the chapter's sizes: the peak allocated, its activations and temporaries.
    Classifier,
}

/// `lab-10 formula`'s flags: `lab-10 train`'s, for what the formula depends on.
#[derive(clap::Args, Default)]
struct FormulaArgs {
    /// The model.
    #[arg(long, value_enum)]
    model: Option<labs_train::ModelKind>,
    /// Model width (default: transformer 512, gpt2 768).
    #[arg(long)]
    d_model: Option<usize>,
    /// Attention heads (default: transformer 8, gpt2 12).
    #[arg(long)]
    nhead: Option<usize>,
    /// Encoder and decoder layers each (transformer, default 6), blocks (gpt2, 12).
    #[arg(long)]
    layers: Option<usize>,
    /// Feed-forward width (transformer, default 2048; gpt2 takes only 4 x d_model).
    #[arg(long)]
    ffn: Option<usize>,
    /// Vocabulary (gpt2, default 50257).
    #[arg(long)]
    vocab: Option<usize>,
    /// Dropout (default: transformer 0.1, gpt2 0.0).
    #[arg(long)]
    dropout: Option<f32>,
    /// The micro-batch (default 1).
    #[arg(long)]
    batch: Option<usize>,
    /// Sequence length (default: transformer 100, gpt2 1024).
    #[arg(long)]
    seq: Option<usize>,
    /// Activation checkpointing: none or every layer (the formula does not cover
    /// selective).
    #[arg(long, value_enum)]
    checkpoint: Option<labs_train::CheckpointMode>,
    /// The attention kernel: naive (math) or fused.
    #[arg(long, value_enum)]
    attention: Option<labs_train::AttentionMode>,
    /// Mixed precision: none, bf16 or f16.
    #[arg(long, value_enum)]
    amp: Option<labs_train::AmpMode>,
}

impl FormulaArgs {
    /// The one configuration the flags describe, or `None` without any flag.
    fn config(&self) -> Result<Option<labs_train::TrainConfig>> {
        let given = self.model.is_some()
            || self.d_model.is_some()
            || self.nhead.is_some()
            || self.layers.is_some()
            || self.ffn.is_some()
            || self.vocab.is_some()
            || self.dropout.is_some()
            || self.batch.is_some()
            || self.seq.is_some()
            || self.checkpoint.is_some()
            || self.attention.is_some()
            || self.amp.is_some();
        if !given {
            return Ok(None);
        }
        let model = self.model.unwrap_or(labs_train::ModelKind::Transformer);
        let d = labs_train::TrainConfig::defaults(model);
        let d_model = self.d_model.unwrap_or(d.d_model);
        let c = labs_train::TrainConfig {
            d_model,
            nhead: self.nhead.unwrap_or(d.nhead),
            layers: self.layers.unwrap_or(d.layers),
            ffn: self.ffn.unwrap_or(match model {
                labs_train::ModelKind::Transformer => d.ffn,
                labs_train::ModelKind::Gpt2 => d_model.saturating_mul(4),
            }),
            vocab: self.vocab.unwrap_or(d.vocab),
            dropout: self.dropout.unwrap_or(d.dropout),
            batch: self.batch.unwrap_or(d.batch),
            seq: self.seq.unwrap_or(d.seq),
            checkpoint: self.checkpoint.unwrap_or(d.checkpoint),
            attention: self.attention.unwrap_or(d.attention),
            amp: self.amp.unwrap_or(d.amp),
            steps: 2,
            ..d
        };
        c.validate()?;
        Ok(Some(c))
    }
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    let args = match cli.command {
        Some(Command::Train(args)) => args,
        Some(Command::Configs { sim }) => {
            let scale = match (sim, cli.quick) {
                (false, false) => configs::Scale::Full,
                (false, true) => configs::Scale::Quick,
                (true, false) => configs::Scale::Sim,
                (true, true) => configs::Scale::Tiny,
            };
            for c in configs::configurations(scale) {
                println!("{}\t{}", c.name, c.flags);
            }
            return Ok(());
        }
        Some(Command::Formula(args)) => return formula(&cli.device, cli.dry_run, &args),
        Some(Command::Shares) => return shares(cli.gemm_workspace.as_deref()),
        Some(Command::Classifier) => {
            let workspace = cli.gemm_workspace.as_deref();
            let table = lab_10::experiments::classifier::table(|dry| match workspace {
                Some(size) => set_gemm_workspace(dry, size),
                None => Ok(()),
            })?;
            println!("{table}");
            return Ok(());
        }
        None => return experiments(cli),
    };
    let config = args.config();
    config.validate()?;
    if config.graph && args.profile {
        bail!(
            "--graph and --profile: the profile brackets every launch with events, which a captured step cannot record; profile the eager step"
        );
    }
    if let Some(n) = args.nproc {
        if n == 0 {
            bail!("--nproc must be at least 1");
        }
        let most = labs_core::dist::MAX_LOCAL_RANKS;
        if n > most {
            bail!("--nproc {n} is more than {most}, the most ranks one machine runs");
        }
    }
    let launched = std::env::var("WORLD_SIZE").is_ok_and(|w| !w.trim().is_empty());
    // Before the run: a bad path fails now, not after the training it would record. A
    // data-parallel run writes its snapshots as FILE.rankN (rank 0's stands for all).
    let data_parallel = launched || args.data_parallel();
    let snapshot_file = (args.snapshot.as_deref()).map(|p| match data_parallel {
        true => snapshot::rank_path(p, 0),
        false => p.to_path_buf(),
    });
    let outputs: Vec<_> = [
        ("--timeline", args.timeline.as_deref()),
        ("--snapshot", snapshot_file.as_deref()),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some((PathArg::new(flag, path?), Written::File)))
    .collect();
    check_outputs(&outputs, &[])?;
    let device = if launched {
        launched_device(&cli.device, cli.dry_run, capacity(cli.capacity.as_deref())?)?
    } else {
        open(&cli.device, cli.dry_run, capacity(cli.capacity.as_deref())?)?
    };
    if let Some(size) = cli.gemm_workspace.as_deref() {
        set_gemm_workspace(&device, size)?;
    }
    let show = !args.json && std::io::stderr().is_terminal();
    let bar = progress(config.steps, show);
    let how = args.how();
    if args.profile {
        labs_core::device::profile::start();
    }
    let report = if launched {
        if args.nproc.is_some() {
            bail!(
                "--nproc: this process is already one rank of a launched job (WORLD_SIZE is set)"
            );
        }
        let rank = labs_core::dist::DistEnv::from_env()?.rank;
        let snapshots = Snapshots::start(&args, std::slice::from_ref(&device), rank)?;
        let outcome = data_parallel::run_launched_rank(&config, device.clone(), how, &bar);
        snapshots.finish()?;
        let Some(report) = outcome? else {
            return Ok(()); // rank 0 reports
        };
        report
    } else if args.data_parallel() {
        let nproc = args.nproc.unwrap_or(1);
        if device.is_cuda() {
            return relaunch(nproc);
        }
        let devices = rank_devices(
            &device,
            nproc,
            capacity(cli.capacity.as_deref())?.map(|c| c.bytes),
        )?;
        if let Some(size) = cli.gemm_workspace.as_deref() {
            for rank in &devices {
                set_gemm_workspace(rank, size)?;
            }
        }
        let snapshots = Snapshots::start(&args, &devices, 0)?;
        let outcome = data_parallel::run_in_process(&config, &devices, how, &bar);
        snapshots.finish()?;
        outcome?
    } else {
        let mut snapshots = Snapshots::start(&args, std::slice::from_ref(&device), 0)?;
        snapshots.single = true;
        let outcome = labs_train::run_with_progress(&config, &device, &bar);
        snapshots.finish()?;
        outcome?
    };
    bar.finish_and_clear();
    if args.profile {
        labs_core::device::profile::stop();
        let timed = config.steps.saturating_sub(config.warmup);
        if timed == 0 {
            eprintln!(
                "note: --profile: no kernel profile, every one of the {} steps is a \
                 --warmup step",
                config.steps
            );
        } else {
            eprint_profile(timed)?;
        }
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!("{}", report.tables());
    }
    if let Some(path) = &args.timeline {
        if report.timeline.is_empty() && report.oom.is_some() {
            eprintln!("note: --timeline: nothing drawn, no step completed before the run ran out of memory");
        } else {
            draw_timeline(&report, &device, path)?;
        }
    }
    if let Some(oom) = &report.oom {
        bail!("{oom}");
    }
    Ok(())
}

/// `--snapshot`'s recording on each rank's device (ranks numbered from `first_rank`):
/// started before the model is built, written when the run ends, failed or not.
struct Snapshots<'a> {
    path: Option<&'a std::path::Path>,
    devices: &'a [Device],
    first_rank: usize,
    /// One device and no data parallelism: the file is FILE itself, not FILE.rank0.
    single: bool,
}

impl<'a> Snapshots<'a> {
    fn start(args: &'a TrainArgs, devices: &'a [Device], first_rank: usize) -> Result<Self> {
        let path = args.snapshot.as_deref();
        if path.is_some() {
            for d in devices {
                snapshot::start(d, args.snapshot_stacks)?;
            }
        }
        Ok(Snapshots {
            path,
            devices,
            first_rank,
            single: false,
        })
    }

    fn finish(self) -> Result<()> {
        let Some(path) = self.path else {
            return Ok(());
        };
        for (i, d) in self.devices.iter().enumerate() {
            if self.single {
                snapshot::finish(d, path)?;
            } else {
                snapshot::finish(d, &snapshot::rank_path(path, self.first_rank + i))?;
            }
        }
        Ok(())
    }
}

/// The kernel families by total time over the `steps` steps after the warm-up (at
/// least one), per step.
fn eprint_profile(steps: usize) -> Result<()> {
    let rows = labs_core::device::profile::take()?;
    let total: f64 = rows.iter().map(|r| r.total.as_secs_f64()).sum();
    eprintln!(
        "GPU time in kernels per step: {:.2} ms in {} launches",
        total * 1e3 / steps.max(1) as f64,
        rows.iter().map(|r| r.launches).sum::<u64>() / steps.max(1) as u64
    );
    for r in rows.iter().take(30) {
        let t = r.total.as_secs_f64();
        eprintln!(
            "{:>9.3} ms {:>5.1}% {:>7} launches  {}",
            t * 1e3 / steps.max(1) as f64,
            100.0 * t / total.max(1e-12),
            r.launches / steps.max(1) as u64,
            r.label
        );
    }
    Ok(())
}

/// The chapter's experiments (no subcommand).
fn experiments(cli: Cli) -> Result<()> {
    if cli.dry_run {
        bail!("--dry-run applies to train: the experiments run on a device that computes, and predict each run with a dry run of their own");
    }
    // Checked first, so that a bad path stops the run before it measures.
    let mut outputs = Vec::new();
    if let Some(p) = cli.out.as_deref() {
        outputs.push((PathArg::new("--out", p), Written::File));
    }
    if let Some(p) = cli.pictures.as_deref() {
        outputs.push((PathArg::new("--pictures", p), Written::Folder));
    }
    let inputs: Vec<_> = (cli.pytorch.as_deref())
        .map(|p| PathArg::new("--pytorch", p))
        .into_iter()
        .collect();
    check_outputs(&outputs, &inputs)?;
    let pytorch = (cli.pytorch.as_deref())
        .map(|p| PyTorchSource::open(p, &cli.python))
        .transpose()?;
    let device = open(&cli.device, false, capacity(cli.capacity.as_deref())?)?;
    let options = Options {
        quick: cli.quick,
        pytorch,
        pictures: cli.pictures,
        check: cli.check,
        out: cli.out,
        progress: std::io::stderr().is_terminal(),
    };
    let mut stdout = std::io::stdout();
    let outcome = experiments::run(&device, &options, &mut stdout)?;
    if outcome.targets_met == Some(false) {
        bail!("--check: the chapter's targets were not all met (listed above)");
    }
    Ok(())
}

/// `lab-10 formula`: the formula beside the dry run, and the GPU's run on a GPU.
fn formula(flag: &labs_core::cli::DeviceFlag, dry_run: bool, args: &FormulaArgs) -> Result<()> {
    use lab_10::formula::{
        chapter_configurations, compare, comparison_table, differences, terms_table,
    };
    if dry_run {
        bail!("--dry-run: formula always runs the dry run; --device cuda adds the GPU's run");
    }
    let device = flag.open().context("choosing a device")?;
    let gpu = device
        .properties()
        .ok()
        .filter(|_| device.is_cuda())
        .map(|p| p.name);
    let rows = match args.config()? {
        Some(c) => {
            let f = lab_10::formula::formula(&c)?;
            println!("{}", terms_table(&c, &f));
            vec![compare("flags", &c, &device)?]
        }
        None => (chapter_configurations()?.iter())
            .map(|(name, c)| compare(name, c, &device))
            .collect::<Result<Vec<_>>>()?,
    };
    println!("{}", comparison_table(&rows, gpu.as_deref()));
    print!("{}", differences(&rows));
    Ok(())
}

/// The shares `lab-10 shares` offloads, 1 being everything.
const SHARES: [f64; 6] = [0.0, 0.1, 0.2, 0.25, 0.5, 1.0];

/// `lab-10 shares`: each model's peak by dry run against the share offloaded.
fn shares(gemm_workspace: Option<&str>) -> Result<()> {
    use lab_10::experiments::configs::{configurations, Scale};
    use lab_10::experiments::tables::mib;
    let mut table = labs_core::table::Table::new(
        "Offloading a share of the saved storages (the tutorial's model at 64 x 100, GPT-2 small at 8 x 1024): the dry run's peak allocated and the share of the storages' bytes sent",
        &["run", "alloc MiB", "share sent"],
    );
    for (name, model) in [("tutorial-none", "tutorial"), ("gpt2-none", "gpt2")] {
        let c = (configurations(Scale::Full).into_iter())
            .find(|c| c.name == name)
            .context("the chapter's configurations")?;
        let base = c.train_config()?;
        for share in SHARES {
            let config = labs_train::TrainConfig {
                offload: share > 0.0,
                offload_share: if share > 0.0 { share } else { 1.0 },
                ..base.clone()
            };
            let dry = Device::new_dry(1 << 40);
            if let Some(size) = gemm_workspace {
                set_gemm_workspace(&dry, size)?;
            }
            let report = labs_train::run(&config, &dry)?;
            let sent = report.offload.as_ref().map_or("-".to_string(), |o| {
                let could = o.share_could_bytes.max(1) as f64;
                format!("{:.1}%", 100.0 * o.share_sent_bytes as f64 / could)
            });
            let asked = if share > 0.0 {
                format!("{:.0}%", 100.0 * share)
            } else {
                "none".to_string()
            };
            table.row([format!("{model} {asked}"), mib(report.peak_allocated), sent]);
        }
    }
    println!("{table}");
    Ok(())
}

/// This program again as `nproc` ranks through `dist::launch`, without `--nproc`: rank
/// 0's output as it is (its JSON stays parseable), the others' prefixed, on stderr.
fn relaunch(nproc: usize) -> Result<()> {
    let exe = std::env::current_exe().context("finding this program to relaunch it")?;
    let mut args = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(a) = given.next() {
        if a == "--nproc" {
            given.next();
        } else if !a.starts_with("--nproc=") {
            args.push(a);
        }
    }
    labs_core::dist::launch_writing(nproc, &exe.to_string_lossy(), &args, |line| {
        use std::io::Write;
        match (line.rank, line.stream) {
            (0, labs_core::dist::OutputStream::Stdout) => {
                writeln!(std::io::stdout().lock(), "{}", line.text)
            }
            _ => writeln!(std::io::stderr().lock(), "{line}"),
        }
    })?;
    Ok(())
}

/// A launched rank's device: the one of the kind `--device` names (else `LABS_DEVICE`,
/// else a GPU if there is one) at `LOCAL_RANK`, as `torchrun`'s processes take
/// `cuda:LOCAL_RANK`; a simulated or dry-run one of `capacity`, when given, as the
/// in-process ranks have. No other device is opened (a GPU context on `cuda:0` in every
/// rank would cost rank 0's GPU memory).
fn launched_device(
    flag: &labs_core::cli::DeviceFlag,
    dry_run: bool,
    capacity: Option<Capacity>,
) -> Result<Device> {
    let local = labs_core::dist::DistEnv::from_env()?.local_rank;
    let named = flag
        .name
        .clone()
        .or_else(|| std::env::var("LABS_DEVICE").ok())
        .filter(|n| !n.trim().is_empty());
    let kind = match (dry_run, named) {
        (true, _) => DeviceId::Dry(0),
        (false, Some(name)) => name.parse::<DeviceId>()?,
        (false, None) => match labs_core::cuda::device_count() {
            Ok(n) if n > 0 => DeviceId::Cuda(0),
            _ => DeviceId::Sim(0),
        },
    };
    let id = match kind {
        DeviceId::Cuda(_) => DeviceId::Cuda(local),
        DeviceId::Sim(_) => DeviceId::Sim(local),
        DeviceId::Dry(_) => DeviceId::Dry(local),
        DeviceId::Cpu => bail!("a launched rank needs a GPU, simulated or real, not the cpu"),
    };
    match (id, capacity) {
        (DeviceId::Sim(_), Some(c)) => return Ok(Device::new_sim(c.bytes)),
        (DeviceId::Dry(_), Some(c)) => return Ok(Device::new_dry(c.bytes)),
        _ => {}
    }
    if !matches!(id, DeviceId::Cuda(_)) {
        let count = labs_core::device::device_count(id.kind())?;
        labs_core::device::set_sim_device_count(count.max(local + 1))?;
    }
    let device = Device::get(id).with_context(|| format!("opening {id} for rank {local}"))?;
    if let Some(c) = capacity.filter(|c| c.from_flag) {
        limit_gpu(&device, c.bytes)?;
    }
    Ok(device)
}

/// `--capacity` on a GPU: the allocator reserves at most that much, PyTorch's
/// `set_per_process_memory_fraction(capacity / total)`, so that a larger GPU runs out of
/// memory where a smaller one would (memory outside the allocator is not counted, as in
/// PyTorch).
fn limit_gpu(device: &Device, capacity: u64) -> Result<()> {
    let total = device.properties()?.total_memory;
    if capacity > total {
        bail!(
            "--capacity: {device} has {} in all, less than the {} asked for",
            labs_core::format::bytes(total),
            labs_core::format::bytes(capacity)
        );
    }
    let fraction = capacity as f64 / total as f64;
    device
        .allocator()?
        .set_memory_fraction(fraction)
        .context("--capacity")?;
    eprintln!(
        "note: --capacity on {device}: the allocator may reserve {} ({fraction:.4} of its {})",
        labs_core::format::bytes(capacity),
        labs_core::format::bytes(total)
    );
    Ok(())
}

/// The devices of `nproc` in-process ranks like `device` (simulated or dry-run):
/// indices 0 to nproc - 1, or fresh ones of the given capacity.
fn rank_devices(device: &Device, nproc: usize, capacity: Option<u64>) -> Result<Vec<Device>> {
    let dry = match device.id() {
        DeviceId::Sim(_) => false,
        DeviceId::Dry(_) => true,
        other => bail!(
            "--nproc on {other}: data-parallel ranks run on GPUs (processes) or on the \
             simulated or dry-run device (threads)"
        ),
    };
    if let Some(c) = capacity {
        return Ok((0..nproc)
            .map(|_| {
                if dry {
                    Device::new_dry(c)
                } else {
                    Device::new_sim(c)
                }
            })
            .collect());
    }
    if labs_core::device::device_count(device.id().kind())? < nproc {
        labs_core::device::set_sim_device_count(nproc)?;
    }
    (0..nproc)
        .map(|i| {
            let id = if dry {
                DeviceId::Dry(i)
            } else {
                DeviceId::Sim(i)
            };
            Device::get(id).context("opening a rank's device")
        })
        .collect()
}

/// The last step's memory by category, as an SVG picture in `path`.
fn draw_timeline(
    report: &labs_train::TrainReport,
    device: &Device,
    path: &std::path::Path,
) -> Result<()> {
    if report.timeline.is_empty() {
        bail!("--timeline: no step completed, so there is no timeline to draw");
    }
    let name = device.properties().map(|p| p.name).unwrap_or_default();
    let title = report.timeline_title(&name);
    let svg = labs_core::plot::category_area_svg(&report.timeline, &title)?;
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// A device size and where it came from: a GPU takes `--capacity` only, never
/// `LABS_SIM_CAPACITY` (the simulated devices' size, which a GPU run may inherit from
/// its environment).
#[derive(Clone, Copy)]
struct Capacity {
    bytes: u64,
    from_flag: bool,
}

/// `--capacity`, else `LABS_SIM_CAPACITY`: exact, and more than zero.
fn capacity(flag: Option<&str>) -> Result<Option<Capacity>> {
    let (name, text) = match (flag, std::env::var(ENV_SIM_CAPACITY).ok()) {
        (Some(c), _) => ("--capacity", c.to_string()),
        (None, Some(e)) => (ENV_SIM_CAPACITY, e),
        (None, None) => return Ok(None),
    };
    match parse_bytes(&text) {
        Ok(0) => bail!("{name}: the size must be more than 0 bytes"),
        Ok(n) => Ok(Some(Capacity {
            bytes: n,
            from_flag: flag.is_some(),
        })),
        Err(e) => bail!("{name}: {e}"),
    }
}

/// The device `--device` (or `--dry-run`) names; with a capacity, a fresh simulated or
/// dry-run device of that size instead of the shared one (a GPU's size is its own).
fn open(
    flag: &labs_core::cli::DeviceFlag,
    dry_run: bool,
    capacity: Option<Capacity>,
) -> Result<Device> {
    let mut flag = flag.clone();
    if dry_run {
        match flag.name.as_deref() {
            None | Some("dry") => flag.name = Some("dry".into()),
            Some(other) => bail!("--dry-run is --device dry: it cannot go with --device {other}"),
        }
    }
    let device = flag.open().context("choosing a device")?;
    Ok(match (device.id(), capacity) {
        (DeviceId::Sim(_), Some(c)) => Device::new_sim(c.bytes),
        (DeviceId::Dry(_), Some(c)) => Device::new_dry(c.bytes),
        (_, Some(c)) if c.from_flag => {
            limit_gpu(&device, c.bytes)?;
            device
        }
        _ => device,
    })
}

/// `--gemm-workspace`: the sim or dry device's workspace for its products, as a GPU's.
fn set_gemm_workspace(device: &Device, size: &str) -> Result<()> {
    let bytes = parse_bytes(size).map_err(|e| anyhow::anyhow!("--gemm-workspace: {e}"))?;
    match device.id() {
        DeviceId::Sim(_) | DeviceId::Dry(_) => device
            .set_gemm_workspace_bytes(bytes as usize)
            .context("--gemm-workspace"),
        other => bail!(
            "--gemm-workspace sets the sim and dry devices' workspace; {other}'s is its own \
             (cuBLAS's, PyTorch's size)"
        ),
    }
}

/// A progress bar on stderr, one tick per optimizer step; hidden unless `show`.
fn progress(steps: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("train [{bar:40}] {pos}/{len} steps {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}
