//! Views: new layouts over the same storage, and `contiguous`, the one copy that turns
//! a view back into dense memory. A view allocates nothing; writes through one are
//! seen by every tensor sharing the storage, as in PyTorch.

use super::graph::GradOp;
use super::Tensor;
use crate::error::{Error, Result};
use crate::kernels::Kernel;

impl Tensor {
    /// Dimensions `a` and `b` swapped, sharing storage (PyTorch's `transpose`).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        let mut dims: Vec<usize> = (0..self.shape().len()).collect();
        self.layout.check_dim("transpose", a)?;
        self.layout.check_dim("transpose", b)?;
        dims.swap(a, b);
        self.permute(&dims)
    }

    /// The dimensions reordered (`dims[i]` becomes dimension `i`), sharing storage.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let out = self.with_layout(self.layout.permute(dims)?);
        Ok(Tensor::recorded(
            out,
            GradOp::Permute(dims.to_vec()),
            &[self],
            vec![],
        ))
    }

    /// `len` entries of dimension `dim` from `start`, sharing storage. Its gradient
    /// goes back into its place, zeros around it (a weight's packed parts, the query,
    /// key and value of one projection).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let out = self.with_layout(self.layout.narrow(dim, start, len)?);
        let full = self.shape()[dim];
        Ok(Tensor::recorded(
            out,
            GradOp::Narrow { dim, start, full },
            &[self],
            vec![],
        ))
    }

    /// Size-1 dimensions repeated to `shape` without copying (stride 0).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        self.check_no_graph("expand")?;
        Ok(self.with_layout(self.layout.expand(shape)?))
    }

    /// The same elements under another shape, sharing storage; an error for a
    /// non-contiguous tensor (PyTorch's `view`).
    pub fn view(&self, shape: &[usize]) -> Result<Tensor> {
        let out = self.with_layout(self.layout.view(shape)?);
        Ok(Tensor::recorded(
            out,
            GradOp::Reshape(self.shape().to_vec()),
            &[self],
            vec![],
        ))
    }

    /// Like `view`, but copies a non-contiguous tensor first (PyTorch's `reshape`).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        self.contiguous()?.view(shape)
    }

    // ANCHOR: contiguous
    /// This tensor when it is already dense, else a dense copy made by the strided-copy
    /// kernel on the tensor's device.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = self.dense_copy()?;
        Ok(Tensor::recorded(out, GradOp::Identity, &[self], vec![]))
    }
    // ANCHOR_END: contiguous

    /// Writes `src`'s elements into this tensor or view, in place and unrecorded
    /// (PyTorch's `copy_` under `no_grad`). Shapes, dtypes and devices must agree (copy
    /// to another device with [`Tensor::to`] first), and the destination must not
    /// repeat elements (no stride 0 over more than one entry). A dense destination and
    /// source are one device-to-device copy; otherwise one strided-scatter launch from
    /// `src` made dense (a copy first only when it is a strided view itself): how a
    /// gradient is written into its part of a larger buffer (`narrow`'s backward).
    /// Refused on a tensor that requires grad while autograd records.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.check_not_recording("copy_")?;
        self.check_copy(src)?;
        if self.numel() == 0 {
            return Ok(());
        }
        if self.is_contiguous() && src.is_contiguous() {
            let device = self.device();
            return device.backend().copy_dtod(
                self.ptr(),
                src.ptr(),
                self.nbytes(),
                &device.current_stream()?,
            );
        }
        self.scatter_unchecked(src)
    }

    /// `copy_` by the strided-scatter kernel whatever the layouts, with no recording
    /// check: how autograd writes a gradient into its part of a larger buffer.
    pub(crate) fn scatter_(&self, src: &Tensor) -> Result<()> {
        self.check_copy(src)?;
        if self.numel() == 0 {
            return Ok(());
        }
        self.scatter_unchecked(src)
    }

    /// What `copy_` checks: the same shape, dtype and device, and a destination that
    /// does not repeat elements.
    fn check_copy(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() || src.dtype != self.dtype {
            return Err(Error::InvalidArgument(format!(
                "copy_: a {} tensor of shape {:?} cannot be written into a {} view of shape {:?}",
                src.dtype,
                src.shape(),
                self.dtype,
                self.shape()
            )));
        }
        self.check_same_device(src)?;
        let repeats = self
            .shape()
            .iter()
            .zip(self.strides())
            .any(|(&size, &stride)| size > 1 && stride == 0);
        if repeats {
            return Err(Error::InvalidArgument(format!(
                "copy_: the view (shape {:?}, strides {:?}) repeats elements, so writes would race",
                self.shape(),
                self.strides()
            )));
        }
        Ok(())
    }

    fn scatter_unchecked(&self, src: &Tensor) -> Result<()> {
        let src = src.detach().contiguous()?;
        self.device().launch(&Kernel::StridedScatter {
            width: self.dtype.size(),
            src: src.ptr(),
            dst: self.ptr(),
            layout: self.layout.strided()?.coalesced(),
            n: self.numel(),
        })
    }

    /// A dense copy of this (strided) tensor's elements, with no graph.
    fn dense_copy(&self) -> Result<Tensor> {
        let out = Tensor::empty(self.shape(), self.dtype, self.device())?;
        self.device().launch(&Kernel::StridedCopy {
            width: self.dtype.size(),
            src: self.ptr(),
            dst: out.ptr(),
            layout: self.layout.strided()?.coalesced(),
            n: self.numel(),
        })?;
        Ok(out)
    }

    /// Views autograd cannot differentiate yet refuse tensors that need a gradient
    /// rather than silently dropping it.
    fn check_no_graph(&self, op: &str) -> Result<()> {
        if self.requires_grad() && super::is_grad_enabled() {
            return Err(Error::InvalidArgument(format!(
                "{op}: no gradient is defined for this view yet; use it on detach() or under no_grad()"
            )));
        }
        Ok(())
    }
}
