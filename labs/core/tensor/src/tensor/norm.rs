//! `layer_norm` over the trailing dimensions: one warp per row computes the row's mean
//! and `rstd = 1 / sqrt(var + eps)` (saved in float32 for backward, as PyTorch saves
//! them) and writes the normalised, scaled and shifted row.

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::GradOp;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::rows::layer_norm_chunks;
use crate::kernels::{Kernel, RowKernel};

/// `layer_norm` runs in float32 under autocast (PyTorch's `fp32` list).
pub(super) const LAYER_NORM: AutocastOp = AutocastOp {
    name: "layer_norm",
    policy: CastPolicy::Fp32,
};

impl Tensor {
    /// PyTorch's `layer_norm(x, normalized_shape, weight, bias, eps)`: each group of the
    /// trailing `normalized_shape` elements normalised to mean 0 and variance 1 (biased),
    /// then times `weight` and plus `bias` (each of `normalized_shape`, optional).
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f32,
    ) -> Result<Tensor> {
        const OP: &str = "layer_norm";
        let inputs: Vec<&Tensor> = [Some(self), weight, bias].into_iter().flatten().collect();
        if let Some(args) = super::autocast_args(LAYER_NORM.policy, &inputs)? {
            let mut rest = args[1..].iter();
            let w = weight.and_then(|_| rest.next());
            let b = bias.and_then(|_| rest.next());
            return args[0].layer_norm(normalized_shape, w, b, eps);
        }
        self.check_float(OP)?;
        let rank = self.shape().len();
        if normalized_shape.len() > rank
            || self.shape()[rank - normalized_shape.len()..] != *normalized_shape
        {
            return Err(Error::Shape {
                op: "layer_norm (input vs normalized_shape)",
                a: self.shape().to_vec(),
                b: normalized_shape.to_vec(),
            });
        }
        for p in weight.iter().chain(bias.iter()) {
            p.check_same_device(self)?;
            if p.dtype != self.dtype {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    a: self.dtype,
                    b: p.dtype,
                });
            }
            if p.shape() != normalized_shape {
                return Err(Error::Shape {
                    op: "layer_norm (weight or bias vs normalized_shape)",
                    a: p.shape().to_vec(),
                    b: normalized_shape.to_vec(),
                });
            }
        }
        let cols: usize = normalized_shape.iter().product();
        let rows = self.numel().checked_div(cols).unwrap_or(0);
        let x = self.detach().contiguous()?;
        let w = weight.map(|w| w.detach().contiguous()).transpose()?;
        let b = bias.map(|b| b.detach().contiguous()).transpose()?;
        let out = Tensor::empty(self.shape(), self.dtype, self.device())?;
        let mean = Tensor::empty(&[rows], DType::F32, self.device())?;
        let rstd = Tensor::empty(&[rows], DType::F32, self.device())?;
        self.device().launch(&Kernel::Rows(RowKernel::LayerNorm {
            dtype: self.dtype,
            x: x.ptr(),
            weight: w.as_ref().map(Tensor::ptr),
            bias: b.as_ref().map(Tensor::ptr),
            out: out.ptr(),
            mean: mean.ptr(),
            rstd: rstd.ptr(),
            rows,
            cols,
            eps,
        }))?;
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let mut saved = vec![x, mean, rstd];
        saved.extend(w);
        Ok(Tensor::recorded(
            out,
            GradOp::LayerNorm {
                normalized_shape: normalized_shape.to_vec(),
                has_weight: weight.is_some(),
                has_bias: bias.is_some(),
            },
            &inputs,
            saved,
        ))
    }

    /// The gradients of `layer_norm`'s inputs (x, then the weight and the bias when
    /// given) from what it saved and the output's gradient `g`.
    pub(crate) fn layer_norm_backward(
        g: &Tensor,
        saved: [&Tensor; 3],
        weight: Option<&Tensor>,
        normalized_shape: &[usize],
        has_bias: bool,
    ) -> Result<Vec<Tensor>> {
        let [x, mean, rstd] = saved;
        g.check_binary_dtype(x, "layer_norm_backward")?;
        let g = g.contiguous()?;
        let cols: usize = normalized_shape.iter().product();
        let rows = mean.numel();
        let device = x.device();
        let dx = Tensor::empty(x.shape(), x.dtype, device)?;
        device.launch(&Kernel::Rows(RowKernel::LayerNormBackward {
            dtype: x.dtype,
            x: x.ptr(),
            weight: weight.map(Tensor::ptr),
            grad: g.ptr(),
            mean: mean.ptr(),
            rstd: rstd.ptr(),
            out: dx.ptr(),
            rows,
            cols,
        }))?;
        let dw = weight
            .map(|_| Tensor::empty(normalized_shape, x.dtype, device))
            .transpose()?;
        let db = has_bias
            .then(|| Tensor::empty(normalized_shape, x.dtype, device))
            .transpose()?;
        if dw.is_some() || db.is_some() {
            // Two deterministic passes: partial sums over spans of rows, then per column.
            let chunks = layer_norm_chunks(rows);
            let partial = Tensor::empty(&[2, chunks, cols], DType::F32, device)?;
            device.launch(&Kernel::Rows(RowKernel::LayerNormParamGrads {
                dtype: x.dtype,
                x: x.ptr(),
                grad: g.ptr(),
                mean: mean.ptr(),
                rstd: rstd.ptr(),
                partial: partial.ptr(),
                rows,
                cols,
                chunks,
            }))?;
            device.launch(&Kernel::Rows(RowKernel::LayerNormParamFinish {
                dtype: x.dtype,
                partial: partial.ptr(),
                dweight: dw.as_ref().map(Tensor::ptr),
                dbias: db.as_ref().map(Tensor::ptr),
                cols,
                chunks,
            }))?;
        }
        let mut grads = vec![dx];
        grads.extend(dw);
        grads.extend(db);
        Ok(grads)
    }
}
