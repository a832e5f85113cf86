//! The kernels every backend runs. An op is declared once, in [`ops`], with its CUDA C
//! expression and its CPU twin; [`source`] generates the CUDA modules from those
//! declarations (compiled by NVRTC at run time on `cuda`), and [`cpu`] runs the twins
//! on `sim` and `cpu`.
//!
//! A new unary or binary op is one entry in `ops.rs`: its kernel for every float dtype,
//! its launch arguments and its simulator loop all follow from the entry.
//!
//! The matrix product, [`Gemm`], is a launch like the others but a library's: cuBLAS on
//! `cuda`, a CPU GEMM crate on `sim` and `cpu`.

pub mod cpu;
mod gemm;
pub mod ops;
mod optim;
mod optim_cpu;
pub mod source;
mod strided;

pub use gemm::{Gemm, Operand};
pub use ops::{BinaryOp, UnaryOp};
pub use optim::{AdamStep, SgdStep};
pub use source::Module;
pub use strided::{Strided, MAX_DIMS};

use crate::device_id::DevicePtr;
use crate::dtype::DType;
use crate::error::Result;

/// One kernel launch with its arguments. Pointers are device addresses; `n` counts
/// elements.
#[derive(Debug, Clone, PartialEq)]
pub enum Kernel {
    /// `out[i] = op(x[i])` over `n` contiguous elements of a float dtype.
    Unary {
        op: UnaryOp,
        dtype: DType,
        x: DevicePtr,
        out: DevicePtr,
        n: usize,
        /// The scalar some ops use (`scale`'s factor); ignored by the others.
        alpha: f32,
    },
    /// `out[i] = op(a[i], b[i])` over `n` contiguous elements of a float dtype.
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

    /// Number of elements the launch covers (sets the grid size; a GEMM's output).
    pub fn elements(&self) -> usize {
        match *self {
            Kernel::Unary { n, .. }
            | Kernel::Binary { n, .. }
            | Kernel::Randn { n, .. }
            | Kernel::Spin { n, .. }
            | Kernel::StridedCopy { n, .. } => n,
            // One warp (32 threads) per row.
            Kernel::SumRows { rows, cols, .. } => {
                if cols == 0 {
                    0
                } else {
                    rows.saturating_mul(32)
                }
            }
            Kernel::Gemm(g) => g.m * g.n * g.batch,
            Kernel::SgdStep(s) => s.n,
            Kernel::AdamStep(s) => s.n,
        }
    }
}
