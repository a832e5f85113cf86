//! Optimizers with PyTorch's update rules (`torch.optim.SGD`, `Adam`, `AdamW`). Each
//! holds clones of the parameters (sharing their storage and `.grad`), creates its
//! state lazily at the first step (so, as in PyTorch, an optimizer's memory appears at
//! step 1, not at construction), and updates each parameter with one fused kernel per
//! step ([`crate::tensor::fused::sgd_step`], [`crate::tensor::fused::adam_step`]) under
//! `no_grad`. A parameter whose `.grad` is `None` is skipped, as PyTorch skips it.
//!
//! Parameters may be `float32`, `float16` or `bfloat16` (a gradient has its
//! parameter's dtype); the state is `float32` in every case (see `kernels/optim.rs`).
//!
//! [`GradScaler`] is PyTorch's loss scaler for float16 mixed precision: it wraps an
//! optimizer's step, skipping it when the scaled gradients overflowed.

mod adam;
mod grad_scaler;
mod sgd;

pub use adam::{Adam, AdamW};
pub use grad_scaler::{GradScaler, ScalerStage};
pub use sgd::Sgd;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What every optimizer does.
pub trait Optimizer {
    /// One update of every parameter that has a gradient (`optimizer.step()`).
    fn step(&mut self) -> Result<()>;

    /// The parameters, in the order given.
    fn params(&self) -> &[Tensor];

    /// Drops every parameter's gradient (`set_to_none=true`, PyTorch's default), or sets
    /// it to zeros in place.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.params() {
            if set_to_none {
                p.clear_grad();
            } else if let Some(g) = p.grad() {
                // Detached first, as PyTorch's zero_grad detaches a gradient that has a
                // graph (made with create_graph) before zeroing it.
                g.detach().zero_()?;
            }
        }
        Ok(())
    }
}

/// The gradient of `p` if it has one, checked to fit the fused kernels: dense, of the
/// parameter's shape and dtype, on its device.
fn gradient_of(p: &Tensor, op: &'static str) -> Result<Option<Tensor>> {
    let Some(g) = p.grad() else {
        return Ok(None);
    };
    p.check_float_dtype(op)?;
    if !p.is_contiguous() {
        return Err(Error::InvalidArgument(format!(
            "{op}: the parameter of shape {:?} is not contiguous",
            p.shape()
        )));
    }
    if g.shape() != p.shape() {
        return Err(Error::Shape {
            op,
            a: p.shape().to_vec(),
            b: g.shape().to_vec(),
        });
    }
    if g.dtype() != p.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            a: p.dtype(),
            b: g.dtype(),
        });
    }
    if g.device().id() != p.device().id() {
        return Err(Error::DeviceMismatch {
            a: p.device().id(),
            b: g.device().id(),
        });
    }
    Ok(Some(g.contiguous()?))
}

/// Float32 zeros shaped like `p`, on its device: one piece of optimizer state (so
/// counted by the allocator).
fn state_like(p: &Tensor) -> Result<Tensor> {
    let _state = crate::tensor::Category::OptimizerState.scope();
    Tensor::zeros(p.shape(), crate::dtype::DType::F32, p.device())
}
