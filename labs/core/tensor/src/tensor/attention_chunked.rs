//! Fused attention as matrix products: the GPU's path for [`Tensor::fused_attention`].
//! The fused kernels (`kernels/attention.cu`) walk keys one by one per warp, with no
//! tensor cores; here each chunk of query rows is a few GEMMs (cuBLAS, tensor cores for
//! half types) around row kernels (`kernels/attention_chunk.cu`):
//!
//! - forward: `S = q_c kᵀ · scale` (float32), the row kernel's log-sum-exp and weights
//!   `P = exp(S − lse) ∘ Z / keep`, then `O_c = P v` written into the output;
//! - backward: `S` again and `dP = dO_c vᵀ` (float32), the row kernel's `P ∘ Z / keep`
//!   and `dS = P ∘ (dP ∘ Z / keep − delta)`, then `dV += (P ∘ Z / keep)ᵀ dO_c`,
//!   `dK += dSᵀ q_c · scale` (float32 accumulators) and `dQ_c = dS k · scale`.
//!
//! What it computes and saves is the fused kernels': the same log-sum-exp, the same
//! dropout flags (drawn again from the call's counters), q, k, v, output and
//! log-sum-exp saved. The scores of a chunk are temporaries of at most
//! [`DEFAULT_CHUNK_BYTES`](super::DEFAULT_CHUNK_BYTES) (the chunk's rows, and where one row of every batch-head is
//! too wide, its batch-heads, are chosen so; one row of one batch-head at least), freed
//! after the call (through the caching allocator, which reuses them); the backward
//! adds two float32 `[H, Tk, D]` accumulators. The weights meet `v`, `dO`, `q` and `k`
//! in the inputs' dtype, as flash attention's second products do, and every product
//! accumulates in float32.
//!
//! The products step over batch-heads with one stride per operand; the `[B, T, H, D]`
//! memory of a packed projection's heads, of the output and of the gradients has none
//! across batches (heads are `D` apart within a batch, batches `T·H·D`). Products one
//! batch at a time, over its heads, are small (a 1024-position GPT-2 step launched
//! about 4,000 of them, most using a sixth of an H100's multiprocessors; a
//! 100-position Transformer's were so many that the fused kernels were faster), so
//! such operands are first copied to dense `[B, H, T, D]` temporaries and outputs
//! written through one ([`Views`]): a few memory-bound copies buy products over all
//! `B·H` batch-heads at once.
//!
//! Which path serves a call: [`attention_path`](super::attention_path).

use super::attention_path::chunk_bytes;
#[cfg(test)]
use super::attention_path::{set_attention_chunk_bytes, DEFAULT_CHUNK_BYTES};
use super::{DType, Tensor};
use crate::device::Device;
use crate::error::Result;
use crate::kernels::{
    AttentionChunkKernel, AttentionDropout, AttentionShape, Gemm, HeadsOperand, Kernel, Operand,
    ScoreChunk,
};

/// The batch-heads of each product and the query rows of each chunk, for temporaries of
/// `bytes_per_score` bytes per score: [`slabs`], split further where one row of each
/// batch-head would not fit the bound, and [`chunk_rows`].
fn plan(
    s: &AttentionShape,
    operands: &[&HeadsOperand],
    bytes_per_score: usize,
    causal: bool,
) -> Result<(Vec<(usize, usize)>, usize)> {
    let row = (s.tk * bytes_per_score).max(1);
    let most = (chunk_bytes()? / row).max(1);
    let slabs: Vec<(usize, usize)> = slabs(s, operands)
        .into_iter()
        .flat_map(|(bh0, n)| {
            (0..n)
                .step_by(most)
                .map(move |z| (bh0 + z, most.min(n - z)))
        })
        .collect();
    let n = slabs.first().map_or(1, |&(_, n)| n);
    Ok((slabs, chunk_rows(s, n, bytes_per_score, causal)?))
}

/// Query rows per chunk: as many as keep `n` batch-heads' temporaries of
/// `bytes_per_score` bytes per score under the bound (one at least), a multiple of 64
/// when that many fit, else of 16 when the rows are split; under `causal` at most a quarter of the rows (64 at least), so
/// that the products skip most of the hidden keys (the chunk's keys end at its last row).
fn chunk_rows(s: &AttentionShape, n: usize, bytes_per_score: usize, causal: bool) -> Result<usize> {
    let per_row = (n * s.tk * bytes_per_score).max(1);
    let mut rows = (chunk_bytes()? / per_row).clamp(1, s.tq.max(1));
    if causal {
        rows = rows.min(s.tq.div_ceil(4).max(64));
    }
    // Whole tiles of the products' row blocks where the rows are split.
    if rows >= 64 {
        rows -= rows % 64;
    } else if rows >= 16 && rows < s.tq {
        rows -= rows % 16;
    }
    Ok(rows)
}

/// The batch-heads one product covers: all `bh` when every operand steps from one to
/// the next by one stride, else one batch's heads at a time. `(bh0, n)` each.
fn slabs(s: &AttentionShape, operands: &[&HeadsOperand]) -> Vec<(usize, usize)> {
    let batches = s.bh / s.heads.max(1);
    let one_stride =
        batches <= 1 || s.heads <= 1 || operands.iter().all(|o| o.batch == s.heads * o.head);
    if one_stride {
        vec![(0, s.bh)]
    } else {
        (0..batches).map(|b| (b * s.heads, s.heads)).collect()
    }
}

/// The GEMM operand of rows `r0..r0 + rows` of batch-heads `bh0..` of `o` (`elem`
/// bytes per element), `[rows, d]` as stored.
fn rows_of(o: &HeadsOperand, s: &AttentionShape, bh0: usize, r0: usize, elem: usize) -> Operand {
    Operand {
        ptr: o.ptr + (o.row(bh0, s.heads, r0) * elem) as u64,
        ld: o.seq.max(s.d),
        batch_stride: if s.heads > 1 { o.head } else { o.batch },
        transposed: false,
    }
}

/// A dense `[n, rows, cols]` temporary as a GEMM operand.
fn dense(ptr: u64, rows: usize, cols: usize, transposed: bool) -> Operand {
    Operand {
        ptr,
        ld: cols.max(1),
        batch_stride: rows * cols,
        transposed,
    }
}

/// Scores per batch below which products one batch at a time are too small to keep
/// a GPU busy, so that operands are copied to take all batch-heads at once. An H100's
/// 100-position Transformer (8 heads, 80,000 scores a batch, 64 batches) took 294 ms of
/// kernels a step batch by batch and 46 ms after the copies; GPT-2's 1024 positions
/// (12 heads, 12.6 M scores a batch, 8 batches) lost 6 ms to the copies and gained
/// less in the products.
const SMALL_BATCH_SCORES: usize = 1 << 22;

/// Whether `o` can serve products over all batch-heads at once: it steps from each
/// batch-head to the next by one stride, or one batch's products are large enough
/// that going batch by batch costs nothing ([`SMALL_BATCH_SCORES`]).
fn serves_products(s: &AttentionShape, o: &HeadsOperand) -> bool {
    let batches = s.bh / s.heads.max(1);
    batches <= 1
        || s.heads <= 1
        || o.batch == s.heads * o.head
        || s.heads * s.tq * s.tk >= SMALL_BATCH_SCORES
}

/// `t`'s operand for products over all batch-heads: `t` itself when its batch-heads
/// step by one stride and its rows are at least `d` apart (a GEMM's leading dimension;
/// an expanded sequence's overlap), else a dense copy.
fn product_input(
    t: &Tensor,
    op: HeadsOperand,
    s: &AttentionShape,
) -> Result<(Tensor, HeadsOperand)> {
    let (seq, d) = (t.shape()[2], t.shape()[3]);
    if serves_products(s, &op) && (seq <= 1 || op.seq >= d) {
        return Ok((t.clone(), op));
    }
    let dense = t.detach().contiguous()?;
    Ok((dense.clone(), dense_operand(&dense)))
}

/// The operand of a dense `[B, H, T, D]` tensor.
fn dense_operand(t: &Tensor) -> HeadsOperand {
    let s = t.strides();
    HeadsOperand {
        ptr: t.ptr(),
        batch: s[0],
        head: s[1],
        seq: s[2],
    }
}

/// An output of the products: `dst` itself when it serves them ([`serves_products`]),
/// else a dense `[B, H, T, D]` temporary copied into `dst` by [`ProductOutput::finish`].
struct ProductOutput {
    dst: Tensor,
    dense: Option<Tensor>,
    op: HeadsOperand,
}

impl ProductOutput {
    fn new(dst: &Tensor, op: HeadsOperand, s: &AttentionShape) -> Result<Self> {
        if serves_products(s, &op) {
            return Ok(ProductOutput {
                dst: dst.clone(),
                dense: None,
                op,
            });
        }
        let dense = Tensor::empty(dst.shape(), dst.dtype(), dst.device())?;
        let op = dense_operand(&dense);
        Ok(ProductOutput {
            dst: dst.clone(),
            dense: Some(dense),
            op,
        })
    }

    /// Copies the temporary, if any, into `dst`.
    fn finish(self) -> Result<()> {
        let Some(dense) = self.dense else {
            return Ok(());
        };
        self.dst.device().launch(&Kernel::StridedScatter {
            width: self.dst.dtype().size(),
            src: dense.ptr(),
            dst: self.dst.ptr(),
            layout: self.dst.layout.strided()?.coalesced(),
            n: dense.numel(),
        })
    }
}

/// The tensors of a chunked call: `[B, H, T, D]` views with their operands.
pub(super) struct Views<'a> {
    pub q: (&'a Tensor, HeadsOperand),
    pub k: (&'a Tensor, HeadsOperand),
    pub v: (&'a Tensor, HeadsOperand),
}

/// [`forward`] from views: inputs made ready for products over all batch-heads, the
/// output (`out`, `[B, T, H, D]` memory) written through a dense temporary if needed.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_views(
    views: Views<'_>,
    out: (&Tensor, HeadsOperand),
    lse: u64,
    shape: AttentionShape,
    scale: f32,
    causal: bool,
    dropout: AttentionDropout,
) -> Result<()> {
    let s = shape;
    let (q, qo) = product_input(views.q.0, views.q.1, &s)?;
    let (_k, ko) = product_input(views.k.0, views.k.1, &s)?;
    let (_v, vo) = product_input(views.v.0, views.v.1, &s)?;
    let o = ProductOutput::new(out.0, out.1, &s)?;
    forward(
        [&qo, &ko, &vo],
        &o.op,
        lse,
        s,
        q.dtype(),
        scale,
        causal,
        dropout,
        q.device(),
    )?;
    o.finish()
}

/// [`backward`] from views: `dout` and the inputs made ready as in [`forward_views`];
/// `dq` written through a dense temporary if needed (`dk` and `dv` are stored from
/// float32 sums by a row kernel that takes any strides).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward_views(
    views: Views<'_>,
    dout: (&Tensor, HeadsOperand),
    [lse, delta]: [u64; 2],
    dq: (&Tensor, HeadsOperand),
    [dk, dv]: [&HeadsOperand; 2],
    shape: AttentionShape,
    scale: f32,
    causal: bool,
    dropout: AttentionDropout,
) -> Result<()> {
    let s = shape;
    let (q, qo) = product_input(views.q.0, views.q.1, &s)?;
    let (_k, ko) = product_input(views.k.0, views.k.1, &s)?;
    let (_v, vo) = product_input(views.v.0, views.v.1, &s)?;
    let (_g, go) = product_input(dout.0, dout.1, &s)?;
    let dq = ProductOutput::new(dq.0, dq.1, &s)?;
    backward(
        [&qo, &ko, &vo, &go],
        [lse, delta],
        [&dq.op, dk, dv],
        s,
        q.dtype(),
        scale,
        causal,
        dropout,
        q.device(),
    )?;
    dq.finish()
}

/// The products of one call: its dtype, shape and device.
struct Products<'a> {
    dtype: DType,
    shape: AttentionShape,
    device: &'a Device,
}

impl Products<'_> {
    /// `C = alpha · op(A) op(B) + beta · C` over `batch` batch-heads.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        [m, n, k, batch]: [usize; 4],
        a: Operand,
        b: Operand,
        (c, ldc, stride_c, c_dtype): (u64, usize, usize, DType),
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        self.device.launch(&Kernel::Gemm(Gemm {
            dtype: self.dtype,
            m,
            n,
            k,
            batch,
            a,
            b,
            c,
            c_dtype,
            ldc,
            stride_c,
            alpha,
            beta,
            allow_tf32: false,
            bias: None,
        }))
    }

    /// `S = q_c kᵀ · scale` into the dense float32 `scores` of `chunk`.
    fn scores(
        &self,
        q: &HeadsOperand,
        k: &HeadsOperand,
        c: &ScoreChunk,
        scores: u64,
        scale: f32,
    ) -> Result<()> {
        let (s, e) = (&self.shape, self.dtype.size());
        let keys = Operand {
            transposed: true,
            ..rows_of(k, s, c.bh0, 0, e)
        };
        self.gemm(
            [c.rows, c.cols, s.d, c.n],
            rows_of(q, s, c.bh0, c.r0, e),
            keys,
            (scores, c.cols, c.rows * c.cols, DType::F32),
            scale,
            0.0,
        )
    }
}

/// The forward of [`Tensor::fused_attention`] in chunks: writes `out` and `lse` as the
/// fused kernel does.
#[allow(clippy::too_many_arguments)]
fn forward(
    [q, k, v]: [&HeadsOperand; 3],
    out: &HeadsOperand,
    lse: u64,
    shape: AttentionShape,
    dtype: DType,
    scale: f32,
    causal: bool,
    dropout: AttentionDropout,
    device: &Device,
) -> Result<()> {
    let s = shape;
    if s.bh * s.tq == 0 {
        return Ok(());
    }
    let p = Products {
        dtype,
        shape,
        device,
    };
    let e = dtype.size();
    let (slabs, rows) = plan(&s, &[q, k, v, out], 4 + e, causal)?;
    let n = slabs[0].1;
    let scores = Tensor::empty(&[n * rows * s.tk], DType::F32, device)?;
    let probs = Tensor::empty(&[n * rows * s.tk], dtype, device)?;
    for &(bh0, n) in &slabs {
        for r0 in (0..s.tq).step_by(rows) {
            let c = chunk(&s, bh0, n, r0, rows, causal);
            p.scores(q, k, &c, scores.ptr(), scale)?;
            device.launch(&Kernel::AttentionChunk(AttentionChunkKernel::Probs {
                dtype,
                scores: scores.ptr(),
                probs: probs.ptr(),
                lse,
                chunk: c,
                causal,
                dropout,
            }))?;
            let o = rows_of(out, &s, bh0, r0, e);
            p.gemm(
                [c.rows, s.d, c.cols, n],
                dense(probs.ptr(), c.rows, c.cols, false),
                rows_of(v, &s, bh0, 0, e),
                (o.ptr, o.ld, o.batch_stride, dtype),
                1.0,
                0.0,
            )?;
        }
    }
    Ok(())
}

/// Chunk `r0..` of up to `rows` rows of batch-heads `bh0..bh0 + n`: its keys end at its
/// last row under `causal` (none later is visible to it).
fn chunk(
    s: &AttentionShape,
    bh0: usize,
    n: usize,
    r0: usize,
    rows: usize,
    causal: bool,
) -> ScoreChunk {
    let rows = rows.min(s.tq - r0);
    let cols = if causal { s.tk.min(r0 + rows) } else { s.tk };
    ScoreChunk {
        bh0,
        n,
        r0,
        rows,
        cols,
        tq: s.tq,
        tk: s.tk,
    }
}

/// The gradients of [`Tensor::fused_attention`] in chunks, from what it saved, the
/// output's gradient and `delta = rowsum(dO ∘ O)`: writes `dq`, `dk` and `dv` as the
/// fused kernels do.
#[allow(clippy::too_many_arguments)]
fn backward(
    [q, k, v, dout]: [&HeadsOperand; 4],
    [lse, delta]: [u64; 2],
    [dq, dk, dv]: [&HeadsOperand; 3],
    shape: AttentionShape,
    dtype: DType,
    scale: f32,
    causal: bool,
    dropout: AttentionDropout,
    device: &Device,
) -> Result<()> {
    let s = shape;
    if s.bh == 0 {
        return Ok(());
    }
    let p = Products {
        dtype,
        shape,
        device,
    };
    let e = dtype.size();
    // `dk` and `dv` are stored from the float32 sums by a row kernel that takes any
    // strides: only the products' operands decide the slabs.
    let (slabs, rows) = plan(&s, &[q, k, v, dout, dq], 8 + 2 * e, causal)?;
    let n = slabs[0].1;
    let scratch = |dtype| Tensor::empty(&[n * rows * s.tk], dtype, device);
    let (scores, dprobs) = (scratch(DType::F32)?, scratch(DType::F32)?);
    let (probs, dscores) = (scratch(dtype)?, scratch(dtype)?);
    for &(bh0, n) in &slabs {
        // The key and value gradients of these batch-heads, summed over the chunks.
        let dk_sum = Tensor::zeros(&[n * s.tk * s.d], DType::F32, device)?;
        let dv_sum = Tensor::zeros(&[n * s.tk * s.d], DType::F32, device)?;
        let sums = |t: &Tensor| (t.ptr(), s.d, s.tk * s.d, DType::F32);
        for r0 in (0..s.tq).step_by(rows) {
            let c = chunk(&s, bh0, n, r0, rows, causal);
            p.scores(q, k, &c, scores.ptr(), scale)?;
            let values = Operand {
                transposed: true,
                ..rows_of(v, &s, bh0, 0, e)
            };
            let grads = rows_of(dout, &s, bh0, r0, e);
            p.gemm(
                [c.rows, c.cols, s.d, n],
                grads,
                values,
                (dprobs.ptr(), c.cols, c.rows * c.cols, DType::F32),
                1.0,
                0.0,
            )?;
            device.launch(&Kernel::AttentionChunk(AttentionChunkKernel::Grads {
                dtype,
                scores: scores.ptr(),
                dprobs: dprobs.ptr(),
                probs: probs.ptr(),
                dscores: dscores.ptr(),
                lse,
                delta,
                chunk: c,
                causal,
                dropout,
            }))?;
            // dV[:cols] += (P Z / keep)ᵀ dO_c; dK[:cols] += dSᵀ q_c · scale.
            let by_keys = [c.cols, s.d, c.rows, n];
            let queries = rows_of(q, &s, bh0, r0, e);
            p.gemm(
                by_keys,
                dense(probs.ptr(), c.rows, c.cols, true),
                grads,
                sums(&dv_sum),
                1.0,
                1.0,
            )?;
            p.gemm(
                by_keys,
                dense(dscores.ptr(), c.rows, c.cols, true),
                queries,
                sums(&dk_sum),
                scale,
                1.0,
            )?;
            // dQ_c = dS k · scale.
            let o = rows_of(dq, &s, bh0, r0, e);
            p.gemm(
                [c.rows, s.d, c.cols, n],
                dense(dscores.ptr(), c.rows, c.cols, false),
                rows_of(k, &s, bh0, 0, e),
                (o.ptr, o.ld, o.batch_stride, dtype),
                scale,
                0.0,
            )?;
        }
        for (sum, dst) in [(&dk_sum, dk), (&dv_sum, dv)] {
            device.launch(&Kernel::AttentionChunk(AttentionChunkKernel::Store {
                dtype,
                src: sum.ptr(),
                dst: *dst,
                bh0,
                n,
                heads: s.heads,
                t: s.tk,
                d: s.d,
            }))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2 small's attention: batch 8, 12 heads, 1024 positions, head_dim 64.
    const GPT2: AttentionShape = AttentionShape {
        bh: 96,
        heads: 12,
        tq: 1024,
        tk: 1024,
        d: 64,
    };

    /// The `[B, T, H, D]` memory of an output, or the heads of a packed `[B, T, 3E]`.
    fn heads_last(s: &AttentionShape, row: usize) -> HeadsOperand {
        HeadsOperand {
            ptr: 0,
            batch: s.tq * row,
            head: s.d,
            seq: row,
        }
    }

    #[test]
    fn outputs_in_heads_last_memory_take_one_batch_per_product() {
        let e = GPT2.heads * GPT2.d;
        let (packed, out) = (heads_last(&GPT2, 3 * e), heads_last(&GPT2, e));
        let per_batch: Vec<_> = (0..8).map(|b| (12 * b, 12)).collect();
        assert_eq!(slabs(&GPT2, &[&packed, &out]), per_batch);
        // Dense [B, H, T, D] operands step over all batch-heads with one stride.
        let dense = HeadsOperand {
            ptr: 0,
            batch: 12 * 1024 * 64,
            head: 1024 * 64,
            seq: 64,
        };
        assert_eq!(slabs(&GPT2, &[&dense, &dense]), vec![(0, 96)]);
        // One batch: its heads are all the batch-heads.
        let one = AttentionShape { bh: 12, ..GPT2 };
        assert_eq!(slabs(&one, &[&packed, &out]), vec![(0, 12)]);
    }

    #[test]
    fn chunks_keep_their_temporaries_under_the_bound() {
        set_attention_chunk_bytes(None);
        if std::env::var("LABS_ATTENTION_CHUNK_BYTES").is_ok() {
            return; // the figures below are the default bound's
        }
        // GPT-2 small, one batch (12 heads) per product: float32 scores and weights
        // (8 bytes a score) fit 682 rows in 64 MiB, the backward's four buffers (16
        // bytes) 341; causal, a quarter of the rows at most (256), so that the products
        // skip most hidden keys.
        for (per_score, causal, rows) in [(8, false, 640), (16, false, 320), (8, true, 256)] {
            let got = chunk_rows(&GPT2, 12, per_score, causal).unwrap();
            assert_eq!(got, rows, "{per_score} {causal}");
            assert!(12 * rows * GPT2.tk * per_score <= DEFAULT_CHUNK_BYTES);
        }
        // Rows too wide for the bound: fewer batch-heads a product (16 MiB a row of
        // 2^20 keys, 4 of them in 64 MiB), one row a chunk; one batch-head a product
        // where its row alone is wider than the bound.
        let dense = HeadsOperand {
            ptr: 0,
            batch: 12 * 1024 * 64,
            head: 1024 * 64,
            seq: 64,
        };
        let wide = AttentionShape {
            tk: 1 << 20,
            ..GPT2
        };
        let (slabs, rows) = plan(&wide, &[&dense], 16, false).unwrap();
        assert_eq!(
            (slabs.len(), slabs[0], slabs[23], rows),
            (24, (0, 4), (92, 4), 1)
        );
        let wider = AttentionShape {
            tk: 1 << 24,
            ..GPT2
        };
        let (slabs, rows) = plan(&wider, &[&dense], 16, false).unwrap();
        assert_eq!((slabs.len(), slabs[95], rows), (96, (95, 1), 1));
        // A short sequence is one chunk.
        let short = AttentionShape {
            tq: 37,
            tk: 37,
            ..GPT2
        };
        assert_eq!(chunk_rows(&short, 96, 16, true).unwrap(), 37);
    }
}
