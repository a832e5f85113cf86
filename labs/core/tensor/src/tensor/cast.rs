//! Casts between dtypes (PyTorch's `tensor.to(dtype)`): one kernel per pair of dtypes,
//! `cast_{from}_{to}` (see `kernels/cast.cu` for the conversions).

use super::graph::GradOp;
use super::promote::is_floating_point;
use super::{DType, Tensor};
use crate::error::Result;
use crate::kernels::Kernel;

impl Tensor {
    /// This tensor as `dtype`: itself (no copy) when it already is, else a new dense
    /// tensor. Float to integer truncates toward zero; to uint8 a negative value wraps
    /// (-1.0 becomes 255, as in PyTorch); float32 to float16 or bfloat16 rounds to
    /// nearest even. A cast between float types passes gradients (cast back); a cast to
    /// or from an integer type ends the graph, as integers carry no gradient.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        // A transposed or permuted view of dense memory keeps its strides (PyTorch's
        // `preserve_format`): the memory is cast as it lies, with no copy to make it
        // row-major first, and a GEMM takes the result as the same transposed operand.
        let order = self.layout.dense_order();
        let inverse = order.as_ref().map(|order| {
            let mut inverse = vec![0; order.len()];
            for (i, &d) in order.iter().enumerate() {
                inverse[d] = i;
            }
            inverse
        });
        let x = match &order {
            Some(order) => self.detach().permute(order)?,
            None => self.detach().contiguous()?,
        };
        let dense = Tensor::empty(x.shape(), dtype, self.device())?;
        self.device().launch(&Kernel::Cast {
            from: self.dtype(),
            to: dtype,
            x: x.ptr(),
            out: dense.ptr(),
            n: self.numel(),
        })?;
        let out = match inverse {
            Some(inverse) => dense.permute(&inverse)?,
            None => dense,
        };
        if is_floating_point(self.dtype()) && is_floating_point(dtype) {
            Ok(Tensor::recorded(
                out,
                GradOp::Cast { from: self.dtype() },
                &[self],
                vec![],
            ))
        } else {
            Ok(out)
        }
    }
}
