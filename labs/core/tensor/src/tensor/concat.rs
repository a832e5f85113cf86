//! `cat` and `stack`. The output is allocated once and each input is written into its
//! `narrow`ed part of it by one strided-scatter launch (the inverse of the strided
//! copy), so dense inputs cost no memory beyond the output, as in PyTorch (an input
//! that is a strided view is made dense first). Backward hands each input its
//! `narrow`ed part of the gradient, a view.

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::GradOp;
use super::Tensor;
use crate::error::{Error, Result};
use crate::kernels::Kernel;

/// `cat` runs in the widest float dtype of its inputs under autocast (PyTorch's
/// `promote` list).
pub(super) const CAT: AutocastOp = AutocastOp {
    name: "cat",
    policy: CastPolicy::Promote,
};

impl Tensor {
    /// PyTorch's `cat(tensors, dim)`: the tensors joined along `dim`; every other
    /// dimension, the dtype and the device must agree.
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(CAT.policy, tensors)? {
            return Tensor::cat(&args.iter().collect::<Vec<_>>(), dim);
        }
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
        let mut shape = first.shape().to_vec();
        shape[dim] = sizes.iter().sum();
        let out = Tensor::empty(&shape, first.dtype, first.device())?;
        let mut start = 0;
        for (t, &len) in tensors.iter().zip(&sizes) {
            let part = out.narrow(dim, start, len)?;
            let src = t.detach().contiguous()?;
            if src.numel() > 0 {
                first.device().launch(&Kernel::StridedScatter {
                    width: first.dtype.size(),
                    src: src.ptr(),
                    dst: part.ptr(),
                    layout: part.layout.strided()?.coalesced(),
                    n: src.numel(),
                })?;
            }
            start += len;
        }
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

    /// The gradients of `cat`'s inputs: each its part of `g` along `dim`, a view (as
    /// PyTorch's `CatBackward`: what reads it takes the strides, or copies if it must).
    pub(crate) fn cat_backward(g: &Tensor, dim: usize, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let part = g.detach().narrow(dim, start, len);
                start += len;
                part
            })
            .collect()
    }
}
