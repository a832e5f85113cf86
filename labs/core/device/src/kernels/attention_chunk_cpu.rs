//! CPU twins of `kernels/attention_chunk.cu`: the same float32 arithmetic row by row
//! (the GPU sums a row's max and exponentials across a warp in another order: results
//! agree to rounding), and the same dropout flags, bit for bit
//! ([`attention_keep_row`]).

use half::{bf16, f16};

use super::attention::{attention_keep_row, AttentionDropout};
use super::attention_chunk::{AttentionChunkKernel, ScoreChunk};
use super::cpu::{access, float, Float, FloatElement, HostAccess, Raw};
use crate::error::Result;

pub(super) fn run(kernel: &AttentionChunkKernel, memory: &dyn HostAccess) -> Result<()> {
    match float(kernel.dtype(), kernel.name())? {
        Float::F32 => run_typed::<f32>(kernel, memory),
        Float::F16 => run_typed::<f16>(kernel, memory),
        Float::BF16 => run_typed::<bf16>(kernel, memory),
    }
}

/// Each row of a chunk: `(r, bh, i, visible)`, `r` over `n · rows`, with the keys
/// query `i` of batch-head `bh` sees.
fn rows(c: &ScoreChunk, causal: bool) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let c = *c;
    (0..c.n * c.rows).map(move |r| {
        let (bh, i) = (c.bh0 + r / c.rows, c.r0 + r % c.rows);
        let visible = if causal { c.cols.min(i + 1) } else { c.cols };
        (r, bh, i, visible)
    })
}

/// The factor of each of the chunk's keys in row `(bh, i)`: `Z / keep`, or 1 without
/// dropout (the counters run over all `tk` keys of the row, as the fused kernels').
fn factors(dropout: &AttentionDropout, c: &ScoreChunk, bh: usize, i: usize) -> Vec<f32> {
    if !dropout.active() {
        return vec![1.0; c.cols];
    }
    let scale = dropout.scale();
    let mut keeps = attention_keep_row(dropout, bh * c.tq + i, c.tk);
    keeps.truncate(c.cols);
    keeps
        .into_iter()
        .map(|kept| if kept { scale } else { 0.0 })
        .collect()
}

fn run_typed<E: FloatElement>(
    kernel: &AttentionChunkKernel,
    memory: &dyn HostAccess,
) -> Result<()> {
    let e = std::mem::size_of::<E>();
    match kernel {
        AttentionChunkKernel::Probs {
            scores,
            probs,
            lse,
            chunk,
            causal,
            dropout,
            ..
        } => {
            let c = *chunk;
            if c.is_empty() {
                return Ok(());
            }
            // The chunk's batch-heads of the log-sum-exp, `tq` rows each.
            let lse_at = lse + (c.bh0 * c.tq * 4) as u64;
            let ranges = [
                (*scores, c.len() * 4),
                (*probs, c.len() * e),
                (lse_at, c.n * c.tq * 4),
            ];
            access(memory, &ranges, |p| {
                // SAFETY: each pointer is valid for the range asked for it.
                let (s, pr, l) = unsafe {
                    (
                        Raw::<f32>::new(p[0], c.len()),
                        Raw::<E>::new(p[1], c.len()),
                        Raw::<f32>::new(p[2], c.n * c.tq),
                    )
                };
                for (r, bh, i, visible) in rows(&c, *causal) {
                    let row = |j: usize| s.get(r * c.cols + j);
                    let m = (0..visible).fold(f32::NEG_INFINITY, |m, j| m.max(row(j)));
                    let sum: f32 = (0..visible).map(|j| (row(j) - m).exp()).sum();
                    let row_lse = m + sum.ln();
                    l.set((bh - c.bh0) * c.tq + i, row_lse);
                    let f = factors(dropout, &c, bh, i);
                    for (j, fj) in f.iter().enumerate() {
                        let v = if j < visible {
                            (row(j) - row_lse).exp() * fj
                        } else {
                            0.0
                        };
                        pr.set(r * c.cols + j, E::narrow(v));
                    }
                }
            })
        }
        AttentionChunkKernel::Grads {
            scores,
            dprobs,
            probs,
            dscores,
            lse,
            delta,
            chunk,
            causal,
            dropout,
            ..
        } => {
            let c = *chunk;
            if c.is_empty() {
                return Ok(());
            }
            let at = |ptr: u64| ptr + (c.bh0 * c.tq * 4) as u64;
            let ranges = [
                (*scores, c.len() * 4),
                (*dprobs, c.len() * 4),
                (*probs, c.len() * e),
                (*dscores, c.len() * e),
                (at(*lse), c.n * c.tq * 4),
                (at(*delta), c.n * c.tq * 4),
            ];
            access(memory, &ranges, |p| {
                // SAFETY: each pointer is valid for the range asked for it.
                let (s, dp, pr, ds, l, dl) = unsafe {
                    (
                        Raw::<f32>::new(p[0], c.len()),
                        Raw::<f32>::new(p[1], c.len()),
                        Raw::<E>::new(p[2], c.len()),
                        Raw::<E>::new(p[3], c.len()),
                        Raw::<f32>::new(p[4], c.n * c.tq),
                        Raw::<f32>::new(p[5], c.n * c.tq),
                    )
                };
                for (r, bh, i, visible) in rows(&c, *causal) {
                    let row_at = (bh - c.bh0) * c.tq + i;
                    let (row_lse, row_delta) = (l.get(row_at), dl.get(row_at));
                    let f = factors(dropout, &c, bh, i);
                    for (j, fj) in f.iter().enumerate() {
                        let e = r * c.cols + j;
                        let (pz, g) = if j < visible {
                            let p = (s.get(e) - row_lse).exp();
                            (p * fj, p * (dp.get(e) * fj - row_delta))
                        } else {
                            (0.0, 0.0)
                        };
                        pr.set(e, E::narrow(pz));
                        ds.set(e, E::narrow(g));
                    }
                }
            })
        }
        AttentionChunkKernel::Store {
            src,
            dst,
            bh0,
            n,
            heads,
            t,
            d,
            ..
        } => {
            let (n, t, d) = (*n, *t, *d);
            if n * t * d == 0 {
                return Ok(());
            }
            let span = dst.extent(bh0 + n, *heads, t, d);
            access(memory, &[(*src, n * t * d * 4), (dst.ptr, span * e)], |p| {
                // SAFETY: each pointer is valid for the range asked for it.
                let (from, to) =
                    unsafe { (Raw::<f32>::new(p[0], n * t * d), Raw::<E>::new(p[1], span)) };
                for z in 0..n {
                    for i in 0..t {
                        let start = dst.row(bh0 + z, *heads, i);
                        for col in 0..d {
                            to.set(start + col, E::narrow(from.get((z * t + i) * d + col)));
                        }
                    }
                }
            })
        }
    }
}
