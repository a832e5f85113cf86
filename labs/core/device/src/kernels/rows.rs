//! The row kernels of a training step: softmax, layer norm, dropout, embedding, the
//! negative log-likelihood, max over a row. Each works on a dense `[rows, cols]` view
//! (the tensor layer moves the dimension it works on last first) and exists for every
//! float dtype, computing in `float` as the elementwise kernels do. The CUDA C is
//! `kernels/rows.cu`, the twins are in `cpu_rows.rs`.

use crate::device_id::DevicePtr;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One launch of a row kernel; pointers are device addresses. Optional pointers are
/// passed to the GPU as 0.
#[derive(Debug, Clone, PartialEq)]
pub enum RowKernel {
    /// `out` = softmax (or, with `log`, log_softmax) of each row of `x`, max-subtracted.
    /// `x` is `dtype`, `out` is `y_dtype`: `dtype` itself, or float32 for a half
    /// `dtype` (PyTorch's `half_to_float`: the half input read, float32 written).
    Softmax {
        dtype: DType,
        y_dtype: DType,
        x: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        log: bool,
    },
    /// From the saved output `y` and the output's gradient: `y * (g - sum(g * y))`, or
    /// with `log`, `g - exp(y) * sum(g)`. `y` and `grad` are `y_dtype` (the forward's
    /// output dtype), `out` is `dtype` (the forward's input dtype).
    SoftmaxBackward {
        dtype: DType,
        y_dtype: DType,
        y: DevicePtr,
        grad: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        log: bool,
    },
    /// `out = (x - mean) * rstd * weight + bias` per row; writes each row's mean and
    /// `rstd = 1 / sqrt(var + eps)` (biased variance) as float32.
    LayerNorm {
        dtype: DType,
        x: DevicePtr,
        weight: Option<DevicePtr>,
        bias: Option<DevicePtr>,
        out: DevicePtr,
        mean: DevicePtr,
        rstd: DevicePtr,
        rows: usize,
        cols: usize,
        eps: f32,
    },
    /// The input's gradient of a layer norm, row by row.
    LayerNormBackward {
        dtype: DType,
        x: DevicePtr,
        weight: Option<DevicePtr>,
        grad: DevicePtr,
        mean: DevicePtr,
        rstd: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
    },
    /// The first pass of the weight's and bias's gradients of a layer norm: the rows
    /// cut into `chunks` spans of `ceil(rows / chunks)`, one thread per (span, column)
    /// writing float32 `partial[0][k][c] = sum g * xhat` and `partial[1][k][c] = sum g`
    /// over its span's rows, in order (deterministic).
    LayerNormParamGrads {
        dtype: DType,
        x: DevicePtr,
        grad: DevicePtr,
        mean: DevicePtr,
        rstd: DevicePtr,
        partial: DevicePtr,
        rows: usize,
        cols: usize,
        chunks: usize,
    },
    /// The second pass: `dweight[c]` and `dbias[c]` (each optional) the sums of the
    /// column's partial sums, a thread per column, rounded once to `dtype`.
    LayerNormParamFinish {
        dtype: DType,
        partial: DevicePtr,
        dweight: Option<DevicePtr>,
        dbias: Option<DevicePtr>,
        cols: usize,
        chunks: usize,
    },
    /// Element `i` is kept when the Philox4x32-10 uniform of counter `offset + i` under
    /// key `seed` is below `keep`; kept elements are scaled by `scale`, the mask (one
    /// byte per element) records which.
    Dropout {
        dtype: DType,
        x: DevicePtr,
        out: DevicePtr,
        mask: DevicePtr,
        n: usize,
        keep: f32,
        scale: f32,
        seed: u64,
        offset: u64,
    },
    /// `out[i] = mask[i] ? x[i] * scale : 0` (dropout's backward).
    MaskedScale {
        dtype: DType,
        x: DevicePtr,
        mask: DevicePtr,
        out: DevicePtr,
        n: usize,
        scale: f32,
    },
    /// `out[j, :] = weight[indices[j], :]` for `n` int64 indices into `vocab` rows of
    /// `dim`; an index out of range gives a row of zeros (the tensor layer refuses
    /// them first where it can read the indices cheaply).
    Embedding {
        dtype: DType,
        weight: DevicePtr,
        indices: DevicePtr,
        out: DevicePtr,
        n: usize,
        dim: usize,
        vocab: usize,
    },
    /// `out[indices[j], :] += grad[j, :]` into a zeroed float32 `[vocab, dim]` buffer
    /// (atomic adds on the GPU, in order in the twin); out-of-range indices are skipped.
    EmbeddingBackward {
        dtype: DType,
        grad: DevicePtr,
        indices: DevicePtr,
        out: DevicePtr,
        n: usize,
        dim: usize,
        vocab: usize,
    },
    /// `out[i] = x[i]` from float32 to `dtype`, rounded to nearest even.
    NarrowF32 {
        dtype: DType,
        x: DevicePtr,
        out: DevicePtr,
        n: usize,
    },
    /// The mean negative log-likelihood of `rows` rows of log-probabilities at int64
    /// `target`s, skipping `ignore_index`: `out[0]` gets the mean (NaN when every row is
    /// ignored, as PyTorch), `count[0]` (float32) the number of rows counted. One warp.
    NllLoss {
        dtype: DType,
        logp: DevicePtr,
        target: DevicePtr,
        out: DevicePtr,
        count: DevicePtr,
        rows: usize,
        cols: usize,
        ignore_index: i64,
    },
    /// `out[r, c] = -grad[0] / count[0]` where `c == target[r]` (not ignored), else 0.
    NllLossBackward {
        dtype: DType,
        grad: DevicePtr,
        count: DevicePtr,
        target: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        ignore_index: i64,
    },
    /// `out[i] = scale * (x[i] - y[i]) * grad[0]` over `n` elements: `mse_loss`'s
    /// input gradient (`scale` = 2 / n) in one pass and one output, as PyTorch's
    /// `mse_backward` kernel, which reads the saved input and target and writes nothing
    /// else.
    MseLossBackward {
        dtype: DType,
        grad: DevicePtr,
        x: DevicePtr,
        y: DevicePtr,
        out: DevicePtr,
        n: usize,
        scale: f32,
    },
    /// The largest element of each row and its int64 column; ties give the first
    /// column, and a NaN counts as larger than any number (as PyTorch's `max`).
    MaxRows {
        dtype: DType,
        x: DevicePtr,
        values: DevicePtr,
        indices: DevicePtr,
        rows: usize,
        cols: usize,
    },
    /// `out[r, indices[r]] = grad[r]` into a zeroed `[rows, cols]` tensor.
    ScatterRows {
        dtype: DType,
        grad: DevicePtr,
        indices: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
    },
    /// The first pass of a sum over few long rows: each row cut into `chunks` spans of
    /// `ceil(cols / chunks)` columns, one warp per span, its float32 sum written to
    /// `partial[r * chunks + k]`. The split is fixed by the shape, so the result is
    /// deterministic.
    SumPartials {
        dtype: DType,
        x: DevicePtr,
        partial: DevicePtr,
        rows: usize,
        cols: usize,
        chunks: usize,
    },
    /// The second pass: `out[r] = alpha * sum(partial[r * chunks ..][..chunks])`, one
    /// warp per row, rounded once to `dtype`.
    SumFinish {
        dtype: DType,
        partial: DevicePtr,
        out: DevicePtr,
        rows: usize,
        chunks: usize,
        alpha: f32,
    },
}

/// The functions of each dtype's row module, in module order (the CUDA function is
/// `{name}_{dtype}`).
pub const ROW_FUNCTIONS: [&str; 20] = [
    "softmax_rows",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_param_grads",
    "dropout",
    "masked_scale",
    "embedding",
    "embedding_backward",
    "narrow_f32",
    "nll_loss",
    "nll_loss_backward",
    "max_rows",
    "scatter_rows",
    "sum_partials",
    "sum_finish",
    "layer_norm_param_finish",
    "softmax_rows_to_f32",
    "softmax_backward_from_f32",
    "mse_loss_backward",
];

/// One kernel argument as the CUDA launch passes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param {
    U64(u64),
    U32(u32),
    F32(f32),
}

/// Threads for one warp per row (0 when rows are empty: the launch is skipped).
fn warp_rows(rows: usize, cols: usize) -> usize {
    if cols == 0 {
        0
    } else {
        rows.saturating_mul(32)
    }
}

impl RowKernel {
    pub fn dtype(&self) -> DType {
        use RowKernel::*;
        match *self {
            Softmax { dtype, .. }
            | SoftmaxBackward { dtype, .. }
            | LayerNorm { dtype, .. }
            | LayerNormBackward { dtype, .. }
            | LayerNormParamGrads { dtype, .. }
            | Dropout { dtype, .. }
            | MaskedScale { dtype, .. }
            | Embedding { dtype, .. }
            | EmbeddingBackward { dtype, .. }
            | NarrowF32 { dtype, .. }
            | NllLoss { dtype, .. }
            | NllLossBackward { dtype, .. }
            | MseLossBackward { dtype, .. }
            | MaxRows { dtype, .. }
            | ScatterRows { dtype, .. }
            | SumPartials { dtype, .. }
            | SumFinish { dtype, .. }
            | LayerNormParamFinish { dtype, .. } => dtype,
        }
    }

    /// Position of the kernel's function in [`ROW_FUNCTIONS`].
    pub fn index(&self) -> usize {
        use RowKernel::*;
        match self {
            Softmax { dtype, y_dtype, .. } if dtype != y_dtype => 17,
            SoftmaxBackward { dtype, y_dtype, .. } if dtype != y_dtype => 18,
            Softmax { .. } => 0,
            SoftmaxBackward { .. } => 1,
            LayerNorm { .. } => 2,
            LayerNormBackward { .. } => 3,
            LayerNormParamGrads { .. } => 4,
            Dropout { .. } => 5,
            MaskedScale { .. } => 6,
            Embedding { .. } => 7,
            EmbeddingBackward { .. } => 8,
            NarrowF32 { .. } => 9,
            NllLoss { .. } => 10,
            NllLossBackward { .. } => 11,
            MaxRows { .. } => 12,
            ScatterRows { .. } => 13,
            SumPartials { .. } => 14,
            SumFinish { .. } => 15,
            LayerNormParamFinish { .. } => 16,
            MseLossBackward { .. } => 19,
        }
    }

    pub fn name(&self) -> &'static str {
        ROW_FUNCTIONS[self.index()]
    }

    /// An error unless the kernel's dtypes pair as a kernel exists for: a softmax's
    /// output (and its backward's saved output and gradient) is the input's dtype, or
    /// float32 for a half-precision input.
    pub fn check_dtypes(&self) -> Result<()> {
        use RowKernel::*;
        let (Softmax { dtype, y_dtype, .. } | SoftmaxBackward { dtype, y_dtype, .. }) = *self
        else {
            return Ok(());
        };
        let half = matches!(dtype, DType::F16 | DType::BF16);
        if y_dtype == dtype || (half && y_dtype == DType::F32) {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{}: no kernel from {dtype} to {y_dtype} (the output is the input's dtype, or \
             float32 for a half-precision input)",
            self.name()
        )))
    }

    /// Threads the launch needs (sets the grid; the kernels' loops cover any grid).
    pub fn elements(&self) -> usize {
        use RowKernel::*;
        match *self {
            Softmax { rows, cols, .. }
            | SoftmaxBackward { rows, cols, .. }
            | LayerNorm { rows, cols, .. }
            | LayerNormBackward { rows, cols, .. }
            | MaxRows { rows, cols, .. } => warp_rows(rows, cols),
            LayerNormParamGrads { cols, chunks, .. } => chunks * cols,
            LayerNormParamFinish { cols, .. } => cols,
            Dropout { n, .. }
            | MaskedScale { n, .. }
            | NarrowF32 { n, .. }
            | MseLossBackward { n, .. } => n,
            Embedding { n, dim, .. } | EmbeddingBackward { n, dim, .. } => n * dim,
            // One warp for the whole batch: the rows of a loss are few.
            NllLoss { rows, .. } => {
                if rows == 0 {
                    0
                } else {
                    32
                }
            }
            NllLossBackward { rows, cols, .. } => rows * cols,
            ScatterRows { rows, .. } => rows,
            SumPartials {
                rows, cols, chunks, ..
            } => warp_rows(rows * chunks, cols),
            SumFinish { rows, chunks, .. } => warp_rows(rows, chunks),
        }
    }

    /// The arguments in the order of the C signature in `kernels/rows.cu`.
    pub fn params(&self) -> Vec<Param> {
        use Param::*;
        use RowKernel::*;
        let u = |v: usize| U64(v as u64);
        let opt = |p: Option<DevicePtr>| U64(p.unwrap_or(0));
        match *self {
            Softmax {
                x,
                out,
                rows,
                cols,
                log,
                ..
            } => vec![U64(x), U64(out), u(rows), u(cols), U32(log as u32)],
            SoftmaxBackward {
                y,
                grad,
                out,
                rows,
                cols,
                log,
                ..
            } => vec![
                U64(y),
                U64(grad),
                U64(out),
                u(rows),
                u(cols),
                U32(log as u32),
            ],
            LayerNorm {
                x,
                weight,
                bias,
                out,
                mean,
                rstd,
                rows,
                cols,
                eps,
                ..
            } => vec![
                U64(x),
                opt(weight),
                opt(bias),
                U64(out),
                U64(mean),
                U64(rstd),
                u(rows),
                u(cols),
                F32(eps),
            ],
            LayerNormBackward {
                x,
                weight,
                grad,
                mean,
                rstd,
                out,
                rows,
                cols,
                ..
            } => vec![
                U64(x),
                opt(weight),
                U64(grad),
                U64(mean),
                U64(rstd),
                U64(out),
                u(rows),
                u(cols),
            ],
            LayerNormParamGrads {
                x,
                grad,
                mean,
                rstd,
                partial,
                rows,
                cols,
                chunks,
                ..
            } => vec![
                U64(x),
                U64(grad),
                U64(mean),
                U64(rstd),
                U64(partial),
                u(rows),
                u(cols),
                u(chunks),
            ],
            LayerNormParamFinish {
                partial,
                dweight,
                dbias,
                cols,
                chunks,
                ..
            } => vec![U64(partial), opt(dweight), opt(dbias), u(cols), u(chunks)],
            Dropout {
                x,
                out,
                mask,
                n,
                keep,
                scale,
                seed,
                offset,
                ..
            } => vec![
                U64(x),
                U64(out),
                U64(mask),
                u(n),
                F32(keep),
                F32(scale),
                U64(seed),
                U64(offset),
            ],
            MaskedScale {
                x,
                mask,
                out,
                n,
                scale,
                ..
            } => vec![U64(x), U64(mask), U64(out), u(n), F32(scale)],
            Embedding {
                weight,
                indices,
                out,
                n,
                dim,
                vocab,
                ..
            }
            | EmbeddingBackward {
                grad: weight,
                indices,
                out,
                n,
                dim,
                vocab,
                ..
            } => vec![U64(weight), U64(indices), U64(out), u(n), u(dim), u(vocab)],
            NarrowF32 { x, out, n, .. } => vec![U64(x), U64(out), u(n)],
            NllLoss {
                logp,
                target,
                out,
                count,
                rows,
                cols,
                ignore_index,
                ..
            } => vec![
                U64(logp),
                U64(target),
                U64(out),
                U64(count),
                u(rows),
                u(cols),
                U64(ignore_index as u64),
            ],
            NllLossBackward {
                grad,
                count,
                target,
                out,
                rows,
                cols,
                ignore_index,
                ..
            } => vec![
                U64(grad),
                U64(count),
                U64(target),
                U64(out),
                u(rows),
                u(cols),
                U64(ignore_index as u64),
            ],
            MseLossBackward {
                grad,
                x,
                y,
                out,
                n,
                scale,
                ..
            } => vec![U64(grad), U64(x), U64(y), U64(out), u(n), F32(scale)],
            MaxRows {
                x,
                values,
                indices,
                rows,
                cols,
                ..
            } => vec![U64(x), U64(values), U64(indices), u(rows), u(cols)],
            ScatterRows {
                grad,
                indices,
                out,
                rows,
                cols,
                ..
            } => vec![U64(grad), U64(indices), U64(out), u(rows), u(cols)],
            SumPartials {
                x,
                partial,
                rows,
                cols,
                chunks,
                ..
            } => vec![U64(x), U64(partial), u(rows), u(cols), u(chunks)],
            SumFinish {
                partial,
                out,
                rows,
                chunks,
                alpha,
                ..
            } => vec![U64(partial), U64(out), u(rows), u(chunks), F32(alpha)],
        }
    }
}

/// How many spans a sum over `rows` rows of `cols` columns is split into: 1 (one warp
/// per row, `Kernel::SumRows`) unless the rows are too few to fill a GPU, then enough
/// spans of at least 4096 columns for about 16384 warps in all.
pub fn sum_chunks(rows: usize, cols: usize) -> usize {
    const SPAN: usize = 4096;
    const WARPS: usize = 16384;
    if rows == 0 || cols <= SPAN {
        return 1;
    }
    cols.div_ceil(SPAN).min(WARPS / rows).max(1)
}

/// How many spans of rows the weight and bias gradients of a layer norm over `rows`
/// rows are cut into: spans of 64 rows, so that a long batch still gives every column
/// many threads.
pub fn layer_norm_chunks(rows: usize) -> usize {
    rows.div_ceil(64).max(1)
}

/// One Philox4x32-10 block (Salmon et al., "Parallel random numbers: as easy as 1, 2,
/// 3", SC 2011): four 32-bit words from a 128-bit counter and a 64-bit key. The same
/// arithmetic as `philox4x32_10` in `kernels/rows.cu`, so a mask is the same bits on
/// every backend.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The uniform in `[0, 1)` (24 bits) dropout draws for element counter `counter`
/// under `seed`: the first word of the block of counter `(lo, hi, 0, 0)`.
pub fn dropout_uniform(seed: u64, counter: u64) -> f32 {
    let w = philox4x32_10(
        [counter as u32, (counter >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    (w[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_random123_known_answers() {
        // kat_vectors of Random123 for philox4x32_10.
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn row_kernels_live_in_their_dtype_module_and_refuse_other_dtypes() {
        use crate::kernels::Kernel;
        let softmax = |dtype| {
            Kernel::Rows(RowKernel::Softmax {
                dtype,
                y_dtype: dtype,
                x: 0,
                out: 0,
                rows: 1,
                cols: 1,
                log: false,
            })
        };
        let (m, f) = softmax(DType::BF16).function().unwrap();
        assert_eq!((m.name.as_str(), f), ("rows_bf16", "softmax_rows_bf16"));
        assert!(m.source.contains("typedef unsigned short ELEM;"));
        assert!(!m.source.contains("_DT("), "every function renamed");
        assert_eq!(m.functions.len(), ROW_FUNCTIONS.len());
        let (m, f) = softmax(DType::F32).function().unwrap();
        assert_eq!((m.name.as_str(), f), ("rows_f32", "softmax_rows_f32"));
        assert!(softmax(DType::I64).function().is_err());
        let finish = Kernel::Rows(RowKernel::SumFinish {
            dtype: DType::F16,
            partial: 0,
            out: 0,
            rows: 2,
            chunks: 3,
            alpha: 1.0,
        });
        assert_eq!(finish.function().unwrap().1, "sum_finish_f16");
        assert_eq!(finish.elements(), 64);
    }

    #[test]
    fn half_in_float_out_softmax_has_its_own_functions_and_refuses_other_pairs() {
        use crate::kernels::Kernel;
        let forward = |dtype, y_dtype| RowKernel::Softmax {
            dtype,
            y_dtype,
            x: 0,
            out: 0,
            rows: 1,
            cols: 1,
            log: true,
        };
        let backward = |dtype, y_dtype| RowKernel::SoftmaxBackward {
            dtype,
            y_dtype,
            y: 0,
            grad: 0,
            out: 0,
            rows: 1,
            cols: 1,
            log: true,
        };
        let f = Kernel::Rows(forward(DType::BF16, DType::F32))
            .function()
            .unwrap();
        assert_eq!(
            (f.0.name.as_str(), f.1),
            ("rows_bf16", "softmax_rows_to_f32_bf16")
        );
        let b = Kernel::Rows(backward(DType::F16, DType::F32))
            .function()
            .unwrap();
        assert_eq!(b.1, "softmax_backward_from_f32_f16");
        assert!(b
            .0
            .source
            .contains("void softmax_backward_from_f32_f16(const float*"));
        assert_eq!(forward(DType::F16, DType::F16).name(), "softmax_rows");
        assert_eq!(backward(DType::F32, DType::F32).name(), "softmax_backward");
        for (dtype, y_dtype) in [
            (DType::F32, DType::BF16),
            (DType::BF16, DType::F16),
            (DType::F16, DType::I32),
        ] {
            let err = forward(dtype, y_dtype).check_dtypes().unwrap_err();
            assert!(err.to_string().contains("no kernel from"), "{err}");
            assert!(Kernel::Rows(backward(dtype, y_dtype)).function().is_err());
        }
    }

    #[test]
    fn every_kernel_has_its_function_and_index() {
        let k = RowKernel::NarrowF32 {
            dtype: DType::F16,
            x: 0,
            out: 0,
            n: 3,
        };
        assert_eq!(k.name(), "narrow_f32");
        assert_eq!(k.elements(), 3);
        assert_eq!(k.params().len(), 3);
    }
}
