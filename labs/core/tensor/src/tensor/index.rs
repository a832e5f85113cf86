//! Row lookups by int64 indices: `embedding` (rows of a `[V, D]` weight) and
//! `index_select`, built on it. Backward accumulates the output's rows into a dense
//! `[V, D]` gradient: atomic float adds on the GPU, in order in the CPU twin.
//!
//! An index outside `[0, V)` is an error on `sim` and `cpu`, which read the indices
//! before launching. On `cuda` reading them would stall the stream, so the kernel
//! checks instead: an out-of-range index gives a row of zeros and no gradient (where
//! PyTorch stops the device with an assertion), never an illegal access.

use super::graph::GradOp;
use super::softmax::{dim_last_order, inverse};
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{Kernel, RowKernel};

impl Tensor {
    /// Fails unless this is an int64 tensor whose values lie in `[0, len)` (checked on
    /// the host, for the devices where reading is cheap: see the module's note).
    pub(crate) fn check_indices(
        &self,
        op: &'static str,
        len: usize,
        ignore: Option<i64>,
    ) -> Result<()> {
        if self.dtype != DType::I64 {
            return Err(Error::DType {
                op,
                found: self.dtype,
                supported: "int64 (indices)",
            });
        }
        // A dry run has no values to check: like the GPU, it checks nothing here (and so
        // makes the same allocations). Nor does a capture, whose values the host cannot
        // wait for.
        if self.device().is_cuda() || self.device().is_dry() || self.device().is_capturing()? {
            return Ok(());
        }
        let values = self.to_vec::<i64>()?;
        if let Some(&bad) = values
            .iter()
            .find(|&&v| Some(v) != ignore && !(0..len as i64).contains(&v))
        {
            return Err(Error::InvalidArgument(format!(
                "{op}: index {bad} is out of bounds for size {len}"
            )));
        }
        Ok(())
    }

    /// PyTorch's `embedding(indices, weight)`: for int64 `indices` of any shape, the rows
    /// of the `[V, D]` `weight` they name, shaped `[*indices.shape, D]`.
    pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        weight.check_float(OP)?;
        indices.check_same_device(weight)?;
        let &[vocab, dim] = weight.shape() else {
            return Err(Error::InvalidArgument(format!(
                "embedding: the weight must be 2-D [V, D], got shape {:?}",
                weight.shape()
            )));
        };
        indices.check_indices(OP, vocab, None)?;
        let idx = indices.detach().contiguous()?;
        let w = weight.detach().contiguous()?;
        let mut shape = indices.shape().to_vec();
        shape.push(dim);
        let out = Tensor::empty(&shape, weight.dtype, weight.device())?;
        weight.device().launch(&Kernel::Rows(RowKernel::Embedding {
            dtype: weight.dtype,
            weight: w.ptr(),
            indices: idx.ptr(),
            out: out.ptr(),
            n: idx.numel(),
            dim,
            vocab,
        }))?;
        Ok(Tensor::recorded(
            out,
            GradOp::Embedding { vocab },
            &[weight],
            vec![idx],
        ))
    }

    /// The weight's gradient of `embedding`: each row of `g` added into the row its
    /// index names, in float32, then rounded once to `g`'s dtype.
    pub(crate) fn embedding_backward(g: &Tensor, indices: &Tensor, vocab: usize) -> Result<Tensor> {
        let dim = *g.shape().last().unwrap_or(&0);
        let g = g.contiguous()?;
        let device = g.device();
        let acc = Tensor::zeros(&[vocab, dim], DType::F32, device)?;
        device.launch(&Kernel::Rows(RowKernel::EmbeddingBackward {
            dtype: g.dtype,
            grad: g.ptr(),
            indices: indices.ptr(),
            out: acc.ptr(),
            n: indices.numel(),
            dim,
            vocab,
        }))?;
        if g.dtype == DType::F32 {
            return Ok(acc);
        }
        let out = Tensor::empty(&[vocab, dim], g.dtype, device)?;
        device.launch(&Kernel::Rows(RowKernel::NarrowF32 {
            dtype: g.dtype,
            x: acc.ptr(),
            out: out.ptr(),
            n: vocab * dim,
        }))?;
        Ok(out)
    }

    /// PyTorch's `index_select(dim, index)`: the entries of `dim` named by the 1-D int64
    /// `index`, in its order (an embedding over `dim` moved first; differentiable).
    pub fn index_select(&self, dim: usize, index: &Tensor) -> Result<Tensor> {
        self.layout.check_dim("index_select", dim)?;
        if index.shape().len() != 1 {
            return Err(Error::InvalidArgument(format!(
                "index_select: the index must be 1-D, got shape {:?}",
                index.shape()
            )));
        }
        // `dim` first: dim_last_order's mirror image.
        let rank = self.shape().len();
        let mut order = dim_last_order(rank, dim);
        order.rotate_right(1);
        let moved = self.permute(&order)?;
        let size = self.shape()[dim];
        let rest = self.numel().checked_div(size).unwrap_or(0);
        let table = moved.reshape(&[size, rest])?;
        let rows = Tensor::embedding(index, &table)?;
        let mut shape: Vec<usize> = order.iter().map(|&d| self.shape()[d]).collect();
        shape[0] = index.numel();
        rows.view(&shape)?.permute(&inverse(&order))?.contiguous()
    }
}
