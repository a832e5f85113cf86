//! Each recorded op's derivative: given the gradient of its output, the gradients of
//! its inputs, computed with tensor ops (run with recording off by the engine).

use crate::error::{Error, Result};
use crate::kernels::{BinaryOp, UnaryOp};
use crate::tensor::{GradOp, Tensor};

/// The gradients of a node's inputs, in input order, from `grad` (its output's
/// gradient) and `saved` (what the op saved, in the order `tensor/` saved it).
pub(super) fn input_grads(op: &GradOp, grad: &Tensor, saved: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(match op {
        GradOp::Unary(op, alpha) => vec![unary(*op, *alpha, grad, saved)?],
        GradOp::Binary(op) => binary(*op, grad, saved)?,
        GradOp::Sum {
            dims,
            keepdim,
            input,
            scale,
        } => {
            // Put the summed dimensions back as size 1, then stretch them to the input.
            let mut kept_shape = input.clone();
            for &d in dims {
                kept_shape[d] = 1;
            }
            let g = if *keepdim {
                grad.clone()
            } else {
                grad.reshape(&kept_shape)?
            };
            let g = g.expand(input)?.contiguous()?;
            vec![if *scale == 1.0 { g } else { g.scale(*scale)? }]
        }
        GradOp::Permute(dims) => {
            let mut inverse = vec![0; dims.len()];
            for (i, &d) in dims.iter().enumerate() {
                inverse[d] = i;
            }
            vec![grad.permute(&inverse)?]
        }
        GradOp::Reshape(input) => vec![grad.reshape(input)?],
        GradOp::Narrow { dim, start, full } => vec![narrow_backward(grad, *dim, *start, *full)?],
        GradOp::Identity => vec![grad.clone()],
        GradOp::Matmul => matmul(grad, saved)?,
        GradOp::Linear { bias_needs_grad } => {
            // The bias's first, as the broadcast add's backward ran before the
            // product's when linear was the two ops; a bias that needs no gradient
            // gets a placeholder the engine drops.
            let n = grad.shape().last().copied().unwrap_or(1);
            let bias = if *bias_needs_grad {
                grad.sum_to_shape(&[n])?
            } else {
                grad.clone()
            };
            let mut grads = matmul(grad, saved)?;
            grads.push(bias);
            grads
        }
        GradOp::Cast { from } => vec![grad.to_dtype(*from)?],
        GradOp::BroadcastBinary { op, a, b, needs } => {
            let grads = binary(*op, grad, saved)?;
            let [ga, gb] = [(0, a), (1, b)].map(|(i, shape)| {
                // An input that needs no gradient gets a placeholder the engine drops.
                if needs[i] {
                    grads[i].sum_to_shape(shape)
                } else {
                    Ok(grads[i].clone())
                }
            });
            vec![ga?, gb?]
        }
        GradOp::MixedBinary {
            op,
            a,
            b,
            dtypes,
            needs,
        } => {
            let grads = binary(*op, grad, saved)?;
            let [ga, gb] = [(0, a), (1, b)].map(|(i, shape)| {
                // Summed in float32 first, then cast: fewer elements to cast, and
                // PyTorch's order (`validate_outputs` sums to the shape, then casts).
                if needs[i] {
                    grads[i].sum_to_shape(shape)?.to_dtype(dtypes[i])
                } else {
                    Ok(grads[i].clone())
                }
            });
            vec![ga?, gb?]
        }
        GradOp::Where { a, b, needs } => {
            let cond = saved_at(saved, 0, "where")?;
            let zero = Tensor::zeros(&[], grad.dtype(), grad.device())?;
            let side = |i: usize, shape: &[usize]| -> Result<Tensor> {
                if !needs[i] {
                    return Ok(grad.clone());
                }
                let g = if i == 0 {
                    Tensor::where_(cond, grad, &zero)?
                } else {
                    Tensor::where_(cond, &zero, grad)?
                };
                g.sum_to_shape(shape)
            };
            vec![side(0, a)?, side(1, b)?]
        }
        GradOp::Attention {
            scale,
            causal,
            dropout,
        } => {
            let s = |i| saved_at(saved, i, "attention");
            let (dq, dk, dv) = Tensor::fused_attention_backward(
                s(0)?,
                s(1)?,
                s(2)?,
                s(3)?,
                s(4)?,
                grad,
                *scale,
                *causal,
                dropout,
            )?;
            vec![dq, dk, dv]
        }
        GradOp::LinearCrossEntropy { needs } => {
            Tensor::linear_cross_entropy_backward(grad, saved, *needs)?
        }
        GradOp::Softmax { .. }
        | GradOp::LayerNorm { .. }
        | GradOp::Dropout { .. }
        | GradOp::Embedding { .. }
        | GradOp::Cat { .. }
        | GradOp::NllLoss { .. }
        | GradOp::MseLoss { .. }
        | GradOp::MaxDim { .. }
        | GradOp::Var { .. } => super::derivatives_rows::input_grads(op, grad, saved)?,
    })
}

/// `out = a @ b`: `da = g @ bᵀ`, `db = aᵀ @ g`; a weight shared by every batch sums its
/// batches' contributions, as one product over the batches stacked.
///
/// Each gradient comes out in its operand's memory order, as PyTorch's
/// `mm_mat1_backward` and `mm_mat2_backward` do: for a column-major operand (a
/// transposed view, as `linear`'s `weightᵀ`) the product is computed transposed,
/// `db = (gᵀ a)ᵀ`, so that the view's backward hands the weight a dense gradient
/// rather than one the accumulation must copy.
fn matmul(g: &Tensor, saved: &[Tensor]) -> Result<Vec<Tensor>> {
    let (a, b) = (saved_at(saved, 0, "matmul")?, saved_at(saved, 1, "matmul")?);
    let (ra, rb) = (a.shape().len(), b.shape().len());
    let da = if ra == rb && column_major(a) {
        // (b gᵀ)ᵀ: [.., k, m] dense, viewed as [.., m, k].
        b.matmul(&g.transpose(ra - 2, ra - 1)?)?
            .transpose(ra - 2, ra - 1)?
    } else {
        g.matmul(&b.transpose(rb - 2, rb - 1)?)?
    };
    let db = if rb == 2 && ra > 2 {
        let k = a.shape()[ra - 1];
        let n = g.shape()[ra - 1];
        let rows = a.numel() / k.max(1);
        let a2 = a.reshape(&[rows, k])?;
        let g2 = g.contiguous()?.reshape(&[rows, n])?;
        if column_major(b) {
            g2.transpose(0, 1)?.matmul(&a2)?.transpose(0, 1)?
        } else {
            a2.transpose(0, 1)?.matmul(&g2)?
        }
    } else if column_major(b) {
        // (gᵀ a)ᵀ: [.., n, k] dense, viewed as [.., k, n].
        g.transpose(ra - 2, ra - 1)?
            .matmul(a)?
            .transpose(rb - 2, rb - 1)?
    } else {
        a.transpose(ra - 2, ra - 1)?.matmul(g)?
    };
    Ok(vec![da, db])
}

/// Whether the matrices of `t` (its last two dimensions, `[rows, cols]`) are stored
/// column by column, each matrix dense (a transposed view of dense matrices): rows
/// adjacent, columns `rows` apart. Matrices of one row or column count as row-major.
fn column_major(t: &Tensor) -> bool {
    let r = t.shape().len();
    let (rows, cols) = (t.shape()[r - 2], t.shape()[r - 1]);
    let (rs, cs) = (t.strides()[r - 2], t.strides()[r - 1]);
    rows > 1 && cols > 1 && rs == 1 && cs == rows
}

pub(super) fn saved_at<'a>(saved: &'a [Tensor], i: usize, op: &str) -> Result<&'a Tensor> {
    saved
        .get(i)
        .ok_or_else(|| Error::InvalidArgument(format!("{op}: the graph saved no tensor {i}")))
}

fn unary(op: UnaryOp, alpha: f32, g: &Tensor, saved: &[Tensor]) -> Result<Tensor> {
    let s = |i| saved_at(saved, i, op.name());
    match op {
        UnaryOp::Neg => g.neg(),
        UnaryOp::Scale => g.scale(alpha),
        // d exp(x) = exp(x): the saved output.
        UnaryOp::Exp => g.mul(s(0)?),
        // d log(x) = 1 / x: the saved input.
        UnaryOp::Log => g.div(s(0)?),
        // d sqrt(x) = 1 / (2 sqrt(x)): the saved output.
        UnaryOp::Sqrt => g.div(s(0)?)?.scale(0.5),
        // d tanh(x) = 1 - tanh(x)^2.
        UnaryOp::Tanh => {
            let y = s(0)?;
            g.mul(&add_scalar(&y.mul(y)?.neg()?, 1.0)?)
        }
        // d sigmoid(x) = y (1 - y).
        UnaryOp::Sigmoid => {
            let y = s(0)?;
            let one_minus = add_scalar(&y.neg()?, 1.0)?;
            g.mul(&y.mul(&one_minus)?)
        }
        // d relu(x) = 1 where x > 0, that is where the saved output is > 0.
        UnaryOp::Relu => g.binary(BinaryOp::ThresholdBackward, s(0)?),
        // Steps are flat almost everywhere.
        UnaryOp::Step | UnaryOp::StepGe | UnaryOp::StepLe => {
            Tensor::zeros(g.shape(), g.dtype(), g.device())
        }
        // d rsqrt(x) = -x^(-3/2) / 2 = -y^3 / 2: the saved output.
        UnaryOp::Rsqrt => {
            let y = s(0)?;
            g.mul(&y.mul(y)?.mul(y)?)?.scale(-0.5)
        }
        // d |x| = sign(x), 0 at 0 as in PyTorch: step(x) - step(-x).
        UnaryOp::Abs => {
            let x = s(0)?;
            let sign = x
                .unary(UnaryOp::Step)?
                .sub(&x.neg()?.unary(UnaryOp::Step)?)?;
            g.mul(&sign)
        }
        // d x^a = a x^(a-1).
        UnaryOp::PowScalar => {
            let x = s(0)?;
            g.mul(
                &x.unary_with(UnaryOp::PowScalar, alpha - 1.0)?
                    .scale(alpha)?,
            )
        }
        UnaryOp::Gelu => g.mul(&s(0)?.unary(UnaryOp::GeluGrad)?),
        UnaryOp::GeluTanh => g.mul(&s(0)?.unary(UnaryOp::GeluTanhGrad)?),
        // The gradient passes where the bound did not apply (x >= min, x <= max), as in
        // PyTorch (which passes it at the bound too).
        UnaryOp::ClampMin => g.mul(&s(0)?.unary_with(UnaryOp::StepGe, alpha)?),
        UnaryOp::ClampMax => g.mul(&s(0)?.unary_with(UnaryOp::StepLe, alpha)?),
        UnaryOp::GeluGrad | UnaryOp::GeluTanhGrad => Err(Error::InvalidArgument(format!(
            "backward: {} is a derivative itself (no double backward)",
            op.name()
        ))),
    }
}

/// `x + c`, elementwise (float32: the derivatives that need it run in float32).
fn add_scalar(x: &Tensor, c: f32) -> Result<Tensor> {
    x.add(&Tensor::full(x.shape(), c, x.device())?)
}

fn binary(op: BinaryOp, g: &Tensor, saved: &[Tensor]) -> Result<Vec<Tensor>> {
    let s = |i| saved_at(saved, i, op.name());
    Ok(match op {
        BinaryOp::Add => vec![g.clone(), g.clone()],
        BinaryOp::Sub => vec![g.clone(), g.neg()?],
        BinaryOp::Mul => vec![g.mul(s(1)?)?, g.mul(s(0)?)?],
        BinaryOp::Div => {
            let (a, b) = (s(0)?, s(1)?);
            let ga = g.div(b)?;
            // d(a/b)/db = -a / b^2 = -(a/b) / b.
            let gb = ga.mul(a)?.div(b)?.neg()?;
            vec![ga, gb]
        }
        // The gradient goes to the larger (smaller) side, split evenly on ties, as in
        // PyTorch.
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let (a, b) = (s(0)?, s(1)?);
            let (to_a, to_b) = if op == BinaryOp::Maximum {
                (a.gt(b)?, a.lt(b)?)
            } else {
                (a.lt(b)?, a.gt(b)?)
            };
            let half_ties = a.eq(b)?.to_dtype(g.dtype())?.scale(0.5)?;
            let wa = to_a.to_dtype(g.dtype())?.add(&half_ties)?;
            let wb = to_b.to_dtype(g.dtype())?.add(&half_ties)?;
            vec![g.mul(&wa)?, g.mul(&wb)?]
        }
        // d a^b / da = b a^(b-1); d a^b / db = a^b ln(a).
        BinaryOp::Pow => {
            let (a, b, y) = (s(0)?, s(1)?, s(2)?);
            let ga = g.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?)?;
            let gb = g.mul(&y.mul(&a.unary(UnaryOp::Log)?)?)?;
            vec![ga, gb]
        }
        // Only `a` passes a gradient, where `b > 0`; `b` is a mask.
        BinaryOp::ThresholdBackward => {
            let b = s(0)?;
            let zeros = Tensor::zeros(b.shape(), b.dtype(), b.device())?;
            vec![g.binary(BinaryOp::ThresholdBackward, b)?, zeros]
        }
        BinaryOp::Axpy | BinaryOp::SquaredDifference => {
            return Err(Error::InvalidArgument(format!(
                "backward: no derivative for {} yet",
                op.name()
            )))
        }
    })
}

/// The gradient of `narrow(dim, start, len)`: `grad` in its place along `dim` of an
/// input `full` long there, zeros before and after (PyTorch's `slice_backward`: a
/// zeroed buffer and one copy into its part).
pub(super) fn narrow_backward(
    grad: &Tensor,
    dim: usize,
    start: usize,
    full: usize,
) -> Result<Tensor> {
    let len = grad.shape()[dim];
    if start == 0 && len == full {
        return Ok(grad.clone());
    }
    let mut shape = grad.shape().to_vec();
    shape[dim] = full;
    let out = Tensor::zeros(&shape, grad.dtype(), grad.device())?;
    out.narrow(dim, start, len)?.scatter_(grad)?;
    Ok(out)
}
