//! Binary ops on float tensors of two different dtypes without casting first, as
//! PyTorch's TensorIterator computes them on CUDA: `x_f32 + y_bf16` (a Transformer's
//! residual stream plus the output of an autocast linear) runs one kernel that reads
//! `y` in bfloat16 and writes float32, where casting first would launch a cast and
//! allocate a float32 copy of `y` for the length of the op. The result has the bits of
//! casting first: each element is widened exactly, then the float32 op runs.
//!
//! The graph records one node whose inputs are the operands themselves, in their own
//! dtypes: an op that saves its operands (`mul`, `div`) saves them as they are (a
//! bfloat16 operand stays bfloat16, half the bytes of the cast), and the derivative
//! computes each gradient in float32, sums it back to its operand's shape and casts it
//! to its operand's dtype, as PyTorch's engine does for a mixed op (`validate_outputs`):
//! one cast in backward for each narrower operand that needs a gradient.

use super::broadcast::row_broadcast;
use super::graph::GradOp;
use super::promote::is_floating_point;
use super::{DType, Tensor};
use crate::error::Result;
use crate::kernels::{BinaryOp, Kernel, MixedBinary, MixedForm};

/// Whether `op(a, b)` into `dtype` runs as a mixed-dtype kernel: two different float
/// dtypes whose result is float32 (a zero-dimensional float32 operand of a half tensor
/// gives a half result instead, and is cast, one element, as before).
pub(super) fn reads_each_in_its_dtype(a: &Tensor, b: &Tensor, dtype: DType) -> bool {
    dtype == MixedBinary::OUT_DTYPE
        && a.dtype() != b.dtype()
        && is_floating_point(a.dtype())
        && is_floating_point(b.dtype())
}

impl Tensor {
    /// `op(self, other)` broadcast to `shape`, each operand read in its own float
    /// dtype, into float32 (see the module's documentation).
    pub(super) fn mixed_binary(
        &self,
        op: BinaryOp,
        other: &Tensor,
        shape: &[usize],
        alpha: f32,
    ) -> Result<Tensor> {
        let (a, b) = (self, other);
        let out = Tensor::empty(shape, MixedBinary::OUT_DTYPE, self.device())?;
        let dense = |t: &Tensor| t.is_contiguous() && t.shape() == shape;
        let form = if dense(a) && dense(b) {
            MixedForm::Dense
        } else if let Some((row_first, cols)) = row_broadcast(a, b, shape) {
            MixedForm::Rows { cols, row_first }
        } else {
            MixedForm::Strided {
                a_layout: a.broadcast_layout(shape)?,
                b_layout: b.broadcast_layout(shape)?,
            }
        };
        self.device().launch(&Kernel::MixedBinary(MixedBinary {
            op,
            a_dtype: a.dtype(),
            b_dtype: b.dtype(),
            a: a.ptr(),
            b: b.ptr(),
            out: out.ptr(),
            n: out.numel(),
            alpha,
            form,
        }))?;
        // What the derivative reads, as for one dtype (`broadcast_binary`).
        let saved = match op {
            BinaryOp::Mul | BinaryOp::Div | BinaryOp::Maximum | BinaryOp::Minimum => {
                vec![a.clone(), b.clone()]
            }
            BinaryOp::ThresholdBackward => vec![b.clone()],
            BinaryOp::Pow => vec![a.clone(), b.clone(), out.clone()],
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Axpy | BinaryOp::SquaredDifference => vec![],
        };
        let grad_op = GradOp::MixedBinary {
            op,
            a: a.shape().to_vec(),
            b: b.shape().to_vec(),
            dtypes: [a.dtype(), b.dtype()],
            needs: [a.requires_grad(), b.requires_grad()],
        };
        Ok(Tensor::recorded(out, grad_op, &[a, b], saved))
    }
}
