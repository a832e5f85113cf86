//! Arithmetic on tensors. Each op checks devices, dtypes and shapes, then enqueues one
//! kernel on the device's default stream and returns without waiting. Any op declared
//! in `kernels/ops.rs` is reachable through [`Tensor::unary`] and [`Tensor::binary`];
//! the named methods are shorthands. A unary op's strided input is made dense first (a
//! copy); binary ops broadcast, promote and read strided operands in place
//! (`broadcast.rs`); in-place ops need a dense tensor.

use super::autocast::CastPolicy;
use super::graph::GradOp;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{BinaryOp, Kernel, UnaryOp};

/// The autocast class of each unary op (PyTorch's `fp32` list holds `exp`, `log`,
/// `rsqrt` and `pow`); the match is exhaustive, so a new op does not compile without one.
pub(super) fn unary_autocast(op: UnaryOp) -> CastPolicy {
    match op {
        UnaryOp::Exp | UnaryOp::Log | UnaryOp::Rsqrt | UnaryOp::PowScalar => CastPolicy::Fp32,
        UnaryOp::Neg
        | UnaryOp::Sqrt
        | UnaryOp::Tanh
        | UnaryOp::Sigmoid
        | UnaryOp::Relu
        | UnaryOp::Step
        | UnaryOp::Scale
        | UnaryOp::Abs
        | UnaryOp::Gelu
        | UnaryOp::GeluTanh
        | UnaryOp::GeluGrad
        | UnaryOp::GeluTanhGrad
        | UnaryOp::ClampMin
        | UnaryOp::ClampMax
        | UnaryOp::StepGe
        | UnaryOp::StepLe => CastPolicy::Unchanged,
    }
}

/// The autocast class of each binary op (`pow` is on PyTorch's `fp32` list; the others
/// promote mixed inputs anyway); exhaustive, as [`unary_autocast`].
pub(super) fn binary_autocast(op: BinaryOp) -> CastPolicy {
    match op {
        BinaryOp::Pow => CastPolicy::Fp32,
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Maximum
        | BinaryOp::Minimum
        | BinaryOp::Axpy
        | BinaryOp::ThresholdBackward
        | BinaryOp::SquaredDifference => CastPolicy::Unchanged,
    }
}

/// What the elementwise kernels are generated for.
const FLOAT_DTYPES: &str = "float32, float16, bfloat16";

impl Tensor {
    pub(super) fn check_float(&self, op: &'static str) -> Result<()> {
        match self.dtype {
            DType::F32 | DType::F16 | DType::BF16 => Ok(()),
            found => Err(Error::DType {
                op,
                found,
                supported: FLOAT_DTYPES,
            }),
        }
    }

    /// An error naming `op` unless the dtype is a float one (float32, float16,
    /// bfloat16).
    pub fn check_float_dtype(&self, op: &'static str) -> Result<()> {
        self.check_float(op)
    }

    fn check_f32(&self, op: &'static str) -> Result<()> {
        if self.dtype != DType::F32 {
            return Err(Error::DType {
                op,
                found: self.dtype,
                supported: "float32",
            });
        }
        Ok(())
    }

    fn check_binary(&self, other: &Tensor, op: &'static str) -> Result<()> {
        self.check_same_device(other)?;
        self.check_float(op)?;
        if other.dtype != self.dtype {
            return Err(Error::DType {
                op,
                found: other.dtype,
                supported: "the dtype of the other operand",
            });
        }
        if self.shape() != other.shape() {
            return Err(Error::Shape {
                op,
                a: self.shape().to_vec(),
                b: other.shape().to_vec(),
            });
        }
        Ok(())
    }

    /// In-place ops would change what a recorded graph saved; PyTorch refuses them on
    /// tensors that need a gradient while recording, and so do we.
    pub fn check_not_recording(&self, op: &'static str) -> Result<()> {
        if self.requires_grad() && super::is_grad_enabled() {
            return Err(Error::InvalidArgument(format!(
                "{op}: a tensor that requires grad is used in an in-place operation; \
                 run it under no_grad() or on detach()"
            )));
        }
        Ok(())
    }

    fn check_dense(&self, op: &'static str) -> Result<()> {
        if !self.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "{op}: an in-place op needs a contiguous tensor, got strides {:?}",
                self.strides()
            )));
        }
        Ok(())
    }

    /// `op` applied to every element, into a new tensor; `alpha` is the scalar of ops
    /// that take one (`Scale`).
    /// Integer tensors run the ops with an integer expression in their own dtype, and
    /// are promoted to float32 for the others (`exp` of an int32 tensor is float32).
    pub fn unary_with(&self, op: UnaryOp, alpha: f32) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(unary_autocast(op), &[self])? {
            return args[0].unary_with(op, alpha);
        }
        if !self.is_floating_point() && op.int_cuda().is_none() {
            return self.promoted_to_float()?.unary_with(op, alpha);
        }
        let x = self.contiguous()?;
        let out = Tensor::empty(self.shape(), self.dtype, self.device())?;
        self.device().launch(&Kernel::Unary {
            op,
            dtype: self.dtype,
            x: x.ptr(),
            out: out.ptr(),
            n: self.numel(),
            alpha,
        })?;
        // What each derivative reads: the output for exp, sqrt, tanh, sigmoid and rsqrt
        // (their derivatives are functions of it) and for relu (its output is positive
        // exactly where its input is, and PyTorch saves the output too: a following
        // matmul saves the same tensor, so the graph holds one copy); the input for log.
        let saved = match op {
            UnaryOp::Exp
            | UnaryOp::Sqrt
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Rsqrt
            | UnaryOp::Relu => vec![out.clone()],
            UnaryOp::Log
            | UnaryOp::Abs
            | UnaryOp::PowScalar
            | UnaryOp::Gelu
            | UnaryOp::GeluTanh
            | UnaryOp::ClampMin
            | UnaryOp::ClampMax => vec![self.clone()],
            UnaryOp::Neg
            | UnaryOp::Scale
            | UnaryOp::Step
            | UnaryOp::GeluGrad
            | UnaryOp::GeluTanhGrad
            | UnaryOp::StepGe
            | UnaryOp::StepLe => vec![],
        };
        Ok(Tensor::recorded(
            out,
            GradOp::Unary(op, alpha),
            &[self],
            saved,
        ))
    }

    /// `op` applied to every element, into a new tensor.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        self.unary_with(op, 0.0)
    }

    /// `op` applied to pairs of elements of two tensors, broadcast together (PyTorch's
    /// rules) in their promoted dtype (see `broadcast.rs`).
    pub fn binary_with(&self, op: BinaryOp, other: &Tensor, alpha: f32) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(binary_autocast(op), &[self, other])? {
            return args[0].broadcast_binary(op, &args[1], alpha);
        }
        self.broadcast_binary(op, other, alpha)
    }

    /// `op` applied to pairs of elements of two tensors, broadcast and promoted.
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        self.binary_with(op, other, 0.0)
    }

    // ANCHOR: tensor_add
    /// `self + other`, elementwise, broadcast.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, other)
    }
    // ANCHOR_END: tensor_add

    /// `self - other`, elementwise.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, other)
    }

    /// `self * other`, elementwise.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, other)
    }

    /// `self / other`, elementwise.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, other)
    }

    /// The larger of each pair of elements.
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Maximum, other)
    }

    /// `-self`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    /// `e^self`, elementwise.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    /// `max(self, 0)`, elementwise.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// `alpha * self`.
    pub fn scale(&self, alpha: f32) -> Result<Tensor> {
        self.unary_with(UnaryOp::Scale, alpha)
    }

    /// `self += alpha * x`, in place (the BLAS axpy; PyTorch's `add_(x, alpha=)`).
    pub fn axpy_(&self, alpha: f32, x: &Tensor) -> Result<()> {
        self.check_binary(x, "axpy")?;
        self.check_dense("axpy_")?;
        self.check_not_recording("axpy_")?;
        let x = x.contiguous()?;
        self.device().launch(&Kernel::Binary {
            op: BinaryOp::Axpy,
            dtype: self.dtype,
            a: x.ptr(),
            b: self.ptr(),
            out: self.ptr(),
            n: self.numel(),
            alpha,
        })
    }

    fn spin_kernel(&self, iterations: u32) -> Result<Kernel> {
        self.check_f32("spin")?;
        self.check_dense("spin_")?;
        Ok(Kernel::Spin {
            x: self.ptr(),
            n: self.numel(),
            iterations,
        })
    }

    /// Runs `iterations` dependent multiply-adds on every element, in place: busy work
    /// whose duration the labs choose.
    pub fn spin_(&self, iterations: u32) -> Result<()> {
        self.device().launch(&self.spin_kernel(iterations)?)
    }

    /// `spin_` enqueued on a chosen stream.
    pub fn spin_on(&self, iterations: u32, stream: &crate::device::Stream) -> Result<()> {
        self.device()
            .backend()
            .launch(&self.spin_kernel(iterations)?, stream)
    }
}
