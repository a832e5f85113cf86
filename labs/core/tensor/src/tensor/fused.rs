//! Fused kernels launched on tensors: the optimizer steps and the gradient scaler's two
//! kernels, each one pass that reads and writes several tensors in place. As candle's
//! `CustomOp` does, the tensor layer owns the launch: it checks every operand (device,
//! dtype, shape, contiguity), turns the tensors into the kernel's addresses and enqueues
//! the op layer's kernel, so a caller names tensors and scalars and never an address.
//! The kernels themselves, their CUDA sources and CPU twins, stay in the op layer
//! (`kernels/optim.rs`, `kernels/amp.rs`), which states the update rules.
//!
//! Each launch is enqueued on the device's default stream and is refused on a tensor
//! that requires grad while autograd records (run it under `no_grad`).

use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{self, Kernel};

/// The scalars of one Adam or AdamW step (see [`adam_step`]), computed by the caller in
/// float64 as PyTorch computes them in Python.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamHyper {
    /// `1 - beta1`, the weight of the gradient in the first moment.
    pub one_minus_beta1: f32,
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `lr / (1 - beta1^step)`.
    pub step_size: f32,
    /// `sqrt(1 - beta2^step)`.
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
    /// Adam's L2 penalty, added to the gradient (0 for AdamW).
    pub weight_decay: f32,
    /// The factor the parameter is multiplied by first: AdamW's decoupled decay
    /// `1 - lr * weight_decay` (1 for Adam).
    pub param_decay: f32,
    /// The learning rate: what [`adam_step_capturable`] computes the step size from.
    pub lr: f32,
}

/// The scalars of one SGD step (see [`sgd_step`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdHyper {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    /// The momentum buffer's first step: it becomes the gradient, whatever it held.
    pub first: bool,
}

/// The gradient scaler's update rule (see [`update_scale`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleRule {
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
}

/// One fused Adam or AdamW step of `param` in place (`kernels/optim.rs` states the
/// rule): `grad` has the parameter's float dtype and shape, `exp_avg` and `exp_avg_sq`
/// are float32 of its shape, updated in place; all dense, on one device.
pub fn adam_step(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    hyper: &AdamHyper,
) -> Result<()> {
    launch_adam(param, grad, exp_avg, exp_avg_sq, None, hyper)
}

/// [`adam_step`] with the step count on the device (PyTorch's `capturable=True`):
/// `step`, a float32 scalar on the parameter's device, holds this step's `t`; the
/// kernel computes the step size and the second bias correction from it and
/// `hyper.lr` in float32, ignoring `hyper.step_size` and `hyper.bias_correction2_sqrt`.
/// Nothing is computed on the host, so a captured step replays with each step's count.
pub fn adam_step_capturable(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    step: &Tensor,
    hyper: &AdamHyper,
) -> Result<()> {
    const OP: &str = "adam_step_capturable";
    step.check_same_device(param)?;
    if step.dtype() != DType::F32 || step.numel() != 1 || !step.is_contiguous() {
        return Err(Error::InvalidArgument(format!(
            "{OP}: the step count must be one float32 element, got {} of shape {:?}",
            step.dtype(),
            step.shape()
        )));
    }
    launch_adam(param, grad, exp_avg, exp_avg_sq, Some(step), hyper)
}

fn launch_adam(
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    step: Option<&Tensor>,
    hyper: &AdamHyper,
) -> Result<()> {
    const OP: &str = "adam_step";
    check_param(OP, param, grad)?;
    check_state(OP, param, exp_avg, "exp_avg")?;
    check_state(OP, param, exp_avg_sq, "exp_avg_sq")?;
    param.device().launch(&Kernel::AdamStep(kernels::AdamStep {
        dtype: param.dtype(),
        param: param.ptr(),
        grad: grad.ptr(),
        exp_avg: exp_avg.ptr(),
        exp_avg_sq: exp_avg_sq.ptr(),
        n: param.numel(),
        one_minus_beta1: hyper.one_minus_beta1,
        beta2: hyper.beta2,
        one_minus_beta2: hyper.one_minus_beta2,
        step_size: hyper.step_size,
        bias_correction2_sqrt: hyper.bias_correction2_sqrt,
        eps: hyper.eps,
        weight_decay: hyper.weight_decay,
        param_decay: hyper.param_decay,
        step: step.map_or(0, Tensor::ptr),
        lr: hyper.lr,
    }))
}

/// One fused SGD step of `param` in place (`kernels/optim.rs` states the rule): `grad`
/// has the parameter's float dtype and shape; `momentum_buffer`, float32 of its shape,
/// is needed exactly when `hyper.momentum` is not 0. All dense, on one device.
pub fn sgd_step(
    param: &Tensor,
    grad: &Tensor,
    momentum_buffer: Option<&Tensor>,
    hyper: &SgdHyper,
) -> Result<()> {
    const OP: &str = "sgd_step";
    check_param(OP, param, grad)?;
    match momentum_buffer {
        Some(b) => check_state(OP, param, b, "momentum_buffer")?,
        None if hyper.momentum != 0.0 => {
            return Err(Error::InvalidArgument(format!(
                "{OP}: momentum {} needs a momentum buffer",
                hyper.momentum
            )))
        }
        None => {}
    }
    param.device().launch(&Kernel::SgdStep(kernels::SgdStep {
        dtype: param.dtype(),
        param: param.ptr(),
        grad: grad.ptr(),
        momentum_buffer: momentum_buffer.map_or(0, Tensor::ptr),
        n: param.numel(),
        lr: hyper.lr,
        momentum: hyper.momentum,
        dampening: hyper.dampening,
        weight_decay: hyper.weight_decay,
        nesterov: hyper.nesterov,
        first: hyper.first,
    }))
}

/// Divides the dense float gradient `grad` by `scale` in place and sets `found_inf`
/// to 1 if any element was infinite or NaN (left alone otherwise): `scale` and
/// `found_inf` are one-element float32 tensors on the gradient's device.
pub fn unscale_grad(grad: &Tensor, found_inf: &Tensor, scale: &Tensor) -> Result<()> {
    const OP: &str = "unscale_grad";
    check_written(OP, grad)?;
    grad.check_float_dtype(OP)?;
    check_scalar(OP, grad, found_inf, "found_inf", DType::F32)?;
    check_scalar(OP, grad, scale, "scale", DType::F32)?;
    grad.device()
        .launch(&Kernel::UnscaleGrad(kernels::UnscaleGrad {
            dtype: grad.dtype(),
            grad: grad.ptr(),
            found_inf: found_inf.ptr(),
            scale: scale.ptr(),
            n: grad.numel(),
        }))
}

/// The gradient scaler's rule applied on the device, in place: backs `scale` (one
/// float32) off when `found_inf` (one float32) is not 0, else counts a good step in
/// `growth_tracker` (one int32) and grows the scale after `rule.growth_interval` of
/// them.
pub fn update_scale(
    scale: &Tensor,
    growth_tracker: &Tensor,
    found_inf: &Tensor,
    rule: &ScaleRule,
) -> Result<()> {
    const OP: &str = "update_scale";
    check_scalar(OP, scale, scale, "scale", DType::F32)?;
    check_scalar(OP, scale, growth_tracker, "growth_tracker", DType::I32)?;
    check_scalar(OP, scale, found_inf, "found_inf", DType::F32)?;
    check_written(OP, growth_tracker)?;
    scale
        .device()
        .launch(&Kernel::UpdateScale(kernels::UpdateScale {
            scale: scale.ptr(),
            growth_tracker: growth_tracker.ptr(),
            found_inf: found_inf.ptr(),
            growth_factor: rule.growth_factor,
            backoff_factor: rule.backoff_factor,
            growth_interval: rule.growth_interval,
        }))
}

/// A tensor the kernel writes: dense and not recorded by autograd.
fn check_written(op: &'static str, t: &Tensor) -> Result<()> {
    t.check_not_recording(op)?;
    t.check_contiguous(op)
}

/// A parameter and its gradient: a dense float parameter, and a dense gradient of its
/// dtype and shape on its device.
fn check_param(op: &'static str, param: &Tensor, grad: &Tensor) -> Result<()> {
    check_written(op, param)?;
    param.check_float_dtype(op)?;
    param.check_same_device(grad)?;
    param.check_same_dtype(grad, op)?;
    param.check_same_shape(grad, op)?;
    grad.check_contiguous(op)
}

/// A piece of optimizer state: dense float32 of the parameter's shape, on its device.
fn check_state(op: &'static str, param: &Tensor, state: &Tensor, what: &str) -> Result<()> {
    param.check_same_device(state)?;
    param.check_same_shape(state, op)?;
    check_written(op, state)?;
    if state.dtype() != DType::F32 {
        return Err(Error::InvalidArgument(format!(
            "{op}: {what} must be float32, got {}",
            state.dtype()
        )));
    }
    Ok(())
}

/// A one-element tensor of `dtype` on `on`'s device.
fn check_scalar(op: &'static str, on: &Tensor, t: &Tensor, what: &str, dtype: DType) -> Result<()> {
    on.check_same_device(t)?;
    if t.numel() != 1 || t.dtype() != dtype {
        return Err(Error::InvalidArgument(format!(
            "{op}: {what} must be one {dtype} element, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        )));
    }
    Ok(())
}
