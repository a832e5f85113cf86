//! Losses with PyTorch's mean reduction: `nll_loss` (one warp gathers each row's
//! log-probability at its target and averages over the rows not ignored),
//! `cross_entropy` (`log_softmax` then `nll_loss`, so its gradient is
//! `(softmax - onehot) / count`, zero on ignored rows), and `mse_loss`.

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::{no_grad, GradOp};
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{BinaryOp, Kernel, RowKernel};

/// PyTorch's default `ignore_index`.
pub const IGNORE_INDEX: i64 = -100;

/// The losses run in float32 under autocast (PyTorch's `fp32` list).
pub(super) const NLL_LOSS: AutocastOp = AutocastOp {
    name: "nll_loss",
    policy: CastPolicy::Fp32,
};
pub(super) const MSE_LOSS: AutocastOp = AutocastOp {
    name: "mse_loss",
    policy: CastPolicy::Fp32,
};

impl Tensor {
    /// PyTorch's `nll_loss(logp, target, ignore_index=..., reduction='mean')` for
    /// log-probabilities `[N, C]` and int64 targets `[N]`: the mean of `-logp[n,
    /// target[n]]` over the rows whose target is not `ignore_index` (NaN when all are).
    pub fn nll_loss(&self, target: &Tensor, ignore_index: i64) -> Result<Tensor> {
        const OP: &str = "nll_loss";
        if let Some(args) = super::autocast_args(NLL_LOSS.policy, &[self])? {
            return args[0].nll_loss(target, ignore_index);
        }
        self.check_float(OP)?;
        target.check_same_device(self)?;
        let &[rows, cols] = self.shape() else {
            return Err(Error::InvalidArgument(format!(
                "nll_loss: expected 2-D input [N, C], got shape {:?}",
                self.shape()
            )));
        };
        if target.shape() != [rows] {
            return Err(Error::Shape {
                op: "nll_loss (input [N, C] vs target [N])",
                a: self.shape().to_vec(),
                b: target.shape().to_vec(),
            });
        }
        if rows == 0 {
            return Err(Error::InvalidArgument(
                "nll_loss: the batch is empty (the mean of nothing)".into(),
            ));
        }
        target.check_indices(OP, cols, Some(ignore_index))?;
        let logp = self.detach().contiguous()?;
        let target = target.detach().contiguous()?;
        let out = Tensor::empty(&[], self.dtype, self.device())?;
        let count = Tensor::empty(&[1], DType::F32, self.device())?;
        self.device().launch(&Kernel::Rows(RowKernel::NllLoss {
            dtype: self.dtype,
            logp: logp.ptr(),
            target: target.ptr(),
            out: out.ptr(),
            count: count.ptr(),
            rows,
            cols,
            ignore_index,
        }))?;
        Ok(Tensor::recorded(
            out,
            GradOp::NllLoss {
                ignore_index,
                classes: cols,
            },
            &[self],
            vec![target, count],
        ))
    }

    /// PyTorch's `cross_entropy(logits, target, ignore_index=..., reduction='mean')`
    /// for logits `[N, C]` and int64 targets `[N]`, or logits `[N, C, d1, ...]` and
    /// targets `[N, d1, ...]` (each position a row, the mean over all of them).
    pub fn cross_entropy(&self, target: &Tensor, ignore_index: i64) -> Result<Tensor> {
        let rank = self.shape().len();
        if rank < 2 {
            return Err(Error::InvalidArgument(format!(
                "cross_entropy: expected logits [N, C] or [N, C, d1, ...], got shape {:?}",
                self.shape()
            )));
        }
        if rank == 2 {
            return self.log_softmax(1)?.nll_loss(target, ignore_index);
        }
        let classes = self.shape()[1];
        let mut positions = self.shape().to_vec();
        positions.remove(1);
        if target.shape() != positions {
            return Err(Error::Shape {
                op: "cross_entropy (logits [N, C, d1, ...] vs target [N, d1, ...])",
                a: self.shape().to_vec(),
                b: target.shape().to_vec(),
            });
        }
        // The classes last, one row per position.
        let order: Vec<usize> = (0..rank).filter(|&d| d != 1).chain([1]).collect();
        let rows = target.numel();
        let logits = self.permute(&order)?.reshape(&[rows, classes])?;
        logits
            .log_softmax(1)?
            .nll_loss(&target.reshape(&[rows])?, ignore_index)
    }

    /// PyTorch's `mse_loss(input, target)` with mean reduction: `mean((input -
    /// target)^2)`, differentiable in both.
    ///
    /// One op, as PyTorch's: it saves only its two operands, which are alive anyway (the
    /// model's output and the target), and its backward writes the input's gradient in
    /// one pass. Composed of `sub`, `mul` and `mean`, the difference would be saved (an
    /// activation-sized block until backward) and backward would make two more.
    /// Operands of different shapes (broadcast, which PyTorch warns about) or dtypes
    /// take that composition.
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(MSE_LOSS.policy, &[self, target])? {
            return args[0].mse_loss(&args[1]);
        }
        target.check_same_device(self)?;
        let fused = self.shape() == target.shape()
            && self.dtype() == target.dtype()
            && self.check_float("mse_loss").is_ok()
            && self.numel() > 0;
        if !fused {
            let d = self.sub(target)?;
            return d.mul(&d)?.mean_all();
        }
        let loss = {
            let _off = no_grad();
            self.binary(BinaryOp::SquaredDifference, target)?
                .mean_all()?
        };
        Ok(Tensor::recorded(
            loss,
            GradOp::MseLoss {
                target_needs_grad: target.requires_grad(),
            },
            &[self, target],
            vec![self.clone(), target.clone()],
        ))
    }

    /// The input's gradient of `mse_loss` from the output's gradient `g` (a scalar) and
    /// the saved input and target: `2 / n * (x - y) * g`, one kernel.
    pub(crate) fn mse_loss_backward(g: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let (x, y, g) = (x.contiguous()?, y.contiguous()?, g.contiguous()?);
        let n = x.numel();
        let dx = Tensor::empty(x.shape(), x.dtype(), x.device())?;
        x.device()
            .launch(&Kernel::Rows(RowKernel::MseLossBackward {
                dtype: x.dtype(),
                grad: g.ptr(),
                x: x.ptr(),
                y: y.ptr(),
                out: dx.ptr(),
                n,
                scale: 2.0 / n as f32,
            }))?;
        Ok(dx)
    }

    /// The input's gradient of `nll_loss` from the output's gradient `g` (a scalar).
    pub(crate) fn nll_loss_backward(
        g: &Tensor,
        target: &Tensor,
        count: &Tensor,
        classes: usize,
        ignore_index: i64,
    ) -> Result<Tensor> {
        let rows = target.numel();
        let g = g.contiguous()?;
        let dx = Tensor::empty(&[rows, classes], g.dtype, g.device())?;
        g.device()
            .launch(&Kernel::Rows(RowKernel::NllLossBackward {
                dtype: g.dtype,
                grad: g.ptr(),
                count: count.ptr(),
                target: target.ptr(),
                out: dx.ptr(),
                rows,
                cols: classes,
                ignore_index,
            }))?;
        Ok(dx)
    }
}
