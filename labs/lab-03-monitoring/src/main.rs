//! `cargo run --release -p lab-03 -- COMMAND`: lab 3's views of memory. Snapshots may
//! be ours (JSON) or PyTorch's (`torch.cuda.memory._dump_snapshot` pickles); the
//! format is told from the content.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use labs_core::cli::{check_outputs, PathArg, Written};
use labs_core::snapshot::{self, Snapshot, SourceFormat, Summary};
use labs_core::{compare, plot};

use lab_03::{demo, report, view};

#[derive(Parser)]
#[command(about = "Lab 3: memory monitoring: snapshot summaries, pictures, trace export")]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// The largest snapshot file read (default: LABS_MAX_SNAPSHOT_SIZE, else 1GiB).
    #[arg(long, global = true, value_name = "SIZE")]
    max_snapshot_size: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Totals of a snapshot, and its segments.
    Summary {
        /// A snapshot: our JSON, or a PyTorch pickle.
        file: PathBuf,
        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Two snapshots of the same configuration side by side (ours and PyTorch's, or a
    /// dry run and the GPU's; either format): totals, the blocks live at each one's
    /// allocated peak grouped by size, and the first segment event where the two
    /// allocators decide differently for the same allocation sequence.
    Compare {
        /// The first snapshot (A).
        a: PathBuf,
        /// The second snapshot (B); differences are B - A.
        b: PathBuf,
        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// Which device's trace to compare, for snapshots of several GPUs.
        #[arg(long)]
        gpu: Option<i64>,
        /// Sizes shown in the table of blocks at the peak (the JSON has them all).
        #[arg(long, default_value_t = 25)]
        rows: usize,
        /// Events shown either side of the first different segment event.
        #[arg(long, default_value_t = 8)]
        context: usize,
    },
    /// Draws a snapshot as SVG files: timeline, active memory bands, segment map.
    Plot {
        file: PathBuf,
        /// Directory to write the pictures into (created if needed).
        #[arg(short, long)]
        out: PathBuf,
        /// Which device's memory to draw, for snapshots of several GPUs.
        #[arg(long)]
        gpu: Option<i64>,
    },
    /// Writes one self-contained HTML page (no network: inline CSS, JavaScript and the
    /// data) to explore a snapshot's trace in a browser: the active-memory timeline,
    /// stacked by category where the snapshot records categories; zoom (wheel, +/-) and
    /// pan (drag, slider); the allocations live at the hovered or clicked moment,
    /// largest first, with their category and the first frame of their stack; markers
    /// for out-of-memory events and segments freed (empty_cache, OOM retries). Long
    /// traces are thinned into levels of detail that keep every peak.
    View {
        /// A snapshot: our JSON, or a PyTorch pickle.
        file: PathBuf,
        /// The page to write (NAME.html); its folder must exist.
        #[arg(short, long)]
        out: PathBuf,
        /// Which device's trace to show, for snapshots of several GPUs.
        #[arg(long)]
        gpu: Option<i64>,
    },
    /// Writes a snapshot's trace as gzip'd CSV (action,addr,size,stream) for replay.
    ExportTrace {
        file: PathBuf,
        /// The output file (conventionally NAME.trace.csv.gz).
        #[arg(short, long)]
        out: PathBuf,
        /// Which device's trace to export, for snapshots of several GPUs.
        #[arg(long)]
        gpu: Option<i64>,
    },
    /// The chapter's experiments: allocated vs reserved through a training-like loop,
    /// memory_summary, a recorded history drawn and replayed, a planted leak.
    Demo {
        #[command(flatten)]
        device: labs_core::cli::DeviceFlag,
        /// Directory for the snapshot, its trace and its pictures (created if needed).
        #[arg(short, long, default_value = "lab-03-demo")]
        out: PathBuf,
        /// A smaller model, for a quick look.
        #[arg(long)]
        quick: bool,
        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,
    },
}

/// `--max-snapshot-size`, once parsed; unset, the reader's default applies.
static MAX_SNAPSHOT_SIZE: OnceLock<u64> = OnceLock::new();

fn load(file: &Path) -> anyhow::Result<(Snapshot, SourceFormat)> {
    match MAX_SNAPSHOT_SIZE.get() {
        Some(&max) => snapshot::load_file_limited(file, max),
        None => snapshot::load_file(file),
    }
    .context("reading a snapshot")
}

fn main() -> std::process::ExitCode {
    labs_core::cli::quiet_broken_pipe();
    labs_core::cli::exit(run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    if let Some(text) = &args.max_snapshot_size {
        let max = match labs_core::format::parse_bytes(text) {
            Ok(0) => bail!("--max-snapshot-size: the size must be more than 0 bytes"),
            Ok(n) => n,
            Err(e) => bail!("--max-snapshot-size: {e}"),
        };
        let _ = MAX_SNAPSHOT_SIZE.set(max);
    }
    match args.command {
        Command::Summary { file, json } => {
            let (snap, format) = load(&file)?;
            let summary = Summary::of(&snap);
            if json {
                println!("{}", report::json(&summary, format));
            } else {
                for t in report::tables(&snap, &summary) {
                    println!("{t}");
                }
            }
        }
        Command::Compare {
            a,
            b,
            json,
            gpu,
            rows,
            context,
        } => {
            let (sa, _) = load(&a)?;
            let (sb, _) = load(&b)?;
            let side = |path: &Path, snapshot| -> anyhow::Result<compare::Side> {
                let device = snapshot_device(snapshot, gpu)
                    .with_context(|| format!("choosing the device of {}", path.display()))?;
                if snapshot.trace.is_empty() {
                    bail!(
                        "{} has no trace to compare (was the history recorded?)",
                        path.display()
                    );
                }
                Ok(compare::Side {
                    name: file_name(path),
                    snapshot,
                    device,
                })
            };
            let c = compare::compare(&side(&a, &sa)?, &side(&b, &sb)?, context);
            if json {
                println!("{}", compare::tables::json(&c));
            } else {
                for t in compare::tables::tables(&c, rows) {
                    println!("{t}");
                }
            }
        }
        Command::Plot { file, out, gpu } => {
            check_outputs(
                &[(PathArg::new("--out", &out), Written::Folder)],
                &[PathArg::new("FILE", &file)],
            )?;
            let (snap, _) = load(&file)?;
            let device = snap.pick_device(gpu)?;
            for path in plot::write_all(&snap, device, &out)? {
                println!("wrote {}", path.display());
            }
        }
        Command::View { file, out, gpu } => {
            check_outputs(
                &[(PathArg::new("--out", &out), Written::File)],
                &[PathArg::new("FILE", &file)],
            )?;
            let (snap, _) = load(&file)?;
            let (html, digest) = view::page_of(&snap, &file_name(&file), gpu)?;
            let device = digest.device;
            std::fs::write(&out, &html).with_context(|| format!("writing {}", out.display()))?;
            println!(
                "wrote {} ({}, {} events of device {device})",
                out.display(),
                labs_core::format::bytes(html.len() as u64),
                digest.points - 1
            );
        }
        Command::ExportTrace { file, out, gpu } => {
            // Before reading: the output never replaces the snapshot it is made from.
            check_outputs(
                &[(PathArg::new("--out", &out), Written::File)],
                &[PathArg::new("FILE", &file)],
            )?;
            let (snap, _) = load(&file)?;
            let device = snap.pick_device(gpu)?;
            if snap.trace.is_empty() {
                bail!(
                    "{} has no trace to export (was the history recorded?)",
                    file.display()
                );
            }
            let n = snapshot::export_trace(&snap, device, &out)?;
            println!("wrote {n} events of device {device} to {}", out.display());
        }
        Command::Demo {
            device,
            out,
            quick,
            json,
        } => {
            check_outputs(&[(PathArg::new("--out", &out), Written::Folder)], &[])?;
            let device = device.open().context("choosing a device")?;
            let outcome = demo::run(&device, &demo::Options { out, quick })?;
            if json {
                println!("{}", demo::json(&outcome));
            } else {
                demo::print(&outcome);
            }
        }
    }
    Ok(())
}

fn snapshot_device(snapshot: &Snapshot, gpu: Option<i64>) -> anyhow::Result<i64> {
    Ok(snapshot.pick_device(gpu)?)
}

/// A file's name without its folders, as the comparison's column headings show it.
fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
