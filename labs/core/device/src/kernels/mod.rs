//! The kernels every backend runs. An op is declared once, in [`ops`], with its CUDA C
//! expression and its CPU twin; [`source`] generates the CUDA modules from those
//! declarations (compiled by NVRTC at run time on `cuda`), and [`cpu`] runs the twins
//! on `sim` and `cpu`.
//!
//! A new unary or binary op is one entry in `ops.rs`: its kernel for every float dtype
//! (and every integer dtype when the entry has an integer expression), dense and
//! strided, its launch arguments and its simulator loop all follow from the entry.
//!
//! The row kernels of a training step (softmax, layer norm, dropout, embedding, losses,
//! max, split sums) are [`RowKernel`]s: `kernels/rows.cu` for every float dtype, their
//! twins in `cpu_rows.rs`.
//!
//! The matrix product, [`Gemm`], is a launch like the others but a library's: cuBLAS on
//! `cuda` (cuBLASLt for a product with a bias), a CPU GEMM crate on `sim` and `cpu`.
//!
//! Binary ops on operands of two different float dtypes (`f32 + bf16`) read each in its
//! own dtype: [`MixedBinary`], `kernels/mixed.cu`, twins in `mixed_cpu.rs`.
//!
//! Attention has two sets: the fused kernels ([`AttentionKernel`], `kernels/attention.cu`,
//! twins in `attention_cpu.rs`), and the row kernels that chunked attention runs between
//! its matrix products ([`AttentionChunkKernel`], `kernels/attention_chunk.cu`, twins in
//! `attention_chunk_cpu.rs`), one module per float dtype.

mod amp;
mod amp_cpu;
pub mod attention;
pub mod attention_chunk;
mod attention_chunk_cpu;
mod attention_cpu;
pub mod cpu;
mod cpu_rows;
mod cpu_softmax;
mod gemm;
mod gemm_cpu;
mod mixed;
mod mixed_cpu;
pub mod ops;
mod optim;
mod optim_cpu;
pub mod rows;
pub mod source;
pub mod special;
mod strided;

pub use amp::{UnscaleGrad, UpdateScale};
pub use attention::{
    attention_keep_row, flash_serves, AttentionDropout, AttentionKernel, AttentionShape,
    HeadsOperand, ATTENTION_MAX_HEAD_DIM, FLASH_HEAD_DIMS,
};
pub use attention_chunk::{AttentionChunkKernel, ScoreChunk};
pub use gemm::{Gemm, Operand};
pub use mixed::{MixedBinary, MixedForm};
pub use ops::{BinaryOp, CompareOp, UnaryOp};
pub use optim::{AdamStep, SgdStep};
pub use rows::RowKernel;
pub use source::Module;
pub use strided::{Strided, MAX_DIMS, TILE, TILED_MIN_SIZE};

use crate::device_id::DevicePtr;
use crate::dtype::DType;
use crate::error::Result;

/// One kernel launch with its arguments. Pointers are device addresses; `n` counts
/// elements.
#[derive(Debug, Clone, PartialEq)]
pub enum Kernel {
    /// `out[i] = op(x[i])` over `n` contiguous elements (a float dtype, or an integer
    /// dtype for the ops with an integer expression).
    Unary {
        op: UnaryOp,
        dtype: DType,
        x: DevicePtr,
        out: DevicePtr,
        n: usize,
        /// The scalar some ops use (`scale`'s factor); ignored by the others.
        alpha: f32,
    },
    /// `out[i] = op(a[i], b[i])` over `n` contiguous elements (dtypes as for `Unary`).
    Binary {
        op: BinaryOp,
        dtype: DType,
        a: DevicePtr,
        b: DevicePtr,
        out: DevicePtr,
        n: usize,
        /// The scalar some ops use (`axpy`'s factor); ignored by the others.
        alpha: f32,
    },
    /// Standard-normal float32 samples; element `i` depends only on `(seed, offset + i)`.
    Randn {
        out: DevicePtr,
        n: usize,
        seed: u64,
        offset: u64,
    },
    /// `out[i] = start + i`, int64 (`torch.arange`): positions made on the device.
    Arange {
        out: DevicePtr,
        n: usize,
        start: i64,
    },
    /// `iterations` dependent multiply-adds on each float32 element: busy work of a
    /// chosen length.
    Spin {
        x: DevicePtr,
        n: usize,
        iterations: u32,
    },
    /// `out[r] = alpha * sum(x[r * cols .. (r + 1) * cols])` over `rows` contiguous rows
    /// of a float dtype, accumulated in float32 (a sum over the last dimension; other
    /// reductions move their dimension last first).
    SumRows {
        dtype: DType,
        x: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        alpha: f32,
    },
    /// Gathers the strided view at `src` (the address of its first element) into `n`
    /// contiguous elements of `width` bytes at `dst`.
    StridedCopy {
        width: usize,
        src: DevicePtr,
        dst: DevicePtr,
        layout: Strided,
        n: usize,
    },
    /// A batched, strided matrix product (see [`Gemm`]). It is a variant rather than a
    /// method of its own in the backend contract because it is one more launch: it is
    /// ordered on the stream it is given, the simulator enqueues it like any twin, and
    /// everything above the contract launches it through `Device::launch`. Only its
    /// implementation differs: cuBLAS rather than a generated module.
    Gemm(Gemm),
    /// One fused SGD step of a parameter (see [`SgdStep`]).
    SgdStep(SgdStep),
    /// One fused Adam or AdamW step of a parameter (see [`AdamStep`]).
    AdamStep(AdamStep),
    /// The gradient scaler's unscale and non-finite check of one gradient (see
    /// [`UnscaleGrad`]).
    UnscaleGrad(UnscaleGrad),
    /// The gradient scaler's update of its scale and growth tracker, on the device (see
    /// [`UpdateScale`]): one thread.
    UpdateScale(UpdateScale),
    /// `out[i] = op(a[a_layout(i)], b[b_layout(i)])` into `n` dense elements: a binary op
    /// on operands of any layout, broadcast ones (stride 0) included. `a` and `b` are the
    /// addresses of each view's first element.
    BinaryStrided {
        op: BinaryOp,
        dtype: DType,
        a: DevicePtr,
        a_layout: Strided,
        b: DevicePtr,
        b_layout: Strided,
        out: DevicePtr,
        n: usize,
        alpha: f32,
    },
    /// `out[i] = op(a[i], b[i % cols])` into `n` dense elements (with `row_first`,
    /// `op(a[i % cols], b[i])`): a binary op of a dense operand and a dense row of `cols`
    /// elements repeated over it (a bias `[n]` over `[rows, n]`, or any block of
    /// trailing dimensions over the leading ones, flattened), without the strided
    /// kernel's per-element index arithmetic. The same values as `BinaryStrided`, bit
    /// for bit.
    BinaryRows {
        op: BinaryOp,
        dtype: DType,
        a: DevicePtr,
        b: DevicePtr,
        out: DevicePtr,
        n: usize,
        cols: usize,
        row_first: bool,
        alpha: f32,
    },
    /// A binary op on operands of two different float dtypes, each read in its own
    /// dtype, into float32 (see [`MixedBinary`]): no cast kernel before it.
    MixedBinary(MixedBinary),
    /// `out[i] = op(a[i], b[i]) ? 1 : 0` into `n` dense uint8 elements, operands strided
    /// as in `BinaryStrided`, of one dtype (any).
    Compare {
        op: CompareOp,
        dtype: DType,
        a: DevicePtr,
        a_layout: Strided,
        b: DevicePtr,
        b_layout: Strided,
        out: DevicePtr,
        n: usize,
    },
    /// `out[i] = cond[i] ? a[i] : b[i]` into `n` dense elements of `dtype`; `cond` is
    /// uint8, every operand strided.
    Where {
        dtype: DType,
        cond: DevicePtr,
        cond_layout: Strided,
        a: DevicePtr,
        a_layout: Strided,
        b: DevicePtr,
        b_layout: Strided,
        out: DevicePtr,
        n: usize,
    },
    /// `n` dense elements of `from` converted to `to` (see `kernels/cast.cu`).
    Cast {
        from: DType,
        to: DType,
        x: DevicePtr,
        out: DevicePtr,
        n: usize,
    },
    /// Writes `n` contiguous elements of `width` bytes at `src` into the strided view at
    /// `dst` (the address of its first element): the inverse of [`Kernel::StridedCopy`].
    /// The view must not overlap itself (no stride 0), or writes would race.
    StridedScatter {
        width: usize,
        src: DevicePtr,
        dst: DevicePtr,
        layout: Strided,
        n: usize,
    },
    /// A row kernel of a training step (softmax, layer norm, dropout, ...: see
    /// [`RowKernel`]).
    Rows(RowKernel),
    /// A fused attention kernel (forward, or a step of its backward: see
    /// [`AttentionKernel`]).
    Attention(AttentionKernel),
    /// A row kernel of chunked attention, between its matrix products (see
    /// [`AttentionChunkKernel`]).
    AttentionChunk(AttentionChunkKernel),
}

impl Kernel {
    /// `out = alpha * x` over float32 (`out` may be `x`).
    pub fn scale(x: DevicePtr, alpha: f32, out: DevicePtr, n: usize) -> Kernel {
        Kernel::Unary {
            op: UnaryOp::Scale,
            dtype: DType::F32,
            x,
            out,
            n,
            alpha,
        }
    }

    /// `y = alpha * x + y` over float32, the BLAS axpy.
    pub fn axpy(alpha: f32, x: DevicePtr, y: DevicePtr, n: usize) -> Kernel {
        Kernel::Binary {
            op: BinaryOp::Axpy,
            dtype: DType::F32,
            a: x,
            b: y,
            out: y,
            n,
            alpha,
        }
    }

    /// The module and function that implement this kernel on the GPU; an error for a
    /// dtype or element width no kernel is generated for, and for [`Kernel::Gemm`],
    /// which cuBLAS implements.
    pub fn function(&self) -> Result<(&'static Module, &'static str)> {
        source::function(self)
    }

    /// The tiled-transpose kernel of a strided copy or scatter (the GPU runs it for
    /// views that [`Strided::transposed_dim`] calls transposes); an error for others.
    pub fn tiled_function(&self) -> Result<(&'static Module, &'static str)> {
        source::tiled_function(self)
    }

    /// Number of elements the launch covers (sets the grid size; a GEMM's output).
    pub fn elements(&self) -> usize {
        match *self {
            Kernel::Unary { n, .. }
            | Kernel::Binary { n, .. }
            | Kernel::Randn { n, .. }
            | Kernel::Arange { n, .. }
            | Kernel::Spin { n, .. }
            | Kernel::StridedCopy { n, .. }
            | Kernel::BinaryStrided { n, .. }
            | Kernel::BinaryRows { n, .. }
            | Kernel::Compare { n, .. }
            | Kernel::Where { n, .. }
            | Kernel::Cast { n, .. }
            | Kernel::StridedScatter { n, .. } => n,
            // One warp (32 threads) per row.
            Kernel::SumRows { rows, cols, .. } => {
                if cols == 0 {
                    0
                } else {
                    rows.saturating_mul(32)
                }
            }
            Kernel::MixedBinary(m) => m.n,
            Kernel::Gemm(g) => g.m * g.n * g.batch,
            Kernel::SgdStep(s) => s.n,
            Kernel::AdamStep(s) => s.n,
            Kernel::UnscaleGrad(u) => u.n,
            Kernel::UpdateScale(_) => 1,
            Kernel::Rows(ref k) => k.elements(),
            Kernel::Attention(ref k) => k.elements(),
            Kernel::AttentionChunk(ref k) => k.elements(),
        }
    }
}
