//! `softmax` and `log_softmax` over any dimension: the dimension is moved last and the
//! tensor made dense (a copy only when it is not already so), then one warp per row
//! runs the max-subtracted kernel of `kernels/rows.cu`. Backward reads the saved
//! output, as PyTorch's does. A half-precision input asked for a float32 output (the
//! `dtype=` argument, which autocast sets) is read as it is by a kernel that writes
//! float32, and the backward writes the gradient in the input's dtype: neither a
//! float32 copy of the input nor a float32 gradient to cast, as PyTorch's
//! `_softmax(x, dim, half_to_float=True)` and `_softmax_backward_data(.., input_dtype)`.

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::GradOp;
use super::promote::is_floating_point;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{Kernel, RowKernel};

/// The permutation that moves `dim` last, keeping the others in order.
pub(super) fn dim_last_order(rank: usize, dim: usize) -> Vec<usize> {
    (0..rank).filter(|&d| d != dim).chain([dim]).collect()
}

/// The inverse of a permutation.
pub(super) fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (i, &d) in order.iter().enumerate() {
        inv[d] = i;
    }
    inv
}

/// `softmax` and `log_softmax` write float32 under autocast unless given a dtype
/// (PyTorch's `fp32_set_opt_dtype` list).
pub(super) const SOFTMAX: AutocastOp = AutocastOp {
    name: "softmax",
    policy: CastPolicy::Fp32SetOptDtype,
};
pub(super) const LOG_SOFTMAX: AutocastOp = AutocastOp {
    name: "log_softmax",
    policy: CastPolicy::Fp32SetOptDtype,
};

impl Tensor {
    /// This tensor (without its graph) with `dim` moved last, dense: its rows are the
    /// lines along `dim`.
    pub(super) fn dim_last(&self, dim: usize) -> Result<Tensor> {
        let order = dim_last_order(self.shape().len(), dim);
        self.detach().permute(&order)?.contiguous()
    }

    /// The inverse of [`Tensor::dim_last`]: a dense tensor back in the original order.
    pub(super) fn dim_back(&self, dim: usize) -> Result<Tensor> {
        let order = dim_last_order(self.shape().len(), dim);
        self.permute(&inverse(&order))?.contiguous()
    }

    /// `exp(x) / sum(exp(x))` along `dim` (PyTorch's `softmax(dim)`), computed in
    /// float32 for every float dtype. Inside an autocast region a half-precision input
    /// gives a float32 output, as [`Tensor::softmax_dtype`] with float32 does.
    pub fn softmax(&self, dim: usize) -> Result<Tensor> {
        self.softmax_impl(dim, false, None)
    }

    /// `x - log(sum(exp(x)))` along `dim` (PyTorch's `log_softmax(dim)`); under
    /// autocast a half-precision input gives a float32 output.
    pub fn log_softmax(&self, dim: usize) -> Result<Tensor> {
        self.softmax_impl(dim, true, None)
    }

    /// `softmax(dim, dtype=dtype)`: the output in `dtype`. A float16 or bfloat16 input
    /// with `dtype` float32 is read as it is and written in float32 by one kernel (no
    /// float32 copy of the input), and its gradient is written in the input's dtype
    /// (no float32 gradient); any other pair casts the input to `dtype` first, as
    /// PyTorch does. An explicit dtype is used as given, inside autocast or not.
    pub fn softmax_dtype(&self, dim: usize, dtype: DType) -> Result<Tensor> {
        self.softmax_impl(dim, false, Some(dtype))
    }

    /// `log_softmax(dim, dtype=dtype)`, as [`Tensor::softmax_dtype`]: what autocast
    /// runs for the log-probabilities of half-precision logits.
    pub fn log_softmax_dtype(&self, dim: usize, dtype: DType) -> Result<Tensor> {
        self.softmax_impl(dim, true, Some(dtype))
    }

    fn softmax_impl(&self, dim: usize, log: bool, dtype: Option<DType>) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        // PyTorch's fp32_set_opt_dtype: an explicit dtype is respected, else autocast
        // sets float32.
        let y_dtype = dtype
            .or_else(|| {
                super::autocast::autocast_opt_dtype(if log { LOG_SOFTMAX } else { SOFTMAX })
            })
            .unwrap_or(self.dtype);
        self.check_float(name)?;
        if !is_floating_point(y_dtype) {
            return Err(Error::InvalidArgument(format!(
                "{name}: the output dtype must be a floating-point type, got {y_dtype}"
            )));
        }
        self.layout.check_dim(name, dim)?;
        let half_to_float = matches!(self.dtype, DType::F16 | DType::BF16) && y_dtype == DType::F32;
        if y_dtype != self.dtype && !half_to_float {
            return self
                .to_dtype(y_dtype)?
                .softmax_impl(dim, log, Some(y_dtype));
        }
        let x = self.dim_last(dim)?;
        let y = Tensor::empty(x.shape(), y_dtype, self.device())?;
        let cols = self.shape()[dim];
        self.device().launch(&Kernel::Rows(RowKernel::Softmax {
            dtype: self.dtype,
            y_dtype,
            x: x.ptr(),
            out: y.ptr(),
            rows: x.numel().checked_div(cols).unwrap_or(0),
            cols,
            log,
        }))?;
        drop(x);
        let out = y.dim_back(dim)?;
        let saved = vec![out.clone()];
        Ok(Tensor::recorded(
            out,
            GradOp::Softmax {
                dim,
                log,
                input_dtype: self.dtype,
            },
            &[self],
            saved,
        ))
    }

    /// The input's gradient of `softmax`/`log_softmax` over `dim` from the saved
    /// output `y` and the output's gradient `g` (both in the output's dtype), written
    /// in the input's dtype `input_dtype` (PyTorch's `_softmax_backward_data(grad,
    /// output, dim, input_dtype)`).
    pub(crate) fn softmax_backward(
        y: &Tensor,
        g: &Tensor,
        dim: usize,
        log: bool,
        input_dtype: DType,
    ) -> Result<Tensor> {
        g.check_binary_dtype(y, "softmax_backward")?;
        let (yl, gl) = (y.dim_last(dim)?, g.dim_last(dim)?);
        let dx = Tensor::empty(yl.shape(), input_dtype, y.device())?;
        let cols = y.shape()[dim];
        y.device()
            .launch(&Kernel::Rows(RowKernel::SoftmaxBackward {
                dtype: input_dtype,
                y_dtype: y.dtype,
                y: yl.ptr(),
                grad: gl.ptr(),
                out: dx.ptr(),
                rows: yl.numel().checked_div(cols).unwrap_or(0),
                cols,
                log,
            }))?;
        dx.dim_back(dim)
    }

    /// The same device, dtype and shape as `other` (the gradients of row kernels).
    pub(crate) fn check_binary_dtype(&self, other: &Tensor, op: &'static str) -> Result<()> {
        self.check_same_device(other)?;
        if self.dtype != other.dtype {
            return Err(Error::DTypeMismatch {
                op,
                a: self.dtype,
                b: other.dtype,
            });
        }
        if self.shape() != other.shape() {
            return Err(Error::Shape {
                op,
                a: self.shape().to_vec(),
                b: other.shape().to_vec(),
            });
        }
        Ok(())
    }
}
