//! Sums over dimensions. Every reduction is the row sum over the last dimension of
//! dense data (`Kernel::SumRows`, accumulated in float32; few long rows are split over
//! spans in two passes); a sum over other dimensions moves them last first (a permuted
//! view, made dense by one copy when it is not already).

use super::autocast::{AutocastOp, CastPolicy};
use super::graph::GradOp;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::rows::sum_chunks;
use crate::kernels::{Gemm, Kernel, RowKernel};

/// `sum` runs in float32 under autocast (PyTorch's `fp32_set_opt_dtype` list; with no
/// dtype argument here, its input is cast).
pub(super) const SUM: AutocastOp = AutocastOp {
    name: "sum",
    policy: CastPolicy::Fp32SetOptDtype,
};

impl Tensor {
    /// The sum over dimensions `dims` (in any order, each once); `keepdim` keeps them as
    /// size-1 dimensions (PyTorch's `sum(dim, keepdim)`). An empty `dims` sums nothing
    /// and returns a copy, as PyTorch's `sum(dim=[])` does not: use [`Tensor::sum_all`].
    pub fn sum_dims(&self, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(SUM.policy, &[self])? {
            return args[0].sum_dims(dims, keepdim);
        }
        self.reduce_dims("sum", dims, keepdim, 1.0)
    }

    /// The mean over dimensions `dims` (see [`Tensor::sum_dims`]).
    pub fn mean_dims(&self, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        let count: usize = dims
            .iter()
            .map(|&d| self.shape().get(d).copied().unwrap_or(1))
            .product();
        self.reduce_dims("mean", dims, keepdim, 1.0 / count.max(1) as f32)
    }

    /// The sum of every element, as a tensor of shape `[]`.
    pub fn sum_all(&self) -> Result<Tensor> {
        if let Some(args) = super::autocast_args(SUM.policy, &[self])? {
            return args[0].sum_all();
        }
        let dims: Vec<usize> = (0..self.shape().len()).collect();
        self.reduce_dims("sum", &dims, false, 1.0)
    }

    /// The mean of every element, as a tensor of shape `[]`.
    pub fn mean_all(&self) -> Result<Tensor> {
        let dims: Vec<usize> = (0..self.shape().len()).collect();
        self.mean_dims(&dims, false)
    }

    /// Sums `self` down to `shape` over the dimensions broadcasting added or stretched
    /// (the gradient of a broadcast): leading dimensions are summed away, dimensions of
    /// size 1 in `shape` are summed with `keepdim`.
    pub fn sum_to_shape(&self, shape: &[usize]) -> Result<Tensor> {
        let rank = self.shape().len();
        if shape.len() > rank {
            return Err(Error::Shape {
                op: "sum_to_shape",
                a: self.shape().to_vec(),
                b: shape.to_vec(),
            });
        }
        let lead = rank - shape.len();
        let mut dims: Vec<usize> = (0..lead).collect();
        for (i, &want) in shape.iter().enumerate() {
            let have = self.shape()[lead + i];
            if want == 1 && have != 1 {
                dims.push(lead + i);
            } else if want != have {
                return Err(Error::Shape {
                    op: "sum_to_shape",
                    a: self.shape().to_vec(),
                    b: shape.to_vec(),
                });
            }
        }
        if dims.is_empty() {
            return Ok(self.clone());
        }
        self.reduce_dims("sum", &dims, true, 1.0)?.reshape(shape)
    }

    fn reduce_dims(
        &self,
        op: &'static str,
        dims: &[usize],
        keepdim: bool,
        alpha: f32,
    ) -> Result<Tensor> {
        self.check_float_dtype(op)?;
        let rank = self.shape().len();
        let mut reduced = vec![false; rank];
        for &d in dims {
            if d >= rank || std::mem::replace(&mut reduced[d], true) {
                return Err(Error::InvalidArgument(format!(
                    "{op}: dimensions {dims:?} are not distinct dimensions of shape {:?}",
                    self.shape()
                )));
            }
        }
        // The kept dimensions first, in order, then the reduced ones: a row per output
        // element.
        let kept: Vec<usize> = (0..rank).filter(|&d| !reduced[d]).collect();
        let order: Vec<usize> = kept
            .iter()
            .copied()
            .chain((0..rank).filter(|&d| reduced[d]))
            .collect();
        let rows: usize = kept.iter().map(|&d| self.shape()[d]).product();
        let cols: usize = (0..rank)
            .filter(|&d| reduced[d])
            .map(|d| self.shape()[d])
            .product();
        let out_shape: Vec<usize> = if keepdim {
            (0..rank)
                .map(|d| if reduced[d] { 1 } else { self.shape()[d] })
                .collect()
        } else {
            kept.iter().map(|&d| self.shape()[d]).collect()
        };
        let op = GradOp::Sum {
            dims: dims.to_vec(),
            keepdim,
            input: self.shape().to_vec(),
            scale: alpha,
        };
        if cols == 0 {
            // The sum of nothing is zero (and the kernel would not run).
            let out = Tensor::zeros(&out_shape, self.dtype(), self.device())?;
            return Ok(Tensor::recorded(out, op, &[self], vec![]));
        }
        let out = Tensor::empty(&out_shape, self.dtype(), self.device())?;
        // The leading dimensions of dense data (a bias's gradient, summed over the batch
        // and positions): sums down the columns of `[cols, rows]`, read in place.
        let leading = (0..rank).all(|d| reduced[d] == (d < dims.len()));
        if leading && self.is_contiguous() && rows > 1 && cols > 1 && cols <= i32::MAX as usize {
            launch_column_sums(self, &out, cols, rows, alpha)?;
            return Ok(Tensor::recorded(out, op, &[self], vec![]));
        }
        let dense = self.detach().permute(&order)?.contiguous()?;
        launch_row_sums(&dense, &out, rows, cols, alpha)?;
        Ok(Tensor::recorded(out, op, &[self], vec![]))
    }
}

/// `out[c] = alpha * sum(x[.., c])` over a dense `[rows, cols]` tensor, without moving
/// the summed dimension last (a transposing copy): one product `ones[1, rows] @ x`,
/// accumulated in float32 like the row sums (PyTorch's column reductions read in place
/// too).
fn launch_column_sums(
    x: &Tensor,
    out: &Tensor,
    rows: usize,
    cols: usize,
    alpha: f32,
) -> Result<()> {
    let device = x.device();
    let ones = match x.dtype() {
        DType::F16 => Tensor::full(&[rows], half::f16::ONE, device)?,
        DType::BF16 => Tensor::full(&[rows], half::bf16::ONE, device)?,
        _ => Tensor::full(&[rows], 1.0f32, device)?,
    };
    let mut gemm = Gemm::dense(x.dtype(), 1, cols, rows, [ones.ptr(), x.ptr(), out.ptr()]);
    gemm.alpha = alpha;
    device.launch(&Kernel::Gemm(gemm))
}

/// `out[r] = alpha * sum(x[r, ..])` over a dense `[rows, cols]` tensor: one warp per row
/// when the rows are many, else split over spans in two deterministic passes (a
/// `sum_all` of 1e8 elements would otherwise be one warp's work).
fn launch_row_sums(x: &Tensor, out: &Tensor, rows: usize, cols: usize, alpha: f32) -> Result<()> {
    let device = x.device();
    let chunks = sum_chunks(rows, cols);
    if chunks == 1 {
        return device.launch(&Kernel::SumRows {
            dtype: x.dtype(),
            x: x.ptr(),
            out: out.ptr(),
            rows,
            cols,
            alpha,
        });
    }
    let partial = Tensor::empty(&[rows, chunks], DType::F32, device)?;
    device.launch(&Kernel::Rows(RowKernel::SumPartials {
        dtype: x.dtype(),
        x: x.ptr(),
        partial: partial.ptr(),
        rows,
        cols,
        chunks,
    }))?;
    device.launch(&Kernel::Rows(RowKernel::SumFinish {
        dtype: x.dtype(),
        partial: partial.ptr(),
        out: out.ptr(),
        rows,
        chunks,
        alpha,
    }))
}
