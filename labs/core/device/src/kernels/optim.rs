//! The optimizer steps as launches: one fused kernel per parameter per step that reads
//! the gradient, updates the optimizer's state and writes the parameter in one pass
//! (PyTorch's `fused=True` idea), instead of the half-dozen elementwise launches and
//! temporaries an unfused step costs. The CUDA source is `kernels/optim.cu`; the twin
//! is [`super::optim_cpu`]. The update rules are PyTorch's and are written out there.
//!
//! The parameter and its gradient share a float dtype (`float32`, `float16` or
//! `bfloat16`); the state is always `float32`, so that a half-precision parameter's
//! momentum keeps its small updates (PyTorch keeps the state in the parameter's dtype).

use crate::device_id::DevicePtr;
use crate::dtype::DType;

/// One SGD step over `n` elements (see `sgd_step` in `kernels/optim.cu`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// The dtype of the parameter and its gradient.
    pub dtype: DType,
    pub param: DevicePtr,
    pub grad: DevicePtr,
    /// `n` float32 elements of momentum; unused (may be 0) when `momentum` is 0.
    pub momentum_buffer: DevicePtr,
    pub n: usize,
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    /// The buffer's first step: it becomes the gradient (PyTorch clones it), with no
    /// dampening, whatever it held.
    pub first: bool,
}

/// One Adam or AdamW step over `n` elements (see `adam_step` in `kernels/optim.cu`).
/// The host computes the step's scalars in float64, as PyTorch does in Python, unless
/// the step count lives on the device (`step`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// The dtype of the parameter and its gradient.
    pub dtype: DType,
    pub param: DevicePtr,
    pub grad: DevicePtr,
    /// `n` float32 elements each: the first and second moment estimates.
    pub exp_avg: DevicePtr,
    pub exp_avg_sq: DevicePtr,
    pub n: usize,
    /// `1 - beta1`, the weight of the gradient in the first moment (computed in f64).
    pub one_minus_beta1: f32,
    pub beta2: f32,
    /// `1 - beta2` (computed in f64).
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
    /// PyTorch's `capturable=True`: a float32 device scalar holding the step count
    /// `t`, from which the kernel computes `step_size` and `bias_correction2_sqrt` itself
    /// (in float32, with `lr`), so that each replay of a captured step sees its own
    /// count; 0 when the host computed them.
    pub step: DevicePtr,
    /// The learning rate, for a `step` on the device.
    pub lr: f32,
}
