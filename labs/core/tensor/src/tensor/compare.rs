//! Comparisons, `where` and `masked_fill`. A comparison gives a uint8 mask of 0 and 1:
//! the labs' stand-in for PyTorch's bool tensors (which are one byte of 0 or 1 too).
//! Operands broadcast and promote as for arithmetic; masks carry no gradient, and
//! `where` passes the gradient to the side each element was taken from.

use super::broadcast::broadcast_shapes;
use super::graph::GradOp;
use super::promote::{result_type, Scalar};
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{CompareOp, Kernel};

impl Tensor {
    /// `op(self, other)` elementwise as a uint8 mask (1 where it holds), broadcast, in
    /// the promoted dtype. A NaN compares unequal to everything.
    pub fn compare(&self, op: CompareOp, other: &Tensor) -> Result<Tensor> {
        self.check_same_device(other)?;
        let dtype = result_type(&[self, other], &[]);
        let a = self.detach().to_dtype(dtype)?;
        let b = other.detach().to_dtype(dtype)?;
        let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
        let out = Tensor::empty(&shape, DType::U8, self.device())?;
        self.device().launch(&Kernel::Compare {
            op,
            dtype,
            a: a.ptr(),
            a_layout: a.broadcast_layout(&shape)?,
            b: b.ptr(),
            b_layout: b.broadcast_layout(&shape)?,
            out: out.ptr(),
            n: out.numel(),
        })?;
        Ok(out)
    }

    /// `op(self, scalar)` as a uint8 mask, with a scalar's promotion.
    pub fn compare_scalar(&self, op: CompareOp, scalar: impl Into<Scalar>) -> Result<Tensor> {
        let scalar = scalar.into();
        let dtype = result_type(&[self], &[scalar]);
        let s = Tensor::scalar_tensor(scalar, dtype, self.device())?;
        self.detach().to_dtype(dtype)?.compare(op, &s)
    }

    /// `self == other` as a uint8 mask.
    pub fn eq(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(CompareOp::Eq, other)
    }
    /// `self != other` as a uint8 mask.
    pub fn ne(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(CompareOp::Ne, other)
    }
    /// `self < other` as a uint8 mask.
    pub fn lt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(CompareOp::Lt, other)
    }
    /// `self <= other` as a uint8 mask.
    pub fn le(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(CompareOp::Le, other)
    }
    /// `self > other` as a uint8 mask.
    pub fn gt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(CompareOp::Gt, other)
    }
    /// `self >= other` as a uint8 mask.
    pub fn ge(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(CompareOp::Ge, other)
    }

    /// `cond ? a : b` elementwise (`torch.where(cond, a, b)`): `cond` is a uint8 mask,
    /// all three broadcast together, `a` and `b` promote. The gradient goes to `a`
    /// where `cond` holds and to `b` elsewhere.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        cond.check_same_device(a)?;
        a.check_same_device(b)?;
        if cond.dtype() != DType::U8 {
            return Err(Error::DType {
                op: "where (condition)",
                found: cond.dtype(),
                supported: "uint8 (the labs' bool)",
            });
        }
        let dtype = result_type(&[a, b], &[]);
        let (a, b) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
        let shape = broadcast_shapes("where", cond.shape(), a.shape())?;
        let shape = broadcast_shapes("where", &shape, b.shape())?;
        let out = Tensor::empty(&shape, dtype, a.device())?;
        a.device().launch(&Kernel::Where {
            dtype,
            cond: cond.ptr(),
            cond_layout: cond.broadcast_layout(&shape)?,
            a: a.ptr(),
            a_layout: a.broadcast_layout(&shape)?,
            b: b.ptr(),
            b_layout: b.broadcast_layout(&shape)?,
            out: out.ptr(),
            n: out.numel(),
        })?;
        let op = GradOp::Where {
            a: a.shape().to_vec(),
            b: b.shape().to_vec(),
            needs: [a.requires_grad(), b.requires_grad()],
        };
        Ok(Tensor::recorded(out, op, &[&a, &b], vec![cond.detach()]))
    }

    /// `value` where `mask` is 1, this tensor's element elsewhere (`masked_fill`): the
    /// mask broadcasts to this tensor's shape, the value is cast to its dtype, and the
    /// gradient flows to the elements kept.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let fill = Tensor::scalar_tensor(value.into(), self.dtype(), self.device())?;
        let shape = broadcast_shapes("masked_fill", self.shape(), mask.shape())?;
        if shape != self.shape() {
            return Err(Error::Shape {
                op: "masked_fill (the mask must broadcast to the tensor)",
                a: self.shape().to_vec(),
                b: mask.shape().to_vec(),
            });
        }
        Tensor::where_(mask, &fill, self)
    }
}
