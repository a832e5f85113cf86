//! Experiment 4: does mixed precision train as well? The same model, initial weights
//! and batches trained in float32, autocast bfloat16 and autocast float16 with a
//! scaler; the loss every `every` steps, and each half-precision curve's largest gap to
//! float32's over the last tenth of the run, which must stay within [`TOLERANCE`].

use labs_core::table::Table;
use labs_core::{Device, Result};

use crate::model::{batch, Precision, Sizes, Trainer};

/// The largest relative gap allowed between a half-precision curve's mean loss over
/// the last tenth of the run and float32's.
pub const TOLERANCE: f64 = 0.05;

/// The curves' model: smaller than table 1's, so that hundreds of steps take seconds.
pub fn sizes(device: &Device, quick: bool) -> Sizes {
    if device.is_cuda() && !quick {
        Sizes {
            batch: 256,
            width: 1024,
            hidden_layers: 2,
            classes: 16,
        }
    } else {
        Sizes {
            batch: 32,
            width: 64,
            hidden_layers: 2,
            classes: 16,
        }
    }
}

/// Number of distinct batches, cycled.
const BATCHES: usize = 8;

// ANCHOR: curves
/// The loss of every step for each precision.
pub fn measure(device: &Device, s: Sizes, steps: usize) -> Result<Vec<(Precision, Vec<f32>)>> {
    let data = (0..BATCHES)
        .map(|i| batch(device, s, i))
        .collect::<Result<Vec<_>>>()?;
    Precision::ALL
        .iter()
        .map(|&p| {
            let mut t = Trainer::new(device, s, p, 1)?;
            let losses = (0..steps)
                .map(|i| {
                    let (x, y) = &data[i % BATCHES];
                    t.step(x, y)
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((p, losses))
        })
        .collect()
}
// ANCHOR_END: curves

/// The mean over the last tenth of a curve (at least one step).
pub fn tail_mean(losses: &[f32]) -> f64 {
    let n = (losses.len() / 10).max(1);
    let tail = &losses[losses.len() - n..];
    tail.iter().map(|&l| l as f64).sum::<f64>() / n as f64
}

/// Each curve's tail mean relative to float32's (the first curve).
pub fn gaps(curves: &[(Precision, Vec<f32>)]) -> Vec<f64> {
    let base = tail_mean(&curves[0].1);
    curves
        .iter()
        .map(|(_, l)| (tail_mean(l) - base).abs() / base)
        .collect()
}

pub fn table(device: &Device, s: Sizes, curves: &[(Precision, Vec<f32>)], every: usize) -> Table {
    let mut headers = vec!["step"];
    headers.extend(curves.iter().map(|(p, _)| p.name()));
    let mut t = Table::new(
        format!(
            "4. Loss curves on {device}: an MLP {} wide ({} hidden layers), batch {}, Adam \
             lr 1e-3, the same {BATCHES} batches cycled, in three precisions",
            s.width, s.hidden_layers, s.batch
        ),
        &headers,
    );
    let steps = curves.first().map_or(0, |c| c.1.len());
    for i in (0..steps).filter(|i| i % every == 0 || i + 1 == steps) {
        let mut cells = vec![(i + 1).to_string()];
        cells.extend(curves.iter().map(|(_, l)| format!("{:.4}", l[i])));
        t.row(cells);
    }
    let mut tail = vec!["mean of the last tenth".to_string()];
    tail.extend(curves.iter().map(|(_, l)| format!("{:.4}", tail_mean(l))));
    t.row(tail);
    let mut gap = vec![format!(
        "gap to float32 (tolerance {:.0}%)",
        TOLERANCE * 100.0
    )];
    gap.extend(gaps(curves).iter().map(|g| format!("{:.2}%", g * 100.0)));
    t.row(gap);
    t
}
