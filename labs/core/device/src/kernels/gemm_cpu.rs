//! The CPU twin of the matrix product (`Kernel::Gemm`), with its helpers: operands
//! widened to float32 and multiplied by `matrixmultiply`, the bias added as cuBLASLt's
//! epilogue adds it, TF32 rounding when asked.

use super::cpu::{access, FloatElement, HostAccess, Raw};
use super::Gemm;
use crate::error::Result;

// ANCHOR: cpu_gemm
/// The twin of cuBLAS's `cublasGemmStridedBatchedEx` with `CUBLAS_COMPUTE_32F`: each
/// batch's operands are widened to `f32` in aligned host buffers, multiplied by
/// `matrixmultiply` (a blocked, SIMD GEMM that takes any row and column strides, so a
/// transposed operand is only a swap of strides), and the result is rounded back to the
/// output's dtype `C` once, to nearest even (after the bias, when there is one, as
/// cuBLASLt's `CUBLASLT_EPILOGUE_BIAS` adds it). With `tf32`, the inputs are first rounded
/// to TF32's 10 bits of mantissa, as tensor cores read them.
pub(super) fn gemm<E: FloatElement, C: FloatElement>(
    g: &Gemm,
    tf32: bool,
    memory: &dyn HostAccess,
) -> Result<()> {
    if g.is_empty() {
        return Ok(());
    }
    let size = std::mem::size_of::<E>();
    let c_size = std::mem::size_of::<C>();
    let [span_a, span_b, span_c] = g.extents();
    // An operand nothing reads (`k = 0`) need not point anywhere: check C in its place.
    let range = |ptr, span: usize| {
        if span == 0 {
            (g.c, 0)
        } else {
            (ptr, span * size)
        }
    };
    // The bias is in the output's dtype; without one, C stands in (nothing read).
    let span_bias = g.bias_extent();
    let ranges = [
        range(g.a.ptr, span_a),
        range(g.b.ptr, span_b),
        (g.c, span_c * c_size),
        (g.bias.unwrap_or(g.c), span_bias * c_size),
    ];
    let [(rows_a, cols_a), (rows_b, cols_b)] = g.stored_shapes();
    let (m, n, k) = (g.m, g.n, g.k);
    access(memory, &ranges, |p| {
        // SAFETY: `p[i]` is valid for the i-th range, which spans every batch.
        let a = unsafe { Raw::<E>::new(p[0], span_a) };
        let b = unsafe { Raw::<E>::new(p[1], span_b) };
        let c = unsafe { Raw::<C>::new(p[2], span_c) };
        let bias: Vec<f32> = {
            let raw = unsafe { Raw::<C>::new(p[3], span_bias) };
            (0..span_bias).map(|j| raw.get(j).widen()).collect()
        };
        let mut a_buf = vec![0f32; rows_a * cols_a];
        let mut b_buf = vec![0f32; rows_b * cols_b];
        let mut c_buf = vec![0f32; m * n];
        // Row and column strides of op(A) and op(B) in the dense stored copies.
        let (rsa, csa) = strides(g.a.transposed, cols_a);
        let (rsb, csb) = strides(g.b.transposed, cols_b);
        for batch in 0..g.batch {
            gather(
                &a,
                batch * g.a.batch_stride,
                g.a.ld,
                cols_a,
                &mut a_buf,
                tf32,
            );
            gather(
                &b,
                batch * g.b.batch_stride,
                g.b.ld,
                cols_b,
                &mut b_buf,
                tf32,
            );
            let c_start = batch * g.stride_c;
            if g.beta != 0.0 {
                gather(&c, c_start, g.ldc, n, &mut c_buf, false);
            }
            // SAFETY: the buffers hold `m x k`, `k x n` and `m x n` elements under these
            // strides, and `c_buf` does not alias the inputs.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    g.alpha,
                    a_buf.as_ptr(),
                    rsa,
                    csa,
                    b_buf.as_ptr(),
                    rsb,
                    csb,
                    g.beta,
                    c_buf.as_mut_ptr(),
                    n as isize,
                    1,
                )
            };
            // cuBLASLt's bias epilogue: added to the f32 result, then one rounding.
            for (i, row) in c_buf.chunks_exact(n).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    let v = if bias.is_empty() { v } else { v + bias[j] };
                    c.set(c_start + i * g.ldc + j, C::narrow(v));
                }
            }
        }
    })
}

/// (row stride, column stride) of an operand in its dense stored copy of `cols`
/// columns: transposed, a step along a row of the operand is a step down the copy.
fn strides(transposed: bool, cols: usize) -> (isize, isize) {
    if transposed {
        (1, cols as isize)
    } else {
        (cols as isize, 1)
    }
}

/// Copies a matrix of `dense.len() / cols` rows of `cols` elements, rows `ld` apart
/// from `start`, into `dense`, widened to `f32` (and rounded to TF32 when asked).
fn gather<E: FloatElement>(
    src: &Raw<E>,
    start: usize,
    ld: usize,
    cols: usize,
    dense: &mut [f32],
    tf32: bool,
) {
    if cols == 0 {
        return;
    }
    for (i, row) in dense.chunks_exact_mut(cols).enumerate() {
        for (j, out) in row.iter_mut().enumerate() {
            let v = src.get(start + i * ld + j).widen();
            *out = if tf32 { round_to_tf32(v) } else { v };
        }
    }
}

/// `v` rounded to nearest even at TF32's precision (1 sign, 8 exponent, 10 mantissa
/// bits), kept in an `f32`. Infinities and NaNs pass through.
pub fn round_to_tf32(v: f32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    let bits = v.to_bits();
    let dropped = 13; // 23 - 10 mantissa bits
    let half = (1u32 << (dropped - 1)) - 1 + ((bits >> dropped) & 1);
    f32::from_bits(bits.wrapping_add(half) & !((1u32 << dropped) - 1))
}
// ANCHOR_END: cpu_gemm
