//! The gradient scaler's kernel as a launch: one fused pass per gradient that unscales
//! it in place and records whether it held an infinity or a NaN (PyTorch's
//! `_amp_foreach_non_finite_check_and_unscale_`, one gradient at a time). The CUDA
//! source is `kernels/amp.cu`; the twin is [`super::amp_cpu`].

use crate::device_id::DevicePtr;
use crate::dtype::DType;

/// `grad[i] *= inv_scale` over `n` elements, and `*found_inf = 1.0` if any element was
/// not finite before (see `non_finite_check_and_unscale` in `kernels/amp.cu`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnscaleGrad {
    /// The gradient's float dtype.
    pub dtype: DType,
    pub grad: DevicePtr,
    /// One float32 flag, left alone when every element is finite.
    pub found_inf: DevicePtr,
    pub inv_scale: f32,
    pub n: usize,
}
