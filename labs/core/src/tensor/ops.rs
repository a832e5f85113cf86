//! Arithmetic on tensors. Each op checks devices, dtypes and shapes, then enqueues one
//! kernel on the device's default stream and returns without waiting.

use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::Kernel;

impl Tensor {
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
        self.check_f32(op)?;
        other.check_f32(op)?;
        if self.shape != other.shape {
            return Err(Error::Shape {
                op,
                a: self.shape.clone(),
                b: other.shape.clone(),
            });
        }
        Ok(())
    }

    // ANCHOR: tensor_add
    /// `self + other`, elementwise.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.check_binary(other, "add")?;
        let out = Tensor::empty(&self.shape, DType::F32, self.device())?;
        self.device().launch(&Kernel::Add {
            a: self.ptr(),
            b: other.ptr(),
            out: out.ptr(),
            n: self.numel(),
        })?;
        Ok(out)
    }
    // ANCHOR_END: tensor_add

    /// `self * other`, elementwise.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.check_binary(other, "mul")?;
        let out = Tensor::empty(&self.shape, DType::F32, self.device())?;
        self.device().launch(&Kernel::Mul {
            a: self.ptr(),
            b: other.ptr(),
            out: out.ptr(),
            n: self.numel(),
        })?;
        Ok(out)
    }

    /// `alpha * self`.
    pub fn scale(&self, alpha: f32) -> Result<Tensor> {
        self.check_f32("scale")?;
        let out = Tensor::empty(&self.shape, DType::F32, self.device())?;
        self.device().launch(&Kernel::Scale {
            x: self.ptr(),
            alpha,
            out: out.ptr(),
            n: self.numel(),
        })?;
        Ok(out)
    }

    /// `self += alpha * x`, in place (the BLAS axpy; PyTorch's `add_(x, alpha=)`).
    pub fn axpy_(&self, alpha: f32, x: &Tensor) -> Result<()> {
        self.check_binary(x, "axpy")?;
        self.device().launch(&Kernel::Axpy {
            alpha,
            x: x.ptr(),
            y: self.ptr(),
            n: self.numel(),
        })
    }

    /// Runs `iterations` dependent multiply-adds on every element, in place: busy work
    /// whose duration the labs choose.
    pub fn spin_(&self, iterations: u32) -> Result<()> {
        self.check_f32("spin")?;
        self.device().launch(&Kernel::Spin {
            x: self.ptr(),
            n: self.numel(),
            iterations,
        })
    }

    /// `spin_` enqueued on a chosen stream.
    pub fn spin_on(&self, iterations: u32, stream: &crate::Stream) -> Result<()> {
        self.check_f32("spin")?;
        self.device().backend().launch(
            &Kernel::Spin {
                x: self.ptr(),
                n: self.numel(),
                iterations,
            },
            stream,
        )
    }
}
