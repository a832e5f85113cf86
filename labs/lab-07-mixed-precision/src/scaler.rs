//! Experiment 3: why float16 needs a gradient scaler. (a) The gradients of one
//! backward pass under autocast to float16, with the loss multiplied by ever smaller
//! factors (a loss averaged over many more tokens, or weighted down, has gradients this
//! small): how many weight-gradient elements that are non-zero in float32 come out as
//! exactly zero, without a scaler and with one. (b) A forced overflow: one step whose
//! loss is multiplied by 10^10, its scaled gradients infinite; the scaler skips that
//! step and halves the scale.

use labs_core::nn::Module;
use labs_core::optim::{GradScaler, Optimizer};
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

use crate::model::{batch, Precision, Sizes, Trainer};

/// Counts over every weight gradient of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Underflow {
    /// The loss is multiplied by `2^-shift`.
    pub shift: u32,
    /// Gradient elements that are not zero in the float32 pass.
    pub nonzero_f32: usize,
    /// Of those, the ones that are zero under float16 autocast without a scaler.
    pub zero_unscaled: usize,
    /// The same with a `GradScaler` (scale 2^16), read after `unscale_`.
    pub zero_scaled: usize,
}

fn gradients(t: &Trainer) -> Result<Vec<Vec<f32>>> {
    t.opt
        .params()
        .iter()
        .map(|p| {
            p.grad()
                .expect("every parameter has a gradient")
                .to_vec::<f32>()
        })
        .collect()
}

/// The gradients of `factor * loss` for one batch; with `scaler`, backpropagated
/// through `scaler.scale` and unscaled.
fn backward(
    t: &mut Trainer,
    x: &Tensor,
    y: &Tensor,
    factor: f64,
    scaler: Option<&mut GradScaler>,
) -> Result<Vec<Vec<f32>>> {
    t.opt.zero_grad(true)?;
    let loss = t.loss(x, y)?.mul_scalar(factor)?;
    match scaler {
        Some(s) => {
            s.scale(&loss)?.backward()?;
            s.unscale_(&t.opt)?;
        }
        None => loss.backward()?,
    }
    gradients(t)
}

// ANCHOR: underflow
pub fn underflow(device: &Device, s: Sizes, shifts: &[u32]) -> Result<Vec<Underflow>> {
    let (x, y) = batch(device, s, 0)?;
    let mut f32_model = Trainer::new(device, s, Precision::F32, 1)?;
    let mut f16_model = Trainer::new(device, s, Precision::F16, 1)?;
    shifts
        .iter()
        .map(|&shift| {
            let factor = 0.5f64.powi(shift as i32);
            let reference = backward(&mut f32_model, &x, &y, factor, None)?;
            let unscaled = backward(&mut f16_model, &x, &y, factor, None)?;
            let mut scaler = GradScaler::new();
            let scaled = backward(&mut f16_model, &x, &y, factor, Some(&mut scaler))?;
            let (mut nonzero, mut zero_unscaled, mut zero_scaled) = (0, 0, 0);
            for ((r, u), sc) in reference.iter().zip(&unscaled).zip(&scaled) {
                for i in 0..r.len() {
                    if r[i] != 0.0 {
                        nonzero += 1;
                        zero_unscaled += (u[i] == 0.0) as usize;
                        zero_scaled += (sc[i] == 0.0) as usize;
                    }
                }
            }
            Ok(Underflow {
                shift,
                nonzero_f32: nonzero,
                zero_unscaled,
                zero_scaled,
            })
        })
        .collect()
}
// ANCHOR_END: underflow

pub fn underflow_table(device: &Device, s: Sizes, rows: &[Underflow]) -> Table {
    let _ = s;
    let mut t = Table::new(
        format!(
            "3a. Float16 gradients that underflow to zero on {device}: weight-gradient \
             elements non-zero in float32 but zero under autocast float16, without and with \
             a GradScaler (scale 65536)"
        ),
        &[
            "loss multiplied by",
            "non-zero in float32",
            "zero in float16, no scaler",
            "%",
            "zero in float16, scaler",
        ],
    );
    for r in rows {
        t.row([
            format!("2^-{}", r.shift),
            r.nonzero_f32.to_string(),
            r.zero_unscaled.to_string(),
            format!(
                "{:.1}",
                100.0 * r.zero_unscaled as f64 / r.nonzero_f32.max(1) as f64
            ),
            r.zero_scaled.to_string(),
        ]);
    }
    t
}

/// One step of the overflow run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalerStep {
    pub step: usize,
    pub loss_factor: f64,
    pub scale_before: f32,
    pub stepped: bool,
    pub scale_after: f32,
    /// Whether the parameters changed.
    pub params_changed: bool,
}

// ANCHOR: overflow
/// `steps` steps of float16 training with a scaler; step `huge_at` multiplies its loss
/// by 10^10, so that its scaled gradients overflow.
pub fn overflow(
    device: &Device,
    s: Sizes,
    steps: usize,
    huge_at: usize,
) -> Result<Vec<ScalerStep>> {
    let mut t = Trainer::new(device, s, Precision::F16, 1)?;
    let mut scaler = t.scaler.take().expect("float16 trains with a scaler");
    let first = t.model.parameters()[0].clone();
    (0..steps)
        .map(|i| {
            let (x, y) = batch(device, s, i)?;
            let loss_factor = if i == huge_at { 1e10 } else { 1.0 };
            t.opt.zero_grad(true)?;
            let loss = t.loss(&x, &y)?.mul_scalar(loss_factor)?;
            let before = first.to_vec::<f32>()?;
            let scale_before = scaler.get_scale()?;
            scaler.scale(&loss)?.backward()?;
            let stepped = scaler.step(&mut t.opt)?;
            scaler.update()?;
            Ok(ScalerStep {
                step: i + 1,
                loss_factor,
                scale_before,
                stepped,
                scale_after: scaler.get_scale()?,
                params_changed: first.to_vec::<f32>()? != before,
            })
        })
        .collect()
}
// ANCHOR_END: overflow

pub fn overflow_table(device: &Device, rows: &[ScalerStep]) -> Table {
    let mut t = Table::new(
        format!(
            "3b. A forced overflow on {device}: float16 training with a GradScaler, one step's \
             loss multiplied by 1e10"
        ),
        &[
            "step",
            "loss multiplied by",
            "scale",
            "optimizer stepped",
            "parameters changed",
            "scale after update",
        ],
    );
    for r in rows {
        t.row([
            r.step.to_string(),
            format!("{:e}", r.loss_factor),
            format!("{}", r.scale_before),
            if r.stepped { "yes" } else { "no (inf found)" }.to_string(),
            if r.params_changed { "yes" } else { "no" }.to_string(),
            format!("{}", r.scale_after),
        ]);
    }
    t
}
