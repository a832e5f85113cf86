//! Matrix products: `[m, k] @ [k, n]`, batches `[..., m, k] @ [..., k, n]` with the same
//! leading dimensions, and `[..., m, k] @ [k, n]`, one weight for every batch. Each is
//! one GEMM launch on the device's default stream (cuBLAS on the GPU), returning
//! without waiting, accumulating in `f32` whatever the dtype.
//!
//! Operands reach the GEMM as they lie in memory whenever their strides allow: a
//! transposed matrix is the GEMM's `op = T`, a narrowed one a longer leading dimension,
//! an expanded batch a batch stride of 0. Only other views are made dense first (a
//! copy), as PyTorch does.

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::GradOp;
use super::Tensor;
use crate::error::{Error, Result};
use crate::kernels::{Gemm, Kernel, Operand};

/// How a matrix product may compute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatmulOptions {
    /// Lets `float32` products use TF32 tensor cores: about 8x the throughput on an
    /// H100, with inputs rounded to 10 bits of mantissa. Off by default, as PyTorch's
    /// `torch.backends.cuda.matmul.allow_tf32 = False`; the half types ignore it.
    pub allow_tf32: bool,
}

const OP: &str = "matmul";

/// Products run in the autocast region's dtype (PyTorch's `lower_precision_fp` list).
pub(super) const MATMUL: AutocastOp = AutocastOp {
    name: OP,
    policy: CastPolicy::LowerPrecision,
};
pub(super) const LINEAR: AutocastOp = AutocastOp {
    name: "linear",
    policy: CastPolicy::LowerPrecision,
};

/// The largest leading dimension the GEMM takes (cuBLAS's 32-bit `ld`).
const MAX_LD: usize = i32::MAX as usize;

/// `(transposed, ld)` for a `[rows, cols]` matrix whose rows are `rs` elements apart and
/// columns `cs`: as stored when the elements of a row are adjacent, transposed when
/// those of a column are; `None` when neither (a copy is needed). Size-1 dimensions
/// may have any stride.
fn matrix_layout(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(bool, usize)> {
    if cols <= 1 || cs == 1 {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) && ld <= MAX_LD {
            return Some((false, ld));
        }
    }
    if rows <= 1 || rs == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) && ld <= MAX_LD {
            return Some((true, ld));
        }
    }
    None
}

/// One stride that steps through the batch dimensions in row-major order, if there is
/// one (size-1 dimensions are skipped; no batch dimensions give 0).
fn batch_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let mut first: Option<usize> = None;
    let mut expected = 0;
    for (&size, &stride) in shape.iter().zip(strides).rev() {
        if size == 1 {
            continue;
        }
        match first {
            None => first = Some(stride),
            Some(_) if stride != expected => return None,
            Some(_) => {}
        }
        expected = stride * size;
    }
    Some(first.unwrap_or(0))
}

/// The GEMM operand for `t`'s memory as it is, when its strides allow.
fn as_operand(t: &Tensor) -> Option<Operand> {
    let (shape, strides) = (t.shape(), t.strides());
    let r = shape.len();
    let (transposed, ld) =
        matrix_layout(shape[r - 2], shape[r - 1], strides[r - 2], strides[r - 1])?;
    Some(Operand {
        ptr: t.ptr(),
        ld,
        batch_stride: batch_stride(&shape[..r - 2], &strides[..r - 2])?,
        transposed,
    })
}

/// `t` as a GEMM operand: itself when its strides allow, else a dense copy (returned so
/// that it lives until the launch is enqueued).
fn placed(t: &Tensor) -> Result<(Tensor, Operand)> {
    if let Some(operand) = as_operand(t) {
        return Ok((t.clone(), operand));
    }
    let dense = t.contiguous()?;
    let operand = as_operand(&dense).expect("a dense tensor is a GEMM operand");
    Ok((dense, operand))
}

/// A linear layer's bias is a `[out]` vector of the input's dtype (PyTorch refuses
/// mixed dtypes in `addmm` too); anything else is an error naming both.
fn check_bias(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<()> {
    let out = weight.shape().first().copied().unwrap_or(0);
    if weight.shape().len() != 2 || bias.shape() != [out] {
        return Err(Error::InvalidArgument(format!(
            "linear: the bias must be [out] = [{out}] for a weight of shape {:?}, got {:?}",
            weight.shape(),
            bias.shape()
        )));
    }
    if bias.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op: "linear",
            a: x.dtype(),
            b: bias.dtype(),
        });
    }
    Ok(())
}

impl Tensor {
    // ANCHOR: matmul
    /// The matrix product `self @ other` (PyTorch's `torch.matmul` for 2-D and batched
    /// operands), in `float32` without TF32, `float16` or `bfloat16`.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_with(other, MatmulOptions::default())
    }
    // ANCHOR_END: matmul

    /// [`matmul`](Self::matmul) with options (TF32 for `float32`).
    pub fn matmul_with(&self, other: &Tensor, options: MatmulOptions) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(MATMUL.policy, &[self, other])? {
            return args[0].matmul_with(&args[1], options);
        }
        let out = match Tensor::replayed_output(&GradOp::Matmul, &[self, other]) {
            Some(kept) => kept,
            None => self.matmul_unrecorded(other, options)?,
        };
        // Both gradients are products with the other operand (dA = g Bᵀ, dB = Aᵀ g): both
        // are saved.
        Ok(Tensor::recorded(
            out,
            GradOp::Matmul,
            &[self, other],
            vec![self.clone(), other.clone()],
        ))
    }

    // ANCHOR: linear
    /// PyTorch's `F.linear(x, weight, bias)`: `x @ weightᵀ + bias` for `x [rows, in]`
    /// (or `[..., in]`), `weight [out, in]`, `bias [out]`. Under autocast every operand
    /// is cast to the region's dtype before the product, the weight (a leaf) through
    /// the cast cache.
    ///
    /// With a bias, one GEMM adds it to every row as it writes the output (cuBLASLt's
    /// bias epilogue, as PyTorch's `addmm`): one launch and one `[rows, out]` tensor,
    /// where a product and a broadcast add take two of each. A bias that is not `[out]`
    /// of the input's dtype is an error.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let inputs: Vec<&Tensor> = [Some(self), Some(weight), bias]
            .into_iter()
            .flatten()
            .collect();
        if let Some(args) = super::autocast_args(LINEAR.policy, &inputs)? {
            return args[0].linear(&args[1], args.get(2));
        }
        let wt = weight.transpose(0, 1)?;
        let Some(b) = bias else {
            return self.matmul(&wt);
        };
        check_bias(self, weight, b)?;
        // Both operands are saved, as by `matmul`; the bias's gradient is the sum of
        // the output gradient's rows, which needs nothing saved.
        let saved = vec![self.clone(), wt.clone()];
        let op = GradOp::Linear {
            bias_needs_grad: b.requires_grad(),
        };
        if let Some(kept) = Tensor::replayed_output(&op, &[self, &wt, b]) {
            return Ok(Tensor::recorded(kept, op, &[self, &wt, b], saved));
        }
        let (y, fused) = self.product(&wt, MatmulOptions::default(), Some(b))?;
        if fused {
            return Ok(Tensor::recorded(y, op, &[self, &wt, b], saved));
        }
        // A bias the GEMM cannot add (a strided bias, a batched product): the
        // product, then the broadcasting add.
        Tensor::recorded(y, GradOp::Matmul, &[self, &wt], saved).add(b)
    }
    // ANCHOR_END: linear

    fn matmul_unrecorded(&self, other: &Tensor, options: MatmulOptions) -> Result<Tensor> {
        Ok(self.product(other, options, None)?.0)
    }

    /// Whether `bias` can be the GEMM's bias for this product's output of `n` columns:
    /// a dense `[n]` vector of its dtype on the same device.
    fn is_gemm_bias(&self, bias: &Tensor, n: usize) -> bool {
        bias.device() == self.device()
            && bias.dtype() == self.dtype
            && bias.shape() == [n]
            && bias.is_contiguous()
    }

    /// `self @ other`, unrecorded, with `bias` added to every row by the GEMM when it
    /// can be (a `[n]` vector of the output's dtype, a product that is one GEMM of
    /// batch 1); the flag says whether it was.
    fn product(
        &self,
        other: &Tensor,
        options: MatmulOptions,
        bias: Option<&Tensor>,
    ) -> Result<(Tensor, bool)> {
        self.check_same_device(other)?;
        self.check_float(OP)?;
        other.check_float(OP)?;
        if self.dtype != other.dtype {
            return Err(Error::DTypeMismatch {
                op: OP,
                a: self.dtype,
                b: other.dtype,
            });
        }
        let (a_shape, b_shape) = (self.shape(), other.shape());
        let (ra, rb) = (a_shape.len(), b_shape.len());
        let shared_weight = rb == 2;
        if ra < 2 || rb < 2 || (!shared_weight && ra != rb) {
            return Err(Error::InvalidArgument(format!(
                "matmul takes [m, k] @ [k, n], [..., m, k] @ [..., k, n] with the same \
                 leading dimensions, or [..., m, k] @ [k, n]; got {a_shape:?} @ {b_shape:?}"
            )));
        }
        let (m, k) = (a_shape[ra - 2], a_shape[ra - 1]);
        let n = b_shape[rb - 1];
        let batch_shape = &a_shape[..ra - 2];
        if b_shape[rb - 2] != k || (!shared_weight && b_shape[..rb - 2] != *batch_shape) {
            return Err(Error::Shape {
                op: OP,
                a: a_shape.to_vec(),
                b: b_shape.to_vec(),
            });
        }
        let batch: usize = batch_shape.iter().product();
        let mut out_shape = batch_shape.to_vec();
        out_shape.extend([m, n]);
        if m == 0 || n == 0 || batch == 0 {
            return Ok((Tensor::empty(&out_shape, self.dtype, self.device())?, false));
        }
        if k == 0 {
            // A sum of nothing: zeros, as in PyTorch (no GEMM to launch).
            return Ok((Tensor::zeros(&out_shape, self.dtype, self.device())?, false));
        }

        let (a, a_op) = placed(self)?;
        let (b, b_op) = placed(other)?;
        let out = Tensor::empty(&out_shape, self.dtype, self.device())?;
        let mut gemm = Gemm {
            dtype: self.dtype,
            m,
            n,
            k,
            batch,
            a: a_op,
            b: b_op,
            c: out.ptr(),
            c_dtype: self.dtype,
            ldc: n,
            stride_c: m * n,
            alpha: 1.0,
            beta: 0.0,
            allow_tf32: options.allow_tf32,
            bias: None,
        };
        // One weight for every batch whose rows follow one another `ld` apart: the
        // batches are one tall `[batch * m, k]` matrix and the product a single GEMM.
        if shared_weight
            && !a_op.transposed
            && (batch == 1 || a_op.batch_stride == m * a_op.ld)
            && batch * m <= MAX_LD
        {
            gemm.m = batch * m;
            gemm.batch = 1;
        }
        let bias = bias.filter(|b| gemm.batch == 1 && self.is_gemm_bias(b, n));
        gemm.bias = bias.map(Tensor::ptr);
        self.device().launch(&Kernel::Gemm(gemm))?;
        // The operands (and any dense copies) may go now: the caching allocator reuses
        // their memory only for work queued after the product on the same stream.
        drop((a, b));
        Ok((out, bias.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_are_used_as_stored_or_transposed_when_strides_allow() {
        // Dense [3, 4]; its transpose; a narrowed [3, 2] of rows 4 apart.
        assert_eq!(matrix_layout(3, 4, 4, 1), Some((false, 4)));
        assert_eq!(matrix_layout(4, 3, 1, 4), Some((true, 4)));
        assert_eq!(matrix_layout(3, 2, 4, 1), Some((false, 4)));
        // Size-1 dimensions' strides do not matter.
        assert_eq!(matrix_layout(1, 5, 0, 1), Some((false, 5)));
        assert_eq!(matrix_layout(5, 1, 1, 0), Some((false, 1)));
        // An expanded row ([1, k] to [m, k], stride 0) cannot be a GEMM operand.
        assert_eq!(matrix_layout(3, 4, 0, 1), None);
        // Neither rows nor columns adjacent.
        assert_eq!(matrix_layout(3, 4, 8, 2), None);
    }

    #[test]
    fn batch_dimensions_collapse_to_one_stride_when_they_can() {
        assert_eq!(batch_stride(&[], &[]), Some(0));
        assert_eq!(batch_stride(&[2, 3], &[36, 12]), Some(12));
        assert_eq!(batch_stride(&[2, 1, 3], &[36, 99, 12]), Some(12));
        // An expanded batch (stride 0) is one matrix for every batch.
        assert_eq!(batch_stride(&[4], &[0]), Some(0));
        // A transposed batch cannot be stepped with one stride.
        assert_eq!(batch_stride(&[2, 3], &[12, 24]), None);
    }
}
