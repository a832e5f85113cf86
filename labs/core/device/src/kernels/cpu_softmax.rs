//! CPU twins of the softmax kernels of `kernels/rows.cu`, generic over the input's
//! element type `X` and the output's `Y` (the same type, or float32 for a half input:
//! `softmax_rows_to_f32` and `softmax_backward_from_f32`). Every value is widened to
//! float32 once and the result narrowed once, so reading a half input and writing
//! float32 is bit for bit a cast to float32 followed by the float32 kernel.

use half::{bf16, f16};

use super::cpu::{float, Float, FloatElement, HostAccess, Raw};
use super::cpu_rows::with;
use super::rows::RowKernel;
use crate::error::Result;

/// Runs the twin of a `Softmax` or `SoftmaxBackward` launch.
pub(super) fn run(kernel: &RowKernel, memory: &dyn HostAccess) -> Result<()> {
    kernel.check_dtypes()?;
    let (RowKernel::Softmax { dtype, y_dtype, .. }
    | RowKernel::SoftmaxBackward { dtype, y_dtype, .. }) = *kernel
    else {
        unreachable!("only softmax kernels come here");
    };
    let same = dtype == y_dtype;
    match float(dtype, kernel.name())? {
        Float::F32 => run_typed::<f32, f32>(kernel, memory),
        Float::F16 if same => run_typed::<f16, f16>(kernel, memory),
        Float::BF16 if same => run_typed::<bf16, bf16>(kernel, memory),
        Float::F16 => run_typed::<f16, f32>(kernel, memory),
        Float::BF16 => run_typed::<bf16, f32>(kernel, memory),
    }
}

/// `X` is the forward's input (and the backward's output), `Y` the forward's output
/// (and the backward's saved output and incoming gradient).
fn run_typed<X: FloatElement, Y: FloatElement>(
    kernel: &RowKernel,
    memory: &dyn HostAccess,
) -> Result<()> {
    let (ex, ey) = (std::mem::size_of::<X>(), std::mem::size_of::<Y>());
    // SAFETY (every `Raw::new` below): each pointer is valid for the range asked for it.
    match *kernel {
        RowKernel::Softmax {
            x,
            out,
            rows,
            cols,
            log,
            ..
        } => with(
            memory,
            [(x, rows * cols, ex), (out, rows * cols, ey)],
            |p| {
                let (x, y) = unsafe {
                    (
                        Raw::<X>::new(p[0], rows * cols),
                        Raw::<Y>::new(p[1], rows * cols),
                    )
                };
                for r in 0..rows {
                    let at = |c: usize| x.get(r * cols + c).widen();
                    let m = (0..cols).fold(f32::NEG_INFINITY, |m, c| m.max(at(c)));
                    let s: f32 = (0..cols).map(|c| (at(c) - m).exp()).sum();
                    if log {
                        let ls = s.ln();
                        for c in 0..cols {
                            y.set(r * cols + c, Y::narrow(at(c) - m - ls));
                        }
                    } else {
                        let inv = 1.0 / s;
                        for c in 0..cols {
                            y.set(r * cols + c, Y::narrow((at(c) - m).exp() * inv));
                        }
                    }
                }
            },
        ),
        RowKernel::SoftmaxBackward {
            y,
            grad,
            out,
            rows,
            cols,
            log,
            ..
        } => {
            let n = rows * cols;
            with(memory, [(y, n, ey), (grad, n, ey), (out, n, ex)], |p| {
                let (y, g, dx) = unsafe {
                    (
                        Raw::<Y>::new(p[0], n),
                        Raw::<Y>::new(p[1], n),
                        Raw::<X>::new(p[2], n),
                    )
                };
                for r in 0..rows {
                    let (yv, gv) = (
                        |c| y.get(r * cols + c).widen(),
                        |c| g.get(r * cols + c).widen(),
                    );
                    let s: f32 = (0..cols)
                        .map(|c| if log { gv(c) } else { gv(c) * yv(c) })
                        .sum();
                    for c in 0..cols {
                        let v = if log {
                            gv(c) - yv(c).exp() * s
                        } else {
                            yv(c) * (gv(c) - s)
                        };
                        dx.set(r * cols + c, X::narrow(v));
                    }
                }
            })
        }
        _ => unreachable!("only softmax kernels come here"),
    }
}
