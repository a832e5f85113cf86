//! `max` and `argmax` over a dimension (one warp per line along it, first index on
//! ties, NaN largest, as PyTorch), and `var` over dimensions with a `correction`.

use super::graph::GradOp;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{Kernel, RowKernel};

/// `shape` without `dim`, or with it as 1 when `keepdim`.
fn reduced_shape(shape: &[usize], dim: usize, keepdim: bool) -> Vec<usize> {
    let mut out = shape.to_vec();
    if keepdim {
        out[dim] = 1;
    } else {
        out.remove(dim);
    }
    out
}

impl Tensor {
    /// PyTorch's `max(dim, keepdim)`: the largest values along `dim` and their int64
    /// indices (the first on ties; a NaN counts as the largest). The gradient flows to
    /// the chosen position.
    pub fn max_dim(&self, dim: usize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max";
        self.check_float(OP)?;
        self.layout.check_dim(OP, dim)?;
        let cols = self.shape()[dim];
        if cols == 0 {
            return Err(Error::InvalidArgument(format!(
                "max(): expected a non-empty dimension {dim} to reduce, got shape {:?}",
                self.shape()
            )));
        }
        let x = self.dim_last(dim)?;
        let rows = x.numel() / cols;
        let shape = reduced_shape(self.shape(), dim, keepdim);
        let values = Tensor::empty(&shape, self.dtype, self.device())?;
        let indices = Tensor::empty(&shape, DType::I64, self.device())?;
        self.device().launch(&Kernel::Rows(RowKernel::MaxRows {
            dtype: self.dtype,
            x: x.ptr(),
            values: values.ptr(),
            indices: indices.ptr(),
            rows,
            cols,
        }))?;
        let values = Tensor::recorded(
            values,
            GradOp::MaxDim {
                dim,
                keepdim,
                input: self.shape().to_vec(),
            },
            &[self],
            vec![indices.clone()],
        );
        Ok((values, indices))
    }

    /// PyTorch's `argmax(dim, keepdim)`: the int64 index of the largest value along
    /// `dim` (the first on ties).
    pub fn argmax(&self, dim: usize, keepdim: bool) -> Result<Tensor> {
        Ok(self.detach().max_dim(dim, keepdim)?.1)
    }

    /// The input's gradient of `max_dim`: `g` at each chosen position, zero elsewhere.
    pub(crate) fn max_dim_backward(
        g: &Tensor,
        indices: &Tensor,
        dim: usize,
        input: &[usize],
    ) -> Result<Tensor> {
        let cols = input[dim];
        let rows = indices.numel();
        let g = g.contiguous()?;
        // The input's shape with `dim` last, as the forward saw it.
        let mut last: Vec<usize> = (0..input.len())
            .filter(|&d| d != dim)
            .map(|d| input[d])
            .collect();
        last.push(cols);
        let dx = Tensor::zeros(&last, g.dtype, g.device())?;
        g.device().launch(&Kernel::Rows(RowKernel::ScatterRows {
            dtype: g.dtype,
            grad: g.ptr(),
            indices: indices.ptr(),
            out: dx.ptr(),
            rows,
            cols,
        }))?;
        dx.dim_back(dim)
    }

    /// PyTorch's `var(dims, correction, keepdim)`: `sum((x - mean)^2) / (N -
    /// correction)` over the `N` elements of `dims` (`correction = 1`: unbiased).
    pub fn var_dims(&self, dims: &[usize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.check_float("var")?;
        let x = self.detach();
        let d = x.sub(&x.centred(dims)?)?;
        let n: usize = dims.iter().map(|&d| self.shape()[d]).product();
        let out = d
            .mul(&d)?
            .sum_dims(dims, keepdim)?
            .scale(1.0 / n.saturating_sub(correction) as f32)?;
        Ok(Tensor::recorded(
            out,
            GradOp::Var {
                dims: dims.to_vec(),
                correction,
                keepdim,
            },
            &[self],
            vec![x],
        ))
    }

    /// The mean over `dims`, stretched back to this tensor's shape (dense, no graph).
    fn centred(&self, dims: &[usize]) -> Result<Tensor> {
        self.detach()
            .mean_dims(dims, true)?
            .expand(self.shape())?
            .contiguous()
    }

    /// The input's gradient of `var_dims`: `g * 2 (x - mean) / (N - correction)`.
    pub(crate) fn var_backward(
        g: &Tensor,
        x: &Tensor,
        dims: &[usize],
        correction: usize,
        keepdim: bool,
    ) -> Result<Tensor> {
        let n: usize = dims.iter().map(|&d| x.shape()[d]).product();
        let mut kept = x.shape().to_vec();
        for &d in dims {
            kept[d] = 1;
        }
        let g = if keepdim {
            g.clone()
        } else {
            g.reshape(&kept)?
        };
        let g = g.expand(x.shape())?.contiguous()?;
        let d = x.sub(&x.centred(dims)?)?;
        g.mul(&d)?.scale(2.0 / n.saturating_sub(correction) as f32)
    }
}
