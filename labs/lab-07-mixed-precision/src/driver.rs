//! Experiment 6: tutorial 004's mixed-precision step on the training driver. The
//! tutorial trains `nn.Transformer(d_model=512, batch_first=True)` on a batch of 32
//! sequences of 100 with Adam and MSE against a random target, in float32 and under
//! autocast; here the same run goes through the training driver (`labs_train::run`) in
//! float32, bfloat16, and float16 with the gradient scaler, each with its peaks, the
//! allocated peak's split by category, its step time and skipped steps; then GPT-2
//! small (124 M parameters, batch 8 x 1024, AdamW) in float32 and bfloat16. With
//! `--pytorch`, PyTorch's own run of each configuration stands beside ours.
//!
//! On the simulated GPU, whose kernels run on the CPU, both models are scaled down
//! (the headings give the sizes): the memory's shape is the same, its size is not.

use anyhow::Result;
use labs_core::table::Table;
use labs_core::Device;
use labs_train::{AmpMode, ModelKind, OptimizerKind, TrainConfig, TrainReport};

use crate::mib;
use crate::pytorch::{PyTorchRun, Source};

/// One precision's run: ours, and PyTorch's when asked for.
#[derive(Debug, Clone)]
pub struct Row {
    pub amp: AmpMode,
    pub ours: TrainReport,
    pub pytorch: Option<PyTorchRun>,
}

/// The tutorial's Transformer step: full size on a GPU, scaled down on the simulator
/// or with `quick`.
pub fn transformer_config(device: &Device, quick: bool) -> TrainConfig {
    let mut c = TrainConfig::transformer();
    if device.is_cuda() && !quick {
        c.batch = 32;
        c.seq = 100;
        c.steps = 6;
    } else {
        c.d_model = 64;
        c.nhead = 4;
        c.layers = 1;
        c.ffn = 128;
        c.batch = 4;
        c.seq = 16;
        c.steps = 2;
    }
    c.optimizer = OptimizerKind::Adam;
    c
}

/// GPT-2 small at batch 8 x 1024 with AdamW on a GPU; a small GPT-2 on the simulator.
pub fn gpt2_config(device: &Device, quick: bool) -> TrainConfig {
    let mut c = TrainConfig::gpt2();
    c.optimizer = OptimizerKind::Adamw;
    if device.is_cuda() && !quick {
        c.batch = 8;
        c.seq = 1024;
        c.steps = 6;
    } else {
        c.d_model = 64;
        c.nhead = 4;
        c.layers = 2;
        c.ffn = 256;
        c.vocab = 512;
        c.batch = 2;
        c.seq = 32;
        c.steps = 2;
    }
    c
}

// ANCHOR: measure
/// `base` trained in each of `amps` through the driver on `device`. Our cache is
/// emptied before each run (the reserved peak is then the run's own) and before each
/// PyTorch run, so that PyTorch's allocator finds the GPU as free as ours did.
pub fn measure(
    device: &Device,
    base: &TrainConfig,
    amps: &[AmpMode],
    pytorch: Option<&Source>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &amp in amps {
        let config = TrainConfig {
            amp,
            ..base.clone()
        };
        device.allocator()?.empty_cache()?;
        let ours = labs_train::run(&config, device)?;
        device.allocator()?.empty_cache()?;
        let pytorch = match pytorch {
            Some(source) => source.run(&config)?,
            None => None,
        };
        rows.push(Row { amp, ours, pytorch });
    }
    Ok(rows)
}
// ANCHOR_END: measure

/// A model's sizes for a heading.
pub fn describe(c: &TrainConfig) -> String {
    match c.model {
        ModelKind::Transformer => format!(
            "nn.Transformer d_model {} ({} heads, {}+{} layers, ffn {}), batch {} x {}, Adam, \
             MSE",
            c.d_model, c.nhead, c.layers, c.layers, c.ffn, c.batch, c.seq
        ),
        ModelKind::Gpt2 => format!(
            "GPT-2 d_model {} ({} heads, {} blocks, vocabulary {}), batch {} x {}, AdamW",
            c.d_model, c.nhead, c.layers, c.vocab, c.batch, c.seq
        ),
    }
}

fn precision(amp: AmpMode) -> &'static str {
    match amp {
        AmpMode::None => "float32",
        AmpMode::Bf16 => "autocast bfloat16",
        AmpMode::F16 => "autocast float16 + GradScaler",
    }
}

fn category(r: &TrainReport, names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| r.by_category.get(*n).copied().unwrap_or(0))
        .sum()
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |ms| format!("{ms:.1}"))
}

/// The runs of one model as a table, `title` its heading: ours, each followed by
/// PyTorch's when there is one.
pub fn table(title: String, rows: &[Row]) -> Table {
    let mut t = Table::new(
        title,
        &[
            "run",
            "peak allocated",
            "peak reserved",
            "activations",
            "temporaries",
            "weights+grads+Adam (f32)",
            "autocast cache",
            "step (ms)",
            "skipped steps",
        ],
    );
    for r in rows {
        let o = &r.ours;
        t.row([
            format!("ours, {}", precision(r.amp)),
            mib(o.peak_allocated),
            mib(o.peak_reserved),
            mib(category(o, &["activation"])),
            mib(category(o, &["temporary"])),
            mib(category(o, &["parameter", "gradient", "optimizer_state"])),
            mib(category(o, &["autocast_cache"])),
            ms(o.step_ms),
            o.skipped_steps.map_or("-".to_string(), |n| n.to_string()),
        ]);
        if let Some(p) = &r.pytorch {
            t.row([
                format!("PyTorch, {}", precision(r.amp)),
                mib(p.peak_allocated),
                mib(p.peak_reserved),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                if p.oom.is_some() {
                    "out of memory".to_string()
                } else {
                    ms(p.step_ms)
                },
                p.skipped_steps.map_or("-".to_string(), |n| n.to_string()),
            ]);
        }
    }
    t
}

/// The experiment's two tables.
pub fn run(device: &Device, quick: bool, pytorch: Option<&Source>) -> Result<String> {
    let scaled = if device.is_cuda() && !quick {
        ""
    } else {
        " (scaled down: the simulated GPU runs its kernels on the CPU)"
    };
    let tc = transformer_config(device, quick);
    let rows = measure(
        device,
        &tc,
        &[AmpMode::None, AmpMode::Bf16, AmpMode::F16],
        pytorch,
    )?;
    let first = table(
        format!(
            "6a. Tutorial 004's step on the training driver on {device}: {}{scaled}; \
             memory in MiB, the peak's split by category, median step time",
            describe(&tc)
        ),
        &rows,
    );
    let gc = gpt2_config(device, quick);
    let name = if scaled.is_empty() {
        "GPT-2 small"
    } else {
        "A small GPT-2"
    };
    let rows = measure(device, &gc, &[AmpMode::None, AmpMode::Bf16], pytorch)?;
    let second = table(
        format!(
            "6b. {name} under bfloat16 on {device}: {}{scaled}; memory in MiB",
            describe(&gc)
        ),
        &rows,
    );
    Ok(format!("{first}\n{second}"))
}
