//! `demo`: the chapter's experiments on one device. memory_allocated and
//! memory_reserved through a training-like loop, memory_summary, a recorded history
//! turned into pictures and replayed under other settings, and a planted leak found by
//! the guard.

use std::path::{Path, PathBuf};

use anyhow::Context;
use labs_core::alloc::replay::read_trace;
use labs_core::alloc::{Allocator, Config, LeakGuard, LeakReport};
use labs_core::device::replay_on_sim;
use labs_core::format::bytes;
use labs_core::plot;
use labs_core::snapshot;
use labs_core::table::Table;
use labs_core::Device;
use serde_json::json;

use crate::training::{Model, Phase, Reading, Trainer};

/// Steps of the monitored loop.
const STEPS: usize = 3;
/// History entries kept: far more than the demo makes, so the exported trace is whole.
const HISTORY_ENTRIES: usize = 100_000;

pub struct Options {
    pub out: PathBuf,
    pub quick: bool,
}

/// What the demo measured, for `--json` and the tests.
pub struct Outcome {
    pub device: String,
    /// The allocator line of the header (`labs_core::cli::allocator_line`).
    pub allocator: String,
    pub readings: Vec<Reading>,
    pub after_drop: (u64, u64),
    pub after_empty_cache: (u64, u64),
    pub summary_text: String,
    pub recorded: Peaks,
    pub replays: Vec<(String, Peaks)>,
    pub pictures: Vec<PathBuf>,
    pub snapshot_file: PathBuf,
    pub mid_step_file: PathBuf,
    pub trace_file: PathBuf,
    pub leak_reports: Vec<LeakReport>,
    pub fixed_report: LeakReport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peaks {
    pub requested: u64,
    pub allocated: u64,
    pub reserved: u64,
}

pub fn run(device: &Device, opts: &Options) -> anyhow::Result<Outcome> {
    let model = if opts.quick {
        Model::QUICK
    } else {
        Model::DEMO
    };
    let allocator = device
        .allocator()
        .context("the device has no caching allocator")?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;

    // ANCHOR: monitored_loop
    // A fresh start: nothing cached, peaks from now on, and the history recorded.
    allocator.empty_cache()?;
    allocator.reset_peak_memory_stats();
    allocator.record_memory_history(HISTORY_ENTRIES, true);
    let mut readings = Vec::new();
    let mut trainer = Trainer::new(model, device)?;
    readings.push(trainer.reading(allocator, Phase::Weights));
    let mut mid_step = None;
    for step in 1..=STEPS {
        let loss = trainer.step(|t, phase| {
            readings.push(t.reading(allocator, phase));
            // The state at the busiest moment, for the segment map.
            if step == STEPS && phase == Phase::Backward {
                mid_step = Some(allocator.snapshot());
            }
        })?;
        drop(loss);
    }
    drop(trainer);
    let after_drop = (allocator.memory_allocated(), allocator.memory_reserved());
    // ANCHOR_END: monitored_loop
    let summary_text = allocator.memory_summary();
    let stats = allocator.stats();
    let recorded = Peaks {
        requested: stats.requested.peak,
        allocated: stats.allocated.peak,
        reserved: stats.reserved.peak,
    };

    // The history: a snapshot file, its pictures, its trace, replayed.
    let snapshot_file = opts.out.join("demo-snapshot.json");
    allocator.dump_snapshot(&snapshot_file)?;
    allocator.record_memory_history(0, false);
    let (snap, _) = snapshot::load_file(&snapshot_file)?;
    let gpu = snap.pick_device(None)?;
    let pictures = plot::write_all(&snap, gpu, &opts.out)?;
    // The segment map of the end state would show only cached memory: draw the last
    // step's backward pass instead, and keep that snapshot beside the final one.
    let mid_step = mid_step.context("the loop ran no step")?;
    let mid_file = opts.out.join("demo-snapshot-mid-step.json");
    snapshot::dump_to_file(&mid_step, &mid_file)?;
    let segments_file = opts.out.join("segments.svg");
    std::fs::write(&segments_file, plot::segments_svg(&mid_step, gpu)?)
        .with_context(|| format!("writing {}", segments_file.display()))?;
    let trace_file = opts.out.join("demo.trace.csv.gz");
    snapshot::export_trace(&snap, gpu, &trace_file)?;
    let trace = read_trace(&trace_file)?;
    let mut replays = Vec::new();
    let ours = allocator.config().to_conf_string();
    let others = ["expandable_segments:True", "expandable_segments:False"];
    for conf in std::iter::once(ours.as_str()).chain(others.into_iter().filter(|c| *c != ours)) {
        let name = if conf == ours {
            format!("{conf} (as recorded)")
        } else {
            conf.to_string()
        };
        let r = replay_on_sim(&trace, Config::parse(conf)?, 1 << 40)?;
        replays.push((
            name,
            Peaks {
                requested: r.peak_requested,
                allocated: r.peak_allocated,
                reserved: r.peak_reserved,
            },
        ));
    }

    allocator.empty_cache()?;
    let after_empty_cache = (allocator.memory_allocated(), allocator.memory_reserved());

    let (leak_reports, fixed_report) = planted_leak(device, allocator, model)?;

    Ok(Outcome {
        device: device.id().to_string(),
        allocator: labs_core::cli::allocator_line(device)?,
        readings,
        after_drop,
        after_empty_cache,
        summary_text,
        recorded,
        replays,
        pictures,
        snapshot_file,
        mid_step_file: mid_file,
        trace_file,
        leak_reports,
        fixed_report,
    })
}

// ANCHOR: planted_leak
/// The loop again, keeping every step's loss in a list (the classic leak), watched by
/// the guard from the second step on; then the fix, keeping a host copy instead.
fn planted_leak(
    device: &Device,
    allocator: &Allocator,
    model: Model,
) -> anyhow::Result<(Vec<LeakReport>, LeakReport)> {
    allocator.record_memory_history(HISTORY_ENTRIES, true);
    let mut trainer = Trainer::new(model, device)?;
    // The first step makes the optimizer's moments: state, not a leak.
    drop(trainer.step(|_, _| {})?);
    let mut losses = Vec::new();
    let mut guard = LeakGuard::new(allocator);
    let mut reports = Vec::new();
    for _ in 0..3 {
        let loss = trainer.step(|_, _| {})?;
        losses.push(loss); // the leak: the tensor stays alive on the device
        reports.push(guard.end_iteration());
    }
    drop(losses);
    let mut history = Vec::new();
    let mut guard = LeakGuard::new(allocator);
    let loss = trainer.step(|_, _| {})?;
    history.push(loss.to_vec::<f32>()?); // the fix: keep the values, on the host
    drop(loss);
    let fixed = guard.end_iteration();
    allocator.record_memory_history(0, false);
    Ok((reports, fixed))
}
// ANCHOR_END: planted_leak

pub fn print(o: &Outcome) {
    println!("Lab 3 demo on {}\n{}\n", o.device, o.allocator);
    let mut t = Table::new(
        "memory_allocated and memory_reserved through a training-like loop",
        &["step", "phase", "allocated", "reserved", "max allocated"],
    );
    for r in &o.readings {
        t.row([
            r.step.to_string(),
            r.phase.name().to_string(),
            bytes(r.allocated),
            bytes(r.reserved),
            bytes(r.peak_allocated),
        ]);
    }
    for (phase, (allocated, reserved)) in [
        ("everything dropped", o.after_drop),
        ("after empty_cache", o.after_empty_cache),
    ] {
        t.row([
            String::new(),
            phase.to_string(),
            bytes(allocated),
            bytes(reserved),
            String::new(),
        ]);
    }
    println!("{t}");
    println!("memory_summary() after the loop:\n{}", o.summary_text);

    let mut t = Table::new(
        "The recorded history replayed on the simulated GPU under other settings",
        &[
            "allocator",
            "peak requested",
            "peak allocated",
            "peak reserved",
        ],
    );
    let row = |t: &mut Table, name: &str, p: &Peaks| {
        t.row([
            name.to_string(),
            bytes(p.requested),
            bytes(p.allocated),
            bytes(p.reserved),
        ]);
    };
    row(&mut t, &format!("this run on {}", o.device), &o.recorded);
    for (name, p) in &o.replays {
        row(&mut t, &format!("replay, {name}"), p);
    }
    println!("{t}");
    println!("wrote {}", display(&o.snapshot_file));
    println!(
        "wrote {} (during step {STEPS}'s backward pass)",
        display(&o.mid_step_file)
    );
    println!("wrote {}", display(&o.trace_file));
    for p in &o.pictures {
        println!("wrote {}", display(p));
    }
    println!();
    println!("A planted leak: each step's loss kept in a list");
    for (i, r) in o.leak_reports.iter().enumerate() {
        println!("after step {}: {r}", i + 2);
    }
    println!(
        "The fix, keeping the values on the host: {}",
        o.fixed_report
    );
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

pub fn json(o: &Outcome) -> serde_json::Value {
    let peaks = |p: &Peaks| json!({"peak_requested": p.requested, "peak_allocated": p.allocated, "peak_reserved": p.reserved});
    json!({
        "device": o.device,
        "readings": o.readings.iter().map(|r| json!({
            "step": r.step, "phase": r.phase.name(), "allocated": r.allocated,
            "reserved": r.reserved, "max_allocated": r.peak_allocated,
        })).collect::<Vec<_>>(),
        "after_drop": {"allocated": o.after_drop.0, "reserved": o.after_drop.1},
        "after_empty_cache": {"allocated": o.after_empty_cache.0, "reserved": o.after_empty_cache.1},
        "recorded": peaks(&o.recorded),
        "replays": o.replays.iter().map(|(n, p)| {
            let mut v = peaks(p);
            v["conf"] = json!(n);
            v
        }).collect::<Vec<_>>(),
        "snapshot": o.snapshot_file, "mid_step_snapshot": o.mid_step_file, "trace": o.trace_file, "pictures": o.pictures,
        "leak_blocks_per_step": o.leak_reports.iter().map(|r| r.blocks.len()).collect::<Vec<_>>(),
        "leak_bytes_per_step": o.leak_reports.iter().map(|r| r.bytes()).collect::<Vec<_>>(),
        "leak_report": o.leak_reports.first().map(|r| r.to_string()),
        "fixed_leak_blocks": o.fixed_report.blocks.len(),
    })
}
