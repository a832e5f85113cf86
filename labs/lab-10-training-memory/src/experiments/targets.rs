//! The chapter's targets against PyTorch (`--check`): peak allocated within ±5 % of
//! PyTorch's and never above it on the fused-attention path; step time at most
//! PyTorch's on the tutorial's model and at most 1.15 times it on GPT-2.

use super::configs::Family;
use super::pytorch::PyTorchRun;
use super::runs::Measurement;
use super::tables::mib;

/// How far our peak allocated may be from PyTorch's.
pub const ALLOCATED_TOLERANCE: f64 = 0.05;
/// Our step time over PyTorch's, at most: on the tutorial's model, and on GPT-2.
pub const TUTORIAL_STEP_RATIO: f64 = 1.0;
pub const GPT2_STEP_RATIO: f64 = 1.15;

/// The targets `m` misses, one line each; empty when PyTorch was not measured (nothing
/// to compare) or neither side fits.
pub fn missed(m: &Measurement) -> Vec<String> {
    let name = &m.configuration.name;
    let theirs = match &m.pytorch {
        None => return Vec::new(),
        Some(PyTorchRun::Measured(f)) => f,
        Some(PyTorchRun::Failed { cell, .. }) => {
            // PyTorch could not run it: a miss only when its failure is not one of
            // memory that ours shares.
            return match (cell.as_str(), m.ours_done()) {
                ("OOM", _) => Vec::new(),
                _ => vec![format!("{name}: PyTorch's run gave no figures ({cell})")],
            };
        }
    };
    let Some(ours) = m.ours_done() else {
        return vec![format!(
            "{name}: ours did not run to the end where PyTorch did ({} MiB)",
            mib(theirs.peak_allocated)
        )];
    };
    let mut out = Vec::new();
    let (o, t) = (ours.peak_allocated as f64, theirs.peak_allocated as f64);
    let off = o / t.max(1.0) - 1.0;
    if off.abs() > ALLOCATED_TOLERANCE {
        out.push(format!(
            "{name}: peak allocated {} MiB is {:+.1}% of PyTorch's {} MiB (target within \
             ±{:.0}%)",
            mib(ours.peak_allocated),
            100.0 * off,
            mib(theirs.peak_allocated),
            100.0 * ALLOCATED_TOLERANCE
        ));
    }
    if m.configuration.fused() && o > t {
        out.push(format!(
            "{name}: peak allocated {} MiB is above PyTorch's {} MiB on the fused path",
            mib(ours.peak_allocated),
            mib(theirs.peak_allocated)
        ));
    }
    let limit = match m.configuration.family {
        Family::Tutorial => TUTORIAL_STEP_RATIO,
        Family::Gpt2 => GPT2_STEP_RATIO,
    };
    match (ours.step_ms, theirs.step_ms) {
        (Some(o), Some(t)) if o > limit * t => out.push(format!(
            "{name}: step {o:.2} ms is {:.2}x PyTorch's {t:.2} ms (target at most {limit:.2}x)",
            o / t
        )),
        (Some(_), Some(_)) => {}
        _ => out.push(format!("{name}: no step time to compare")),
    }
    out
}

/// `--check`'s report: "targets: all met", or the list of misses.
pub fn report(rows: &[Measurement]) -> (String, bool) {
    let misses: Vec<String> = rows.iter().flat_map(missed).collect();
    if misses.is_empty() {
        return ("targets: all met\n".to_string(), true);
    }
    let mut out = format!("targets: {} missed\n", misses.len());
    for m in misses {
        out.push_str(&format!("- {m}\n"));
    }
    (out, false)
}
