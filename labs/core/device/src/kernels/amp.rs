//! The gradient scaler's kernels as launches: one fused pass per gradient that unscales
//! it in place and records whether it held an infinity or a NaN (PyTorch's
//! `_amp_foreach_non_finite_check_and_unscale_`, one gradient at a time), and the
//! update of the scale and its growth tracker on the device (`_amp_update_scale_`).
//! The CUDA sources are `kernels/amp.cu` and `kernels/amp_update.cu`; the twins are in
//! [`super::amp_cpu`].

use crate::device_id::DevicePtr;
use crate::dtype::DType;

/// `grad[i] *= 1 / *scale` over `n` elements, and `*found_inf = 1.0` if any element
/// was not finite before (see `non_finite_check_and_unscale` in `kernels/amp.cu`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnscaleGrad {
    /// The gradient's float dtype.
    pub dtype: DType,
    pub grad: DevicePtr,
    /// One float32 flag, left alone when every element is finite.
    pub found_inf: DevicePtr,
    /// One float32, the scale the gradients were multiplied by; the kernel inverts it
    /// (in float64, rounded to float32, as PyTorch).
    pub scale: DevicePtr,
    pub n: usize,
}

/// The scaler's update rule on its device state (see `amp_update_scale` in
/// `kernels/amp_update.cu`): back off on an overflow, else count a good step and grow
/// after `growth_interval` of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateScale {
    /// One float32, updated in place.
    pub scale: DevicePtr,
    /// One int32, good steps in a row since the last growth or backoff.
    pub growth_tracker: DevicePtr,
    /// One float32: not zero when some optimizer found an overflow this step.
    pub found_inf: DevicePtr,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
}
