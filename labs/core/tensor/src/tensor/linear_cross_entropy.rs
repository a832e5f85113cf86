//! `linear_cross_entropy`: a classifier's linear layer and its mean cross-entropy in
//! one op that never holds the whole `[rows, classes]` logits (Liger-Kernel's and
//! llm.c's fused classifier). It walks the rows in chunks; for each chunk it computes
//! the logits, their float32 log-probabilities and the chunk's share of the loss, and
//! at once the gradient of the loss with respect to the chunk's logits, `softmax -
//! onehot` (zero on ignored rows), from which it computes the chunk's rows of the
//! input's gradient (`g @ W`) and adds `gᵀ @ x_chunk` into the weight's (and the rows
//! of `g` into the bias's). The node saves those gradients and the count of rows
//! counted; backward only scales them by `grad / count`.
//!
//! What it holds at a time is one chunk's logits, log-probabilities and their
//! gradients (`[chunk_rows, classes]` each) beside the gradients it saves (`[rows,
//! in]`, `[classes, in]`, `[classes]`), where `linear` then `cross_entropy` keep the
//! float32 log-probabilities of every row from forward to backward and make their
//! gradient of the same size in backward. The products of backward run in forward
//! instead, so the time is about the same.
//!
//! It is built from the ops of the unfused path: `linear` for each chunk's logits,
//! `log_softmax` to float32, the `nll_loss` kernels and `log_softmax`'s backward for
//! the logits' gradient, and GEMM launches that write the input's gradient in place
//! and accumulate the weight's and the bias's in float32 (`beta = 1`).

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::{is_grad_enabled, no_grad, GradOp};
use super::{DType, Tensor};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernels::{Gemm, Kernel, Operand, RowKernel, UnaryOp};

const OP: &str = "linear_cross_entropy";

/// The products run in the autocast region's dtype, as `linear`'s: `x`, the weight and
/// the bias are cast to it (the weight, a leaf, through the cast cache). The softmax and
/// the loss run in float32 whatever the region. PyTorch has no such op, so it is in
/// none of its lists (`cast_policy` does not name it); its parts are in theirs.
pub(super) const LINEAR_CROSS_ENTROPY: AutocastOp = AutocastOp {
    name: OP,
    policy: CastPolicy::LowerPrecision,
};

/// The shapes of one call: `x [rows, d]`, `weight [classes, d]`.
#[derive(Clone, Copy)]
struct Sizes {
    rows: usize,
    d: usize,
    classes: usize,
}

impl Tensor {
    /// PyTorch's `cross_entropy(x @ weightᵀ + bias, target, ignore_index=...,
    /// reduction='mean')` for `x [rows, in]`, `weight [classes, in]`, `bias [classes]`
    /// and int64 `target [rows]`: the mean over the rows whose target is not
    /// `ignore_index` (NaN when every row is), computed `chunk_rows` rows at a time
    /// without the whole logits (see the module's note). The loss is float32 under
    /// autocast and for float32 inputs, else in the inputs' dtype, as `cross_entropy`'s.
    ///
    /// It records one node; the gradients of `x`, the weight and the bias it hands
    /// backward are computed in forward, each in its input's dtype. With recording off or no input
    /// requiring grad it computes the loss alone and saves nothing.
    pub fn linear_cross_entropy(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        target: &Tensor,
        ignore_index: i64,
        chunk_rows: usize,
    ) -> Result<Tensor> {
        let sizes = self.check_linear_cross_entropy(weight, bias, target, chunk_rows)?;
        target.check_indices(OP, sizes.classes, Some(ignore_index))?;
        let inputs: Vec<&Tensor> = [Some(self), Some(weight), bias]
            .into_iter()
            .flatten()
            .collect();
        let recording = is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        let needs = [
            recording && self.requires_grad(),
            recording && weight.requires_grad(),
            recording && bias.is_some_and(Tensor::requires_grad),
        ];
        let region = super::autocast::autocast_dtype();
        // Cast while recording is as it is, so that a weight's cached cast is the one
        // every other op of the region gets.
        let cast = super::autocast_args(LINEAR_CROSS_ENTROPY.policy, &inputs)?;
        let (loss, saved) = {
            let _off = no_grad();
            let operands: Vec<Tensor> = match &cast {
                Some(args) => args.iter().map(Tensor::detach).collect(),
                None => inputs.iter().map(|t| t.detach()).collect(),
            };
            let chunks = Chunks {
                sizes,
                x: operands[0].contiguous()?,
                weight: operands[1].contiguous()?,
                bias: operands.get(2).cloned(),
                target: target.detach().contiguous()?,
                ignore_index,
                chunk_rows,
            };
            drop(cast);
            let grad_dtypes = [
                self.dtype(),
                weight.dtype(),
                bias.map_or(DType::F32, |b| b.dtype()),
            ];
            let (sum, count, grads) = chunks.run(needs, grad_dtypes)?;
            // 0 / 0 is NaN when every row is ignored, as PyTorch's mean.
            let loss = sum.div(&count)?;
            let loss = match region {
                Some(_) => loss,
                None => loss.to_dtype(chunks.x.dtype())?,
            };
            if !recording {
                return Ok(loss);
            }
            // Backward divides by the count; with none counted the gradients are zeros,
            // and stay so.
            let mut saved = vec![count.unary_with(UnaryOp::ClampMin, 1.0)?];
            saved.extend(grads.into_iter().flatten());
            (loss, saved)
        };
        Ok(Tensor::recorded(
            loss,
            GradOp::LinearCrossEntropy { needs },
            &inputs,
            saved,
        ))
    }

    /// The gradients of `linear_cross_entropy`'s inputs (x, weight, bias, those of
    /// them that exist) from the loss's gradient `g` and what forward saved: the count
    /// of rows counted, then the unscaled gradients of the inputs `needs` marks, each
    /// scaled by `g / count`. An input that needs none gets a placeholder the engine
    /// drops.
    pub(crate) fn linear_cross_entropy_backward(
        g: &Tensor,
        saved: &[Tensor],
        needs: [bool; 3],
    ) -> Result<Vec<Tensor>> {
        let missing = || Error::InvalidArgument(format!("{OP}: the graph saved too few tensors"));
        let count = saved.first().ok_or_else(missing)?;
        let factor = g.to_dtype(DType::F32)?.div(count)?;
        let mut grads = saved[1..].iter();
        needs
            .iter()
            .map(|&need| {
                if need {
                    grads.next().ok_or_else(missing)?.mul(&factor)
                } else {
                    Ok(g.clone())
                }
            })
            .collect()
    }

    /// The sizes of a call, or an error naming what does not fit.
    fn check_linear_cross_entropy(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        target: &Tensor,
        chunk_rows: usize,
    ) -> Result<Sizes> {
        self.check_float(OP)?;
        weight.check_float(OP)?;
        weight.check_same_device(self)?;
        target.check_same_device(self)?;
        if chunk_rows == 0 {
            return Err(Error::InvalidArgument(format!(
                "{OP}: chunk_rows must be at least 1"
            )));
        }
        let (&[rows, d], &[classes, wd]) = (self.shape(), weight.shape()) else {
            return Err(Error::InvalidArgument(format!(
                "{OP}: expected x [rows, in] and weight [classes, in], got {:?} and {:?}",
                self.shape(),
                weight.shape()
            )));
        };
        if wd != d {
            return Err(Error::Shape {
                op: "linear_cross_entropy (x [rows, in] vs weight [classes, in])",
                a: self.shape().to_vec(),
                b: weight.shape().to_vec(),
            });
        }
        if target.shape() != [rows] {
            return Err(Error::Shape {
                op: "linear_cross_entropy (x [rows, in] vs target [rows])",
                a: self.shape().to_vec(),
                b: target.shape().to_vec(),
            });
        }
        if let Some(b) = bias {
            b.check_same_device(self)?;
            if b.shape() != [classes] {
                return Err(Error::InvalidArgument(format!(
                    "{OP}: the bias must be [classes] = [{classes}], got {:?}",
                    b.shape()
                )));
            }
        }
        if rows == 0 || classes == 0 {
            return Err(Error::InvalidArgument(format!(
                "{OP}: no rows or no classes (x {:?}, weight {:?})",
                self.shape(),
                weight.shape()
            )));
        }
        Ok(Sizes { rows, d, classes })
    }
}

/// One call's operands, in the dtype the products run in, dense and detached.
struct Chunks {
    sizes: Sizes,
    x: Tensor,
    weight: Tensor,
    bias: Option<Tensor>,
    target: Tensor,
    ignore_index: i64,
    chunk_rows: usize,
}

/// The float32 sum of the losses of the rows counted, their count, and the gradients
/// asked for.
type Sums = (Tensor, Tensor, [Option<Tensor>; 3]);

impl Chunks {
    /// Walks the rows chunk by chunk: the loss's sum and count, and for the inputs
    /// `needs` marks their unscaled gradients, in `dtypes` (x's, the weight's, the
    /// bias's).
    fn run(&self, needs: [bool; 3], dtypes: [DType; 3]) -> Result<Sums> {
        let Sizes { rows, d, classes } = self.sizes;
        let device = self.x.device();
        let compute = self.x.dtype();
        let chunk = self.chunk_rows.min(rows);
        // The input's gradient straight from its product: in x's dtype when the GEMM
        // writes it (the compute dtype or float32), else float32 cast at the end.
        let gx_dtype = if dtypes[0] == compute {
            compute
        } else {
            DType::F32
        };
        let gx = needs[0]
            .then(|| Tensor::empty(&[rows, d], gx_dtype, device))
            .transpose()?;
        // The weight's and the bias's sums over the chunks, in float32.
        let gw = needs[1]
            .then(|| Tensor::empty(&[classes, d], DType::F32, device))
            .transpose()?;
        let gb = needs[2]
            .then(|| Tensor::empty(&[classes], DType::F32, device))
            .transpose()?;
        let ones = needs[2].then(|| ones(chunk, compute, device)).transpose()?;
        // The logits' gradient of the sum of the losses: -1 at each counted row's target.
        let one = Tensor::full(&[], 1.0f32, device)?;
        let zero = Tensor::zeros(&[], DType::F32, device)?;
        let (mut sum, mut count) = (zero.clone(), zero.clone());
        // ANCHOR: chunks
        for (i, start) in (0..rows).step_by(chunk).enumerate() {
            let len = chunk.min(rows - start);
            let x = self.x.narrow(0, start, len)?;
            let target = self.target.narrow(0, start, len)?;
            let logp = x
                .linear(&self.weight, self.bias.as_ref())?
                .log_softmax_dtype(1, DType::F32)?;
            let (mean, counted) = self.nll_loss_parts(&logp, &target)?;
            // A chunk of ignored rows has a NaN mean and adds nothing.
            let some = counted.gt(&zero)?;
            sum = sum.add(&Tensor::where_(&some, &mean.mul(&counted)?, &zero)?)?;
            count = count.add(&counted)?;
            if !needs.contains(&true) {
                continue;
            }
            let dlogp = Tensor::nll_loss_backward(&one, &target, &one, classes, self.ignore_index)?;
            let g = Tensor::softmax_backward(&logp, &dlogp, 1, true, compute)?;
            drop((logp, dlogp));
            // ANCHOR_END: chunks
            let beta = if i == 0 { 0.0 } else { 1.0 };
            if let Some(gx) = &gx {
                // gx[start..start + len] = g @ W.
                self.gemm(
                    [len, d, classes],
                    Operand::dense(g.ptr(), len, classes),
                    Operand::dense(self.weight.ptr(), classes, d),
                    (gx.narrow(0, start, len)?.ptr(), gx_dtype, d),
                    0.0,
                )?;
            }
            if let Some(gw) = &gw {
                // gw += gᵀ @ x.
                self.gemm(
                    [classes, d, len],
                    Operand {
                        transposed: true,
                        ..Operand::dense(g.ptr(), len, classes)
                    },
                    Operand::dense(x.ptr(), len, d),
                    (gw.ptr(), DType::F32, d),
                    beta,
                )?;
            }
            if let (Some(gb), Some(ones)) = (&gb, &ones) {
                // gb += the sum of g's rows: ones[1, len] @ g.
                self.gemm(
                    [1, classes, len],
                    Operand::dense(ones.ptr(), 1, len),
                    Operand::dense(g.ptr(), len, classes),
                    (gb.ptr(), DType::F32, classes),
                    beta,
                )?;
            }
        }
        let in_dtype = |t: Option<Tensor>, dtype: DType| -> Result<Option<Tensor>> {
            t.map(|t| t.to_dtype(dtype)).transpose()
        };
        Ok((
            sum,
            count,
            [
                in_dtype(gx, dtypes[0])?,
                in_dtype(gw, dtypes[1])?,
                in_dtype(gb, dtypes[2])?,
            ],
        ))
    }

    /// `out = op(a) @ op(b) + beta * out` for `[m, n, k]`, `out` given as its address,
    /// dtype and leading dimension; inputs in the compute dtype, products accumulated in
    /// float32.
    fn gemm(
        &self,
        [m, n, k]: [usize; 3],
        a: Operand,
        b: Operand,
        (c, c_dtype, ldc): (u64, DType, usize),
        beta: f32,
    ) -> Result<()> {
        self.x.device().launch(&Kernel::Gemm(Gemm {
            dtype: self.x.dtype(),
            m,
            n,
            k,
            batch: 1,
            a,
            b,
            c,
            c_dtype,
            ldc,
            stride_c: m * ldc,
            alpha: 1.0,
            beta,
            allow_tf32: false,
            bias: None,
        }))
    }

    /// The `nll_loss` kernel over one chunk's float32 log-probabilities: the mean over
    /// the rows counted (NaN when none is) and their count, both float32 `[]`.
    fn nll_loss_parts(&self, logp: &Tensor, target: &Tensor) -> Result<(Tensor, Tensor)> {
        let device = logp.device();
        let mean = Tensor::empty(&[], DType::F32, device)?;
        let count = Tensor::empty(&[], DType::F32, device)?;
        device.launch(&Kernel::Rows(RowKernel::NllLoss {
            dtype: DType::F32,
            logp: logp.ptr(),
            target: target.ptr(),
            out: mean.ptr(),
            count: count.ptr(),
            rows: target.numel(),
            cols: self.sizes.classes,
            ignore_index: self.ignore_index,
        }))?;
        Ok((mean, count))
    }
}

/// `n` ones of `dtype` (the bias's gradient as a product).
fn ones(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    match dtype {
        DType::F16 => Tensor::full(&[n], half::f16::ONE, device),
        DType::BF16 => Tensor::full(&[n], half::bf16::ONE, device),
        _ => Tensor::full(&[n], 1.0f32, device),
    }
}
