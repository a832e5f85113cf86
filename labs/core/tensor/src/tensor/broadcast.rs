//! Binary ops with PyTorch's broadcasting and type promotion. Shapes are aligned from
//! the right and a size-1 dimension stretches to the other operand's size; operands
//! are cast to the promoted dtype (`torch.result_type`), then one kernel runs, except
//! two float operands of different dtypes, which one kernel reads each in its own
//! dtype (`mixed.rs`). A
//! broadcast operand is never materialised: the strided kernel reads it through a
//! layout whose stretched dimensions have stride 0. When both operands are already
//! dense and of the output's shape, the dense (vectorised) kernel runs instead, and
//! when one is dense and the other a dense block of its trailing dimensions repeated
//! over the leading ones (`[rows, n] + [n]`, a bias), a dense kernel that reads the
//! block at `i % n`.

use super::graph::GradOp;
use super::promote::{is_floating_point, result_type, Scalar};
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{BinaryOp, Kernel, Strided, UnaryOp};

/// The shape `a` and `b` broadcast to (`torch.broadcast_shapes`), or an
/// [`Error::Shape`] naming both.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], d: usize| {
        let lead = rank - s.len();
        if d < lead {
            1
        } else {
            s[d - lead]
        }
    };
    (0..rank)
        .map(|d| match (dim(a, d), dim(b, d)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(Error::Shape {
                op,
                a: a.to_vec(),
                b: b.to_vec(),
            }),
        })
        .collect()
}

/// Whether one operand is dense over `shape` and the other a dense block of its
/// trailing dimensions repeated over the leading ones (`[rows, n] + [n]`, a bias;
/// `[b, t, c] + [t, c]`): flattened, a row of `cols` elements broadcast over
/// `[numel / cols, cols]`. `Some((true, cols))` when the row is `a`, `Some((false,
/// cols))` when it is `b`, `None` otherwise (the strided kernel runs).
pub(super) fn row_broadcast(a: &Tensor, b: &Tensor, shape: &[usize]) -> Option<(bool, usize)> {
    let dense = |t: &Tensor| t.is_contiguous() && t.shape() == shape;
    // Leading dimensions of size 1 aside, the trailing dimensions of `shape`.
    let row = |t: &Tensor| {
        let s = t.shape();
        let lead = s.iter().take_while(|&&d| d == 1).count();
        let trailing = &s[lead..];
        t.is_contiguous()
            && trailing.len() < shape.len()
            && shape.ends_with(trailing)
            && t.numel() > 0
    };
    if shape.is_empty() {
        return None;
    }
    if dense(a) && row(b) {
        Some((false, b.numel()))
    } else if row(a) && dense(b) {
        Some((true, a.numel()))
    } else {
        None
    }
}

impl Tensor {
    /// The launch layout of this tensor stretched to `shape` (stride 0 where it
    /// broadcasts).
    pub(super) fn broadcast_layout(&self, shape: &[usize]) -> Result<Strided> {
        self.layout().expand(shape)?.strided()
    }

    /// `op` on `self` and `other` broadcast together, in their promoted dtype (float32
    /// for integer operands of a float-only op, such as `div`: true division).
    pub(super) fn broadcast_binary(
        &self,
        op: BinaryOp,
        other: &Tensor,
        alpha: f32,
    ) -> Result<Tensor> {
        self.check_same_device(other)?;
        let mut dtype = result_type(&[self, other], &[]);
        if !is_floating_point(dtype) && op.int_cuda().is_none() {
            dtype = DType::F32;
        }
        if super::mixed::reads_each_in_its_dtype(self, other, dtype) {
            let shape = broadcast_shapes(op.name(), self.shape(), other.shape())?;
            return self.mixed_binary(op, other, &shape, alpha);
        }
        let (a, b) = (self.to_dtype(dtype)?, other.to_dtype(dtype)?);
        let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
        let out = Tensor::empty(&shape, dtype, self.device())?;
        let n = out.numel();
        let dense = |t: &Tensor| t.is_contiguous() && t.shape() == shape.as_slice();
        let kernel = if dense(&a) && dense(&b) {
            Kernel::Binary {
                op,
                dtype,
                a: a.ptr(),
                b: b.ptr(),
                out: out.ptr(),
                n,
                alpha,
            }
        } else if let Some((row_first, cols)) = row_broadcast(&a, &b, &shape) {
            Kernel::BinaryRows {
                op,
                dtype,
                a: a.ptr(),
                b: b.ptr(),
                out: out.ptr(),
                n,
                cols,
                row_first,
                alpha,
            }
        } else {
            Kernel::BinaryStrided {
                op,
                dtype,
                a: a.ptr(),
                a_layout: a.broadcast_layout(&shape)?,
                b: b.ptr(),
                b_layout: b.broadcast_layout(&shape)?,
                out: out.ptr(),
                n,
                alpha,
            }
        };
        self.device().launch(&kernel)?;
        // Products, quotients, powers and extrema read their operands (a power its
        // output too); sums and differences read nothing.
        let saved = match op {
            BinaryOp::Mul | BinaryOp::Div | BinaryOp::Maximum | BinaryOp::Minimum => {
                vec![a.clone(), b.clone()]
            }
            BinaryOp::ThresholdBackward => vec![b.clone()],
            BinaryOp::Pow => vec![a.clone(), b.clone(), out.clone()],
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Axpy | BinaryOp::SquaredDifference => vec![],
        };
        let grad_op = if a.shape() == shape.as_slice() && b.shape() == shape.as_slice() {
            GradOp::Binary(op)
        } else {
            GradOp::BroadcastBinary {
                op,
                a: a.shape().to_vec(),
                b: b.shape().to_vec(),
                needs: [a.requires_grad(), b.requires_grad()],
            }
        };
        Ok(Tensor::recorded(out, grad_op, &[&a, &b], saved))
    }

    /// A zero-dimensional tensor holding `value` as `dtype` on this tensor's device (a
    /// float becomes an integer by truncation toward zero, as a cast does).
    pub fn scalar_tensor(
        value: Scalar,
        dtype: DType,
        device: &crate::device::Device,
    ) -> Result<Tensor> {
        let int = match value {
            Scalar::Int(v) => v,
            Scalar::Float(v) => v as i64,
        };
        let f = value.as_f64();
        match dtype {
            DType::F32 => Tensor::full(&[], f as f32, device),
            DType::F16 => Tensor::full(&[], half::f16::from_f64(f), device),
            DType::BF16 => Tensor::full(&[], half::bf16::from_f64(f), device),
            DType::I32 => Tensor::full(&[], int as i32, device),
            DType::I64 => Tensor::full(&[], int, device),
            DType::U8 => Tensor::full(&[], int as u8, device),
        }
    }

    /// `op(self, scalar)` with PyTorch's promotion for a Python number operand.
    pub fn binary_scalar(&self, op: BinaryOp, scalar: impl Into<Scalar>) -> Result<Tensor> {
        let scalar = scalar.into();
        let dtype = result_type(&[self], &[scalar]);
        let s = Tensor::scalar_tensor(scalar, dtype, self.device())?;
        self.to_dtype(dtype)?.broadcast_binary(op, &s, 0.0)
    }

    /// `self + scalar` (an integer tensor plus a float scalar is float32).
    pub fn add_scalar(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Add, scalar)
    }

    /// `self - scalar`.
    pub fn sub_scalar(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Sub, scalar)
    }

    /// `self * scalar`; on a float tensor, one dense `scale` kernel.
    pub fn mul_scalar(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        let scalar = scalar.into();
        if is_floating_point(self.dtype()) {
            return self.scale(scalar.as_f64() as f32);
        }
        self.binary_scalar(BinaryOp::Mul, scalar)
    }

    /// `self / scalar` (true division: integers give float32).
    pub fn div_scalar(&self, scalar: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Div, scalar)
    }

    /// `self ^ exponent`; on a float tensor (or an integer one with a float exponent,
    /// which promotes to float32), one dense `pow_scalar` kernel; an integer tensor with
    /// an integer exponent stays integer, as in PyTorch.
    pub fn pow_scalar(&self, exponent: impl Into<Scalar>) -> Result<Tensor> {
        let e = exponent.into();
        let dtype = result_type(&[self], &[e]);
        if !is_floating_point(dtype) {
            return self.binary_scalar(BinaryOp::Pow, e);
        }
        self.to_dtype(dtype)?
            .unary_with(UnaryOp::PowScalar, e.as_f64() as f32)
    }

    /// `self ^ exponent`, elementwise, broadcast.
    pub fn pow(&self, exponent: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Pow, exponent)
    }

    /// The smaller of each pair of elements, broadcast.
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Minimum, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_align_from_the_right_and_size_one_stretches() {
        assert_eq!(broadcast_shapes("add", &[3, 1], &[4]).unwrap(), [3, 4]);
        assert_eq!(
            broadcast_shapes("mul", &[2, 3, 4], &[3, 1]).unwrap(),
            [2, 3, 4]
        );
        assert_eq!(broadcast_shapes("add", &[], &[2, 2]).unwrap(), [2, 2]);
        assert_eq!(broadcast_shapes("add", &[0], &[1]).unwrap(), [0]);
        let e = broadcast_shapes("add", &[2, 3], &[4]).unwrap_err();
        assert_eq!(
            e,
            Error::Shape {
                op: "add",
                a: vec![2, 3],
                b: vec![4]
            }
        );
    }
}
