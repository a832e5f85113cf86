//! `lab-10` without a subcommand: chapter 10's experiments as tables, each section
//! under a heading the book's output splitter matches (`1. Tutorial 004's experiment`,
//! `2. Techniques on the tutorial's model`, `3. GPT-2 small`, `4. Where the memory
//! goes`, `5. Predicted before running`).
//!
//! - [`classifier`]: `lab-10 classifier`, the classifier as written and fused, by dry run;
//! - [`configs`]: the configurations compared (the one list, also `lab-10 configs`);
//! - [`runs`]: one configuration predicted, run, and run by PyTorch;
//! - [`pytorch`]: PyTorch's figures, from `ci/pytorch-train.py` or train-compare's lines;
//! - [`tables`]: the sections' tables;
//! - [`targets`]: the chapter's targets against PyTorch (`--check`).

pub mod classifier;
pub mod configs;
pub mod pytorch;
pub mod runs;
pub mod tables;
pub mod targets;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use labs_core::Device;

use configs::{configurations, tutorial_shapes, Family, Scale};
use pytorch::PyTorchSource;
use runs::{Measurement, Runner};

/// What to run and what to add.
#[derive(Default)]
pub struct Options {
    /// Smaller models (a scaled-down GPT-2 on a GPU; tiny models on the simulated one).
    pub quick: bool,
    /// PyTorch's figures beside ours.
    pub pytorch: Option<PyTorchSource>,
    /// Write one picture per tutorial run here (`<model>-<technique>.svg`).
    pub pictures: Option<PathBuf>,
    /// Check the chapter's targets against PyTorch's figures.
    pub check: bool,
    /// Write every run (ours, its dry run, and PyTorch's when run) here, as
    /// train-compare's JSON lines.
    pub out: Option<PathBuf>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// What the run concluded: with `--check`, whether every target was met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub targets_met: Option<bool>,
}

/// Runs the experiments on `device`, writing the sections to `w` as they complete.
pub fn run(device: &Device, o: &Options, w: &mut dyn Write) -> Result<Outcome> {
    let scale = Scale::for_device(device, o.quick);
    let props = device.properties()?;
    let runs_pytorch = o.pytorch.as_ref().is_some_and(PyTorchSource::runs_pytorch);
    if o.check && o.pytorch.is_none() {
        bail!("--check compares with PyTorch: give --pytorch ci/pytorch-train.py or a .jsonl");
    }
    if o.check && runs_pytorch && !device.is_cuda() {
        bail!("--check with --pytorch *.py needs the GPU: PyTorch is not run on {device}");
    }
    writeln!(w, "Device {device}: {}", props.name)?;
    writeln!(w, "{}", labs_core::cli::allocator_line(device)?)?;
    if !device.is_cuda() {
        writeln!(
            w,
            "(no GPU in use: the simulated GPU, whose allocator is the same code; its kernels \
             run on the CPU, so its times mean nothing, and PyTorch is not run here; the \
             models are scaled down to run in seconds)"
        )?;
    }
    if let Some(PyTorchSource::Lines { path, .. }) = &o.pytorch {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        writeln!(
            w,
            "(PyTorch's figures are read from {name}, not measured in this run)"
        )?;
    }
    writeln!(w)?;
    let with_pytorch = o.pytorch.is_some() && (device.is_cuda() || !runs_pytorch);
    let all = configurations(scale);
    let shapes = tutorial_shapes(scale);
    let out = match &o.out {
        Some(p) => {
            let f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            Some((p.clone(), f))
        }
        None => None,
    };
    let mut runner = Runner {
        device,
        capacity: props.total_memory,
        pytorch: o.pytorch.as_ref().filter(|_| with_pytorch),
        pictures: o.pictures.is_some(),
        out,
        bar: progress(all.len() + shapes.len(), o.progress),
    };
    let mut tutorial = Vec::new();
    let mut gpt2 = Vec::new();
    for c in &all {
        if c.family == Family::Tutorial {
            tutorial.push(runner.measure(c, true)?);
        }
    }
    let extra: Vec<Measurement> = (shapes.iter())
        .map(|c| runner.measure(c, false))
        .collect::<Result<_>>()?;
    let name = device.to_string();
    runner.bar.suspend(|| -> Result<()> {
        let [one, accum, ..] = &tutorial[..] else {
            bail!("the tutorial's configurations begin with none and accumulation")
        };
        let section1 = [one, accum, &extra[0], &extra[1]];
        writeln!(w, "{}", tables::tutorial(&name, &section1, with_pytorch))?;
        let c = &tutorial[0].config;
        let title = format!(
            "2. Techniques on the tutorial's model on {name}: nn.Transformer(d_model={}), Adam, \
             batch {} x {}; saving: peak allocated against none",
            c.d_model, c.batch, c.seq
        );
        writeln!(w, "{}", tables::techniques(title, &tutorial, with_pytorch))?;
        Ok(())
    })?;
    for c in &all {
        if c.family == Family::Gpt2 {
            gpt2.push(runner.measure(c, true)?);
        }
    }
    runner.bar.finish_and_clear();
    let title = tables::gpt2_title(&name, scale);
    writeln!(w, "{}", tables::techniques(title, &gpt2, with_pytorch))?;
    writeln!(w, "{}", tables::categories(&name, &tutorial))?;
    if let Some(dir) = &o.pictures {
        draw(device, dir, &tutorial, w)?;
        writeln!(w)?;
    }
    let both: Vec<Measurement> = tutorial.iter().chain(&gpt2).cloned().collect();
    writeln!(w, "{}", tables::predicted(&name, props.total_memory, &both))?;
    if let Some(t) = tables::offload_overlap(&name, &[&tutorial, &gpt2]) {
        writeln!(w, "{t}")?;
    }
    let mut outcome = Outcome { targets_met: None };
    if o.check {
        let (text, met) = targets::report(&both);
        write!(w, "{text}")?;
        outcome.targets_met = Some(met);
    }
    Ok(outcome)
}

/// One stacked-area picture per run that recorded its last step, all on one memory
/// axis (the largest peak of them) so that they compare at a glance.
fn draw(
    device: &Device,
    dir: &std::path::Path,
    rows: &[Measurement],
    w: &mut dyn Write,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = device.properties()?.name;
    let drawn = || {
        (rows.iter()).filter_map(|m| {
            let report = m.ours_done().filter(|r| !r.timeline.is_empty())?;
            Some((m, report))
        })
    };
    let axis = (drawn())
        .map(|(_, r)| labs_core::plot::category_peak(&r.timeline))
        .max()
        .unwrap_or(0);
    for (m, report) in drawn() {
        let title = report.timeline_title(&name);
        let svg = labs_core::plot::category_area_svg_to(&report.timeline, &title, axis)?;
        let path = dir.join(format!("{}.svg", m.configuration.name));
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        writeln!(w, "wrote {}", path.display())?;
    }
    Ok(())
}

/// A progress bar on stderr, one tick per configuration; hidden unless `show`.
fn progress(n: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("experiments [{bar:40}] {pos}/{len} {msg} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}
