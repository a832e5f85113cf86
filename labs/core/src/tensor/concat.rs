//! `cat` and `stack`. The output is allocated with the joined dimension first, where
//! each input's part is one contiguous run, so each input is one strided-copy launch
//! (the existing gather kernel) into its run; the result is that buffer viewed back in
//! the original order (a further copy only when the dimension is not already first).
//! Backward hands each input its `narrow`ed part of the gradient.

use super::graph::GradOp;
use super::softmax::inverse;
use super::Tensor;
use crate::error::{Error, Result};
use crate::kernels::Kernel;

impl Tensor {
    /// PyTorch's `cat(tensors, dim)`: the tensors joined along `dim`; every other
    /// dimension, the dtype and the device must agree.
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument(
                "cat: expected a non-empty list of tensors".into(),
            ));
        };
        first.layout.check_dim("cat", dim)?;
        let rank = first.shape().len();
        for t in &tensors[1..] {
            t.check_same_device(first)?;
            if t.dtype != first.dtype {
                return Err(Error::DTypeMismatch {
                    op: "cat",
                    a: first.dtype,
                    b: t.dtype,
                });
            }
            let fits = t.shape().len() == rank
                && (0..rank).all(|d| d == dim || t.shape()[d] == first.shape()[d]);
            if !fits {
                return Err(Error::Shape {
                    op: "cat (sizes must match except in the joined dimension)",
                    a: first.shape().to_vec(),
                    b: t.shape().to_vec(),
                });
            }
        }
        let sizes: Vec<usize> = tensors.iter().map(|t| t.shape()[dim]).collect();
        // `dim` first, the others in order.
        let order: Vec<usize> = [dim]
            .into_iter()
            .chain((0..rank).filter(|&d| d != dim))
            .collect();
        let mut joined: Vec<usize> = order.iter().map(|&d| first.shape()[d]).collect();
        joined[0] = sizes.iter().sum();
        let buffer = Tensor::empty(&joined, first.dtype, first.device())?;
        let width = first.dtype.size();
        let mut start = 0;
        for t in tensors {
            let part = t.detach().permute(&order)?;
            let n = part.numel();
            if n > 0 {
                first.device().launch(&Kernel::StridedCopy {
                    width,
                    src: part.ptr(),
                    dst: buffer.ptr() + (start * width) as u64,
                    layout: part.layout.strided()?,
                    n,
                })?;
            }
            start += n;
        }
        let out = buffer.permute(&inverse(&order))?.contiguous()?;
        Ok(Tensor::recorded(
            out,
            GradOp::Cat { dim, sizes },
            tensors,
            vec![],
        ))
    }

    /// PyTorch's `stack(tensors, dim)`: tensors of one shape joined along a new
    /// dimension `dim` (at most their rank).
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument(
                "stack: expected a non-empty list of tensors".into(),
            ));
        };
        if dim > first.shape().len() {
            return Err(Error::InvalidArgument(format!(
                "stack: dimension {dim} is out of range for tensors of shape {:?}",
                first.shape()
            )));
        }
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::Shape {
                op: "stack (every tensor must have the same shape)",
                a: first.shape().to_vec(),
                b: t.shape().to_vec(),
            });
        }
        let mut shape = first.shape().to_vec();
        shape.insert(dim, 1);
        let parts = tensors
            .iter()
            .map(|t| t.reshape(&shape))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&parts, dim)
    }

    /// The gradients of `cat`'s inputs: each its part of `g` along `dim`.
    pub(crate) fn cat_backward(g: &Tensor, dim: usize, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let part = g.detach().narrow(dim, start, len)?.contiguous();
                start += len;
                part
            })
            .collect()
    }
}
