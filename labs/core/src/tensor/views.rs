//! Views: new layouts over the same storage, and `contiguous`, the one copy that turns
//! a view back into dense memory. A view allocates nothing; writes through one are
//! seen by every tensor sharing the storage, as in PyTorch.

use super::Tensor;
use crate::error::Result;
use crate::kernels::Kernel;

impl Tensor {
    /// Dimensions `a` and `b` swapped, sharing storage (PyTorch's `transpose`).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.transpose(a, b)?))
    }

    /// `len` entries of dimension `dim` from `start`, sharing storage.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.narrow(dim, start, len)?))
    }

    /// Size-1 dimensions repeated to `shape` without copying (stride 0).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.expand(shape)?))
    }

    /// The same elements under another shape, sharing storage; an error for a
    /// non-contiguous tensor (PyTorch's `view`).
    pub fn view(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.view(shape)?))
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
        let out = Tensor::empty(self.shape(), self.dtype, self.device())?;
        self.device().launch(&Kernel::StridedCopy {
            width: self.dtype.size(),
            src: self.ptr(),
            dst: out.ptr(),
            layout: self.layout.strided()?,
            n: self.numel(),
        })?;
        Ok(out)
    }
    // ANCHOR_END: contiguous
}
