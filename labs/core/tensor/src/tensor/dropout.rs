//! `dropout` with a counter-based generator: element `i` is kept or dropped by the
//! Philox4x32-10 block of counter `offset + i` under the device generator's seed, so
//! the GPU kernel and the CPU twin draw the same mask bit for bit, and the generator's
//! offset then advances past the elements used (PyTorch's `philox_seed_offset`).

use super::graph::GradOp;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{Kernel, RowKernel};

impl Tensor {
    /// PyTorch's `dropout(x, p, training)`: each element zeroed with probability `p`,
    /// the others scaled by `1 / (1 - p)`. Not training, or `p = 0`, returns the input
    /// itself; `p = 1` gives zeros. The mask is saved for backward, one byte per element
    /// (like PyTorch's bool mask).
    pub fn dropout(&self, p: f32, training: bool) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::InvalidArgument(format!(
                "dropout probability has to be between 0 and 1, but got {p}"
            )));
        }
        self.check_float("dropout")?;
        if !training || p == 0.0 {
            return Ok(self.clone());
        }
        let keep = 1.0 - p;
        let scale = if p == 1.0 { 0.0 } else { 1.0 / keep };
        let x = self.detach().contiguous()?;
        let n = x.numel();
        let (seed, offset) = self.device().philox_seed_offset(n as u64);
        let out = Tensor::empty(self.shape(), self.dtype, self.device())?;
        let mask = Tensor::empty(self.shape(), DType::U8, self.device())?;
        self.device().launch(&Kernel::Rows(RowKernel::Dropout {
            dtype: self.dtype,
            x: x.ptr(),
            out: out.ptr(),
            mask: mask.ptr(),
            n,
            keep,
            scale,
            seed,
            offset,
        }))?;
        Ok(Tensor::recorded(
            out,
            GradOp::Dropout { scale },
            &[self],
            vec![mask],
        ))
    }

    /// `g * mask * scale`: dropout's backward.
    pub(crate) fn dropout_backward(g: &Tensor, mask: &Tensor, scale: f32) -> Result<Tensor> {
        if g.shape() != mask.shape() {
            return Err(Error::Shape {
                op: "dropout_backward",
                a: g.shape().to_vec(),
                b: mask.shape().to_vec(),
            });
        }
        let g = g.contiguous()?;
        let out = Tensor::empty(g.shape(), g.dtype, g.device())?;
        g.device().launch(&Kernel::Rows(RowKernel::MaskedScale {
            dtype: g.dtype,
            x: g.ptr(),
            mask: mask.ptr(),
            out: out.ptr(),
            n: g.numel(),
            scale,
        }))?;
        Ok(out)
    }
}
