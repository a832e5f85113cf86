//! The named pointwise ops beyond arithmetic: `log`, `sqrt`, `rsqrt`, `tanh`,
//! `sigmoid`, `abs`, `gelu`, `clamp` (`neg`, `exp`, `relu` and `scale` are in `ops.rs`,
//! `pow_scalar` and `pow` in `broadcast.rs`). Each is one entry of `kernels/ops.rs`; this file gives them
//! PyTorch's names and arguments. The entries left without a name (`Step`, `StepGe`,
//! `StepLe`, `GeluGrad`, `GeluTanhGrad`) are derivatives, which autograd launches.

use super::promote::{is_floating_point, result_type, Scalar};
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::UnaryOp;

impl Tensor {
    /// The natural logarithm, elementwise (`torch.log`).
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }

    /// `sqrt(self)`, elementwise (`torch.sqrt`).
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }

    /// `tanh(self)`, elementwise (`torch.tanh`).
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }

    /// `1 / (1 + e^-self)`, elementwise (`torch.sigmoid`).
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }

    /// `1 / sqrt(self)`.
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt)
    }

    /// `|self|` (integers too).
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }

    /// GELU, as `torch.nn.functional.gelu(x, approximate=...)`: `"none"` is
    /// `x Φ(x)` with the error function, `"tanh"` the tanh approximation.
    pub fn gelu(&self, approximate: &str) -> Result<Tensor> {
        match approximate {
            "none" => self.unary(UnaryOp::Gelu),
            "tanh" => self.unary(UnaryOp::GeluTanh),
            other => Err(Error::InvalidArgument(format!(
                "gelu: approximate must be \"none\" or \"tanh\", got {other:?}"
            ))),
        }
    }

    /// Each element limited to `[min, max]` (`torch.clamp`); either bound may be
    /// absent, not both. An integer tensor with a float bound computes in float32, as
    /// PyTorch's promotion gives; a NaN element stays NaN. Bounds are passed to the
    /// kernel as float32, so integer bounds beyond 2^24 lose their low bits.
    pub fn clamp(&self, min: Option<Scalar>, max: Option<Scalar>) -> Result<Tensor> {
        let bounds: Vec<Scalar> = min.into_iter().chain(max).collect();
        if bounds.is_empty() {
            return Err(Error::InvalidArgument(
                "clamp: at least one of min and max must be given".into(),
            ));
        }
        let dtype = result_type(&[self], &bounds);
        let mut x = self.to_dtype(dtype)?;
        if let Some(min) = min {
            x = x.unary_with(UnaryOp::ClampMin, min.as_f64() as f32)?;
        }
        if let Some(max) = max {
            x = x.unary_with(UnaryOp::ClampMax, max.as_f64() as f32)?;
        }
        Ok(x)
    }

    /// `max(self, min)` elementwise (`torch.clamp_min`).
    pub fn clamp_min(&self, min: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(Some(min.into()), None)
    }

    /// `min(self, max)` elementwise (`torch.clamp_max`).
    pub fn clamp_max(&self, max: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(None, Some(max.into()))
    }

    /// Whether the tensor's dtype is a floating-point one (`is_floating_point()`).
    pub fn is_floating_point(&self) -> bool {
        is_floating_point(self.dtype())
    }

    /// This tensor as float32 when it is an integer one (what float-only ops do first).
    pub(super) fn promoted_to_float(&self) -> Result<Tensor> {
        if self.is_floating_point() {
            Ok(self.clone())
        } else {
            self.to_dtype(DType::F32)
        }
    }
}
