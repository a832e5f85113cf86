//! `softmax` and `log_softmax` over any dimension: the dimension is moved last and the
//! tensor made dense (a copy only when it is not already so), then one warp per row
//! runs the max-subtracted kernel of `kernels/rows.cu`. Backward reads the saved
//! output, as PyTorch's does.

use super::graph::GradOp;
use super::Tensor;
use crate::error::Result;
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
    /// float32 for every float dtype.
    pub fn softmax(&self, dim: usize) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }

    /// `x - log(sum(exp(x)))` along `dim` (PyTorch's `log_softmax(dim)`).
    pub fn log_softmax(&self, dim: usize) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }

    fn softmax_impl(&self, dim: usize, log: bool) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        if let Some(args) = super::autocast_args(name, &[self])? {
            return args[0].softmax_impl(dim, log);
        }
        self.check_float(name)?;
        self.layout.check_dim(name, dim)?;
        let x = self.dim_last(dim)?;
        let y = Tensor::empty(x.shape(), self.dtype, self.device())?;
        let cols = self.shape()[dim];
        self.device().launch(&Kernel::Rows(RowKernel::Softmax {
            dtype: self.dtype,
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
            GradOp::Softmax { dim, log },
            &[self],
            saved,
        ))
    }

    /// The input's gradient of `softmax`/`log_softmax` over `dim` from the saved
    /// output `y` and the output's gradient `g`.
    pub(crate) fn softmax_backward(
        y: &Tensor,
        g: &Tensor,
        dim: usize,
        log: bool,
    ) -> Result<Tensor> {
        g.check_binary_dtype(y, "softmax_backward")?;
        let (yl, gl) = (y.dim_last(dim)?, g.dim_last(dim)?);
        let dx = Tensor::empty(yl.shape(), y.dtype, y.device())?;
        let cols = y.shape()[dim];
        y.device()
            .launch(&Kernel::Rows(RowKernel::SoftmaxBackward {
                dtype: y.dtype,
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
            return Err(crate::error::Error::DTypeMismatch {
                op,
                a: self.dtype,
                b: other.dtype,
            });
        }
        if self.shape() != other.shape() {
            return Err(crate::error::Error::Shape {
                op,
                a: self.shape().to_vec(),
                b: other.shape().to_vec(),
            });
        }
        Ok(())
    }
}
