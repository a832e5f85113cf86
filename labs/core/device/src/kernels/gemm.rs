//! The matrix product every backend runs: a batched, strided GEMM in row-major terms,
//! `C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]`. It is a [`Kernel`](super::Kernel)
//! like the others (one launch, ordered on a stream), but no NVRTC module implements
//! it: `cuda` hands it to cuBLAS and `sim` to a CPU GEMM (see `kernels/cpu.rs`).
//!
//! Everything is row-major, as the tensor layer sees memory: a matrix stored with
//! leading dimension `ld` has element `(i, j)` at `i * ld + j`. An operand is either
//! used as stored or transposed, which is how a transposed view reaches the GEMM
//! without a copy.
//!
//! A product may add a bias vector to every row of its output (`F.linear`'s bias),
//! as cuBLASLt's `CUBLASLT_EPILOGUE_BIAS` does: one launch instead of a product and a
//! broadcast add, and one rounding of each output element instead of two.

use super::{BinaryOp, Kernel};
use crate::device_id::DevicePtr;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One input matrix of a [`Gemm`], in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// The first element of batch 0.
    pub ptr: DevicePtr,
    /// Elements from one stored row to the next (at least the stored row's length).
    pub ld: usize,
    /// Elements from one batch's matrix to the next; 0 shares one matrix across the
    /// batch (a weight).
    pub batch_stride: usize,
    /// Use the stored matrix transposed: `op(X) = X^T`. A `[k, m]` matrix stored
    /// row-major is then the `[m, k]` operand.
    pub transposed: bool,
}

impl Operand {
    /// A dense row-major `[rows, cols]` matrix per batch, used as stored.
    pub fn dense(ptr: DevicePtr, rows: usize, cols: usize) -> Operand {
        Operand {
            ptr,
            ld: cols.max(1),
            batch_stride: rows * cols,
            transposed: false,
        }
    }

    /// Rows and columns as stored, for an operand that is `[rows, cols]` after `op`.
    fn stored(&self, rows: usize, cols: usize) -> (usize, usize) {
        if self.transposed {
            (cols, rows)
        } else {
            (rows, cols)
        }
    }
}

// ANCHOR: gemm_struct
/// `C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]` for `b` in `0..batch`, where
/// `op(A)` is `[m, k]`, `op(B)` is `[k, n]` and `C` is `[m, n]`, all row-major.
/// The inputs share one float dtype and the output has it too, or `float32` (scores
/// that must not be rounded to half precision, as flash attention keeps them); products
/// are accumulated in `f32` (for `float16` and `bfloat16` too, as PyTorch's matmul
/// does). `beta = 0` ignores what `C` held, NaNs included. With a `bias`,
/// `C[b][i, j] = alpha * (op(A) @ op(B))[i, j] + beta * C[b][i, j] + bias[j]`, computed
/// in `f32` and rounded once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: Operand,
    pub b: Operand,
    /// The output: `ldc` elements from one row to the next, `stride_c` from one
    /// batch's matrix to the next.
    pub c: DevicePtr,
    /// The output's dtype: `dtype`, or `float32` for half-precision inputs.
    pub c_dtype: DType,
    pub ldc: usize,
    pub stride_c: usize,
    pub alpha: f32,
    pub beta: f32,
    /// Lets `float32` products use TF32 tensor cores (inputs rounded to 10 bits of
    /// mantissa). Off unless asked for, as PyTorch's
    /// `torch.backends.cuda.matmul.allow_tf32 = False`; ignored by the half types.
    pub allow_tf32: bool,
    /// A dense vector of `n` elements in the output's dtype (`c_dtype`), added to every
    /// row of C: `F.linear`'s bias. Batch 1 only (a bias with a batch is refused).
    pub bias: Option<DevicePtr>,
}
// ANCHOR_END: gemm_struct

/// The largest size cuBLAS's 32-bit interface takes for `m`, `n`, `k`, `ld` and `batch`;
/// the simulator refuses the same, so that both fail alike.
const MAX_DIM: usize = i32::MAX as usize;

impl Gemm {
    /// `C = op(A) @ op(B)` for one dense row-major product: `alpha = 1`, `beta = 0`.
    pub fn dense(dtype: DType, m: usize, n: usize, k: usize, [a, b, c]: [DevicePtr; 3]) -> Gemm {
        Gemm {
            dtype,
            m,
            n,
            k,
            batch: 1,
            a: Operand::dense(a, m, k),
            b: Operand::dense(b, k, n),
            c,
            c_dtype: dtype,
            ldc: n.max(1),
            stride_c: m * n,
            alpha: 1.0,
            beta: 0.0,
            allow_tf32: false,
            bias: None,
        }
    }

    /// Floating-point operations: `2 * m * n * k` per batch.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch as f64
    }

    /// Is there anything to compute? (An empty `k` still scales `C` by `beta`.)
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0
    }

    /// Checks what both backends need: a float dtype, leading dimensions no shorter
    /// than the rows they step over, and sizes cuBLAS's interface can take.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("gemm: {what} ({self:?})")));
        if !matches!(self.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::DType {
                op: "gemm",
                found: self.dtype,
                supported: "float32, float16, bfloat16",
            });
        }
        if self.c_dtype != self.dtype && self.c_dtype != DType::F32 {
            return bad(format!(
                "the output is {} or float32, not {}",
                self.dtype, self.c_dtype
            ));
        }
        let sizes = [self.m, self.n, self.k, self.batch];
        let lds = [self.a.ld, self.b.ld, self.ldc];
        if sizes.iter().chain(&lds).any(|&s| s > MAX_DIM) {
            return bad(format!(
                "sizes and leading dimensions must be at most {MAX_DIM}"
            ));
        }
        let strides = [self.a.batch_stride, self.b.batch_stride, self.stride_c];
        if strides.iter().any(|&s| s > i64::MAX as usize) {
            return bad("a batch stride does not fit in 64 bits".into());
        }
        let (_, a_cols) = self.a.stored(self.m, self.k);
        let (_, b_cols) = self.b.stored(self.k, self.n);
        for (name, ld, cols) in [
            ("lda", self.a.ld, a_cols),
            ("ldb", self.b.ld, b_cols),
            ("ldc", self.ldc, self.n),
        ] {
            if ld < cols.max(1) {
                return bad(format!(
                    "{name} = {ld} is shorter than a stored row of {cols}"
                ));
            }
        }
        if self.batch > 1 && !self.is_empty() && !self.outputs_apart() {
            return bad(format!(
                "stride_c = {} makes the batch's outputs overlap",
                self.stride_c
            ));
        }
        if self.bias.is_some() && self.batch > 1 {
            return bad(format!(
                "a bias is added to one product's rows: batch must be 1, not {}",
                self.batch
            ));
        }
        Ok(())
    }

    /// The elements the bias spans: `n` when there is one and anything to compute.
    pub fn bias_extent(&self) -> usize {
        match self.bias {
            Some(_) if !self.is_empty() => self.n,
            _ => 0,
        }
    }

    /// The broadcast add of the bias to a dense output (`ldc = n`), in place: what a
    /// backend whose library does not take this product's bias launches after the
    /// product without it. `None` without a bias, or when C's rows are not dense.
    pub fn bias_add(&self) -> Option<Kernel> {
        let bias = self.bias?;
        if self.ldc != self.n || self.batch > 1 {
            return None;
        }
        Some(Kernel::BinaryRows {
            op: BinaryOp::Add,
            dtype: self.c_dtype,
            a: self.c,
            b: bias,
            out: self.c,
            n: self.m * self.n,
            cols: self.n,
            row_first: false,
            alpha: 0.0,
        })
    }

    /// The same product without its bias.
    pub fn without_bias(&self) -> Gemm {
        Gemm {
            bias: None,
            ..*self
        }
    }

    /// Whether the batch's output matrices share no element: one after another
    /// (`stride_c` past a whole matrix), or interleaved row by row (each batch's row
    /// `stride_c` after the previous batch's, all of them within one `ldc`: the heads of
    /// a `[T, H, D]` memory, `D` apart in rows of `H·D`).
    fn outputs_apart(&self) -> bool {
        let stacked = self.stride_c >= (self.m - 1) * self.ldc + self.n;
        let interleaved =
            self.stride_c >= self.n && (self.batch - 1) * self.stride_c + self.n <= self.ldc;
        stacked || interleaved
    }

    /// The elements each operand spans, from its first: `[A, B, C]`. Zero for an
    /// operand nothing reads or writes.
    pub fn extents(&self) -> [usize; 3] {
        let span = |rows: usize, cols: usize, ld: usize, stride: usize| {
            if self.batch == 0 || rows == 0 || cols == 0 {
                0
            } else {
                (self.batch - 1) * stride + (rows - 1) * ld + cols
            }
        };
        let (ar, ac) = self.a.stored(self.m, self.k);
        let (br, bc) = self.b.stored(self.k, self.n);
        if self.is_empty() {
            return [0; 3];
        }
        [
            span(ar, ac, self.a.ld, self.a.batch_stride),
            span(br, bc, self.b.ld, self.b.batch_stride),
            span(self.m, self.n, self.ldc, self.stride_c),
        ]
    }

    /// Rows and columns of A and B as stored: `[(rows_a, cols_a), (rows_b, cols_b)]`.
    pub fn stored_shapes(&self) -> [(usize, usize); 2] {
        [self.a.stored(self.m, self.k), self.b.stored(self.k, self.n)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_products_validate_and_span_their_matrices() {
        let g = Gemm::dense(DType::F32, 3, 7, 5, [0x1000, 0x2000, 0x3000]);
        g.validate().unwrap();
        assert_eq!(g.extents(), [15, 35, 21]);
        assert_eq!(g.flops(), 2.0 * 3.0 * 7.0 * 5.0);
        assert_eq!(g.stored_shapes(), [(3, 5), (5, 7)]);
    }

    #[test]
    fn transposed_and_batched_operands_span_every_batch() {
        let mut g = Gemm::dense(DType::BF16, 2, 4, 3, [0, 0, 0]);
        g.batch = 5;
        // A is [k, m] = [3, 2] stored in rows of 8 elements, one matrix per 100.
        g.a = Operand {
            ptr: 0,
            ld: 8,
            batch_stride: 100,
            transposed: true,
        };
        // B is one [3, 4] weight shared by every batch.
        g.b.batch_stride = 0;
        g.stride_c = 8;
        g.validate().unwrap();
        assert_eq!(g.extents(), [4 * 100 + 2 * 8 + 2, 12, 4 * 8 + 8]);
    }

    #[test]
    fn bad_leading_dimensions_dtypes_and_overlapping_outputs_are_refused() {
        let g = Gemm::dense(DType::F32, 3, 7, 5, [0, 0, 0]);
        let short_a = Gemm {
            a: Operand { ld: 4, ..g.a },
            ..g
        };
        assert!(short_a
            .validate()
            .unwrap_err()
            .to_string()
            .contains("lda = 4"));
        // Transposed, A is stored as [k, m] = [5, 3]: rows of 3 are enough.
        let t = Gemm {
            a: Operand {
                ld: 3,
                transposed: true,
                ..g.a
            },
            ..g
        };
        t.validate().unwrap();
        let ints = Gemm {
            dtype: DType::I32,
            ..g
        };
        assert!(matches!(ints.validate(), Err(Error::DType { .. })));
        let halves_out = Gemm {
            dtype: DType::BF16,
            c_dtype: DType::F16,
            ..g
        };
        assert!(halves_out.validate().is_err());
        Gemm {
            dtype: DType::BF16,
            c_dtype: DType::F32,
            ..g
        }
        .validate()
        .unwrap();
        let overlapping = Gemm {
            batch: 2,
            stride_c: 7,
            ..g
        };
        assert!(overlapping.validate().is_err());
        // Two [3, 2] outputs interleaved in rows of 4 (a [3, 2 heads, 2] memory) share
        // nothing; in rows of 3 they would.
        let interleaved = Gemm {
            m: 3,
            n: 2,
            batch: 2,
            ldc: 4,
            stride_c: 2,
            b: Operand::dense(0, 5, 2),
            ..g
        };
        interleaved.validate().unwrap();
        assert!(Gemm {
            ldc: 3,
            ..interleaved
        }
        .validate()
        .is_err());
        let empty = Gemm { m: 0, ..g };
        empty.validate().unwrap();
        assert_eq!(empty.extents(), [0, 0, 0]);
    }
}
