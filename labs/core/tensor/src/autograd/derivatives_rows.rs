//! The derivatives of the row ops (softmax, layer norm, dropout, embedding, cat, the
//! losses, max, var): each reads what the forward saved and calls the backward helper
//! beside its forward in `tensor/`.

use super::derivatives::saved_at;
use crate::error::{Error, Result};
use crate::tensor::{GradOp, Tensor};

/// The gradients of a row op's inputs, in input order.
pub(super) fn input_grads(op: &GradOp, grad: &Tensor, saved: &[Tensor]) -> Result<Vec<Tensor>> {
    let name = op.name();
    let s = |i| saved_at(saved, i, &name);
    Ok(match op {
        GradOp::Softmax {
            dim,
            log,
            input_dtype,
        } => vec![Tensor::softmax_backward(
            s(0)?,
            grad,
            *dim,
            *log,
            *input_dtype,
        )?],
        GradOp::LayerNorm {
            normalized_shape,
            has_weight,
            has_bias,
        } => {
            let weight = if *has_weight { Some(s(3)?) } else { None };
            Tensor::layer_norm_backward(
                grad,
                [s(0)?, s(1)?, s(2)?],
                weight,
                normalized_shape,
                *has_bias,
            )?
        }
        GradOp::Dropout { scale } => vec![Tensor::dropout_backward(grad, s(0)?, *scale)?],
        GradOp::Embedding { vocab } => vec![Tensor::embedding_backward(grad, s(0)?, *vocab)?],
        GradOp::Cat { dim, sizes } => Tensor::cat_backward(grad, *dim, sizes)?,
        GradOp::NllLoss {
            ignore_index,
            classes,
        } => vec![Tensor::nll_loss_backward(
            grad,
            s(0)?,
            s(1)?,
            *classes,
            *ignore_index,
        )?],
        GradOp::MseLoss { target_needs_grad } => {
            let dx = Tensor::mse_loss_backward(grad, s(0)?, s(1)?)?;
            // A target that needs no gradient gets a placeholder the engine drops.
            let dy = if *target_needs_grad {
                dx.neg()?
            } else {
                dx.clone()
            };
            vec![dx, dy]
        }
        GradOp::MaxDim { dim, input, .. } => {
            vec![Tensor::max_dim_backward(grad, s(0)?, *dim, input)?]
        }
        GradOp::Var {
            dims,
            correction,
            keepdim,
        } => vec![Tensor::var_backward(
            grad,
            s(0)?,
            dims,
            *correction,
            *keepdim,
        )?],
        _ => {
            return Err(Error::InvalidArgument(format!(
                "backward: {name} is not a row op"
            )))
        }
    })
}
