//! `torch.amp.GradScaler`: loss scaling for float16 training. A float16 gradient
//! smaller than 2^-24 is zero; multiplying the loss by a large factor (the scale)
//! multiplies every gradient by it, lifting small ones into range. Before the
//! optimizer step the gradients are divided by the scale again (`unscale_`), in float32,
//! and checked: if any is infinite or NaN the scale was too large, the step is skipped
//! and the scale halved; after `growth_interval` steps in a row without one it is
//! doubled, so it keeps probing for the largest scale that does not overflow.
//!
//! The update rule is PyTorch's (`_amp_update_scale_`), in float32:
//!
//! ```text
//! if found_inf:  scale *= backoff_factor;  tracker = 0
//! else:          tracker += 1
//!                if tracker == growth_interval: scale *= growth_factor (if finite); tracker = 0
//! ```
//!
//! As in PyTorch, the scale and the growth tracker live on the device, in two
//! one-element tensors made at the first `scale` (or `unscale_`), and both the unscale
//! kernel and the update kernel read them there: a step reads one value on the host,
//! the overflow flag that decides whether the optimizer runs (`found_inf.item()` in
//! PyTorch's `_maybe_opt_step`), and `update` waits for nothing. Reading the scale
//! ([`GradScaler::get_scale`]) waits for the device.
//!
//! A training step is `scaler.scale(&loss)?.backward()?; scaler.step(&mut opt)?;
//! scaler.update()?`, with an optional `scaler.unscale_(&opt)?` before `step` to clip or
//! inspect the true gradients. Each optimizer is unscaled at most once between updates,
//! as in PyTorch.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::Optimizer;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::fused::{unscale_grad, update_scale, ScaleRule};
use crate::tensor::{no_grad, Category, DType, Tensor};

/// Where an optimizer is in the scaler's cycle since the last `update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalerStage {
    /// Nothing done yet.
    Ready,
    /// `unscale_` ran: the gradients hold true values.
    Unscaled,
    /// `step` ran (or was skipped for an overflow).
    Stepped,
}

struct OptimizerState {
    stage: ScalerStage,
    /// One float32 on the device, 1 when some gradient was not finite.
    found_inf: Tensor,
}

/// The scaler's state on its device (PyTorch's `_scale` and `_growth_tracker`).
struct DeviceState {
    /// float32, shape `[]`.
    scale: Tensor,
    /// int32, shape `[]`: good steps in a row since the last growth or backoff.
    growth_tracker: Tensor,
}

// ANCHOR: grad_scaler
/// PyTorch's `GradScaler("cuda")`.
pub struct GradScaler {
    init_scale: f32,
    growth_factor: f32,
    backoff_factor: f32,
    growth_interval: u32,
    /// The scale and growth tracker, on the device of the first loss scaled.
    state: OnceLock<DeviceState>,
    /// Per optimizer (by address), what happened since the last update.
    per_optimizer: HashMap<usize, OptimizerState>,
}
// ANCHOR_END: grad_scaler

/// Whether a `found_inf` flag is set: the step's one read on the host. The dry-run
/// device computes no values: there no step overflows (its allocations are those of a
/// run whose steps all go ahead).
fn overflowed(found_inf: &Tensor) -> Result<bool> {
    if found_inf.device().is_dry() {
        return Ok(false);
    }
    Ok(found_inf.item::<f32>()? != 0.0)
}

/// A stable key for an optimizer while it is borrowed (its address).
fn key(optimizer: &dyn Optimizer) -> usize {
    optimizer as *const dyn Optimizer as *const () as usize
}

impl Default for GradScaler {
    fn default() -> GradScaler {
        GradScaler::new()
    }
}

impl GradScaler {
    /// PyTorch's defaults: `init_scale=2**16, growth_factor=2.0, backoff_factor=0.5,
    /// growth_interval=2000`.
    pub fn new() -> GradScaler {
        GradScaler::with_options(65536.0, 2.0, 0.5, 2000).expect("the defaults are valid")
    }

    /// A scaler with chosen constants; as in PyTorch, `growth_factor` must exceed 1 and
    /// `backoff_factor` lie in (0, 1).
    pub fn with_options(
        init_scale: f32,
        growth_factor: f32,
        backoff_factor: f32,
        growth_interval: u32,
    ) -> Result<GradScaler> {
        if !(init_scale.is_finite() && init_scale > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "GradScaler: init_scale must be positive and finite, got {init_scale}"
            )));
        }
        if growth_factor.is_nan() || growth_factor <= 1.0 {
            return Err(Error::InvalidArgument(format!(
                "GradScaler: the growth factor must be > 1, got {growth_factor}"
            )));
        }
        if !(backoff_factor > 0.0 && backoff_factor < 1.0) {
            return Err(Error::InvalidArgument(format!(
                "GradScaler: the backoff factor must be < 1 and > 0, got {backoff_factor}"
            )));
        }
        if growth_interval == 0 {
            return Err(Error::InvalidArgument(
                "GradScaler: growth_interval must be at least 1".into(),
            ));
        }
        Ok(GradScaler {
            init_scale,
            growth_factor,
            backoff_factor,
            growth_interval,
            state: OnceLock::new(),
            per_optimizer: HashMap::new(),
        })
    }

    /// The device state, made on `device` at first use (PyTorch's
    /// `_lazy_init_scale_growth_tracker`); later uses must be on the same device.
    fn device_state(&self, device: &Device) -> Result<&DeviceState> {
        if self.state.get().is_none() {
            let _state = Category::OptimizerState.scope();
            let state = DeviceState {
                scale: Tensor::full(&[], self.init_scale, device)?,
                growth_tracker: Tensor::zeros(&[], DType::I32, device)?,
            };
            // `&self` is shared only within one thread's step; a lost race would only
            // drop an identical pair.
            let _ = self.state.set(state);
        }
        let state = self.state.get().expect("set above");
        if !state.scale.device().same(device) {
            return Err(Error::InvalidArgument(format!(
                "GradScaler: its scale lives on {}, the tensors are on {device}",
                state.scale.device()
            )));
        }
        Ok(state)
    }

    // ANCHOR: get_scale
    /// The current scale (`get_scale()`): the initial one before the first `scale`,
    /// then the device's value, which waits for the device (as PyTorch's `.item()`).
    /// The dry-run device holds no values, so there it is an error.
    pub fn get_scale(&self) -> Result<f32> {
        match self.state.get() {
            None => Ok(self.init_scale),
            Some(s) => read(&s.scale, "get_scale"),
        }
    }
    // ANCHOR_END: get_scale

    /// Good steps in a row counted toward the next growth (`_growth_tracker`); reading
    /// it waits for the device, as [`get_scale`](Self::get_scale).
    pub fn growth_tracker(&self) -> Result<u32> {
        match self.state.get() {
            None => Ok(0),
            Some(s) => Ok(read::<i32>(&s.growth_tracker, "growth_tracker")? as u32),
        }
    }

    /// Where `optimizer` is in the cycle since the last `update`.
    pub fn stage(&self, optimizer: &dyn Optimizer) -> ScalerStage {
        self.per_optimizer
            .get(&key(optimizer))
            .map_or(ScalerStage::Ready, |s| s.stage)
    }

    // ANCHOR: scale
    /// `loss * scale`, in float32 (a half-precision loss is widened first, as PyTorch's
    /// float32 scale tensor promotes it): the tensor to call `backward` on.
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        loss.check_float_dtype("GradScaler.scale")?;
        let state = self.device_state(loss.device())?;
        loss.to_dtype(DType::F32)?.mul(&state.scale)
    }
    // ANCHOR_END: scale

    // ANCHOR: unscale
    /// Divides every gradient of `optimizer`'s parameters by the scale, in place, and
    /// records on the device whether any was infinite or NaN: one fused kernel per
    /// gradient writing one shared flag. At most once per optimizer between updates.
    pub fn unscale_(&mut self, optimizer: &dyn Optimizer) -> Result<()> {
        match self.stage(optimizer) {
            ScalerStage::Ready => {}
            ScalerStage::Unscaled => {
                return Err(Error::InvalidArgument(
                    "unscale_() has already been called on this optimizer since the last \
                     update()"
                        .into(),
                ))
            }
            ScalerStage::Stepped => {
                return Err(Error::InvalidArgument(
                    "unscale_() is being called after step()".into(),
                ))
            }
        }
        let Some(device) = optimizer.params().first().map(|p| p.device().clone()) else {
            return Err(Error::InvalidArgument(
                "GradScaler.unscale_: the optimizer has no parameters".into(),
            ));
        };
        let scale = self.device_state(&device)?.scale.clone();
        let found_inf = Tensor::zeros(&[1], DType::F32, &device)?;
        let _off = no_grad();
        for p in optimizer.params() {
            let Some(g) = p.grad() else { continue };
            if g.dtype() == DType::F16 {
                return Err(Error::InvalidArgument(
                    "GradScaler: attempting to unscale float16 gradients; keep the \
                     parameters (master weights) in float32 and let autocast make the \
                     float16 copies"
                        .into(),
                ));
            }
            g.check_float_dtype("unscale_")?;
            g.check_same_device(&found_inf)?;
            if !g.is_contiguous() {
                return Err(Error::InvalidArgument(format!(
                    "unscale_: the gradient of shape {:?} is not contiguous",
                    g.shape()
                )));
            }
            unscale_grad(&g, &found_inf, &scale)?;
        }
        self.per_optimizer.insert(
            key(optimizer),
            OptimizerState {
                stage: ScalerStage::Unscaled,
                found_inf,
            },
        );
        Ok(())
    }
    // ANCHOR_END: unscale

    // ANCHOR: step
    /// Unscales the gradients if `unscale_` did not, then runs `optimizer.step()` unless
    /// a gradient was not finite. Returns whether the step ran. Reading the flag waits
    /// for the checks: the step's one synchronisation (PyTorch's `found_inf.item()`).
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        match self.stage(optimizer) {
            ScalerStage::Ready => self.unscale_(optimizer)?,
            ScalerStage::Unscaled => {}
            ScalerStage::Stepped => {
                return Err(Error::InvalidArgument(
                    "step() has already been called since the last update()".into(),
                ))
            }
        }
        let state = self
            .per_optimizer
            .get_mut(&key(optimizer))
            .expect("unscaled above");
        state.stage = ScalerStage::Stepped;
        let overflow = overflowed(&state.found_inf)?;
        if !overflow {
            optimizer.step()?;
        }
        Ok(!overflow)
    }
    // ANCHOR_END: step

    // ANCHOR: update
    /// Backs the scale off if any optimizer found an overflow since the last update,
    /// else counts a good step and grows the scale after `growth_interval` of them; then
    /// starts a new cycle. All on the device: the optimizers' flags are summed there and
    /// one kernel applies the rule to the device's scale and tracker, so nothing here
    /// waits for the device.
    pub fn update(&mut self) -> Result<()> {
        if self.per_optimizer.is_empty() {
            return Err(Error::InvalidArgument(
                "update(): no inf checks were recorded prior to update (call step() or \
                 unscale_() first)"
                    .into(),
            ));
        }
        let _off = no_grad();
        let mut flags = self.per_optimizer.drain().map(|(_, s)| s.found_inf);
        let first = flags.next().expect("not empty");
        let found_inf = flags.try_fold(first, |sum, f| sum.add(&f))?;
        let state = self.state.get().expect("unscale_ made the device state");
        let rule = ScaleRule {
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
        };
        update_scale(&state.scale, &state.growth_tracker, &found_inf, &rule)?;
        Ok(())
    }
    // ANCHOR_END: update
}

/// The value of a one-element state tensor, refused on the dry-run device.
fn read<T: crate::tensor::Element>(t: &Tensor, what: &str) -> Result<T> {
    if t.device().is_dry() {
        return Err(Error::InvalidArgument(format!(
            "GradScaler.{what}: the dry-run device {} holds no values",
            t.device()
        )));
    }
    t.item::<T>()
}
