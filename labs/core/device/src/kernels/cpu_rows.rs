//! CPU twins of the row kernels of `kernels/rows.cu`: the same float32 arithmetic,
//! rows and sums walked in order (the GPU's warps add in another order: results agree
//! to rounding). Dropout's mask is the same bits by construction (the same Philox).

use half::{bf16, f16};

use super::cpu::{access, float, Float, FloatElement, HostAccess, Raw};
use super::rows::{dropout_uniform, RowKernel};
use super::Strided;
use crate::device_id::DevicePtr;
use crate::error::{Error, Result};

/// Runs the twin of a row kernel.
pub(super) fn run(kernel: &RowKernel, memory: &dyn HostAccess) -> Result<()> {
    if let RowKernel::Softmax { .. } | RowKernel::SoftmaxBackward { .. } = kernel {
        return super::cpu_softmax::run(kernel, memory);
    }
    match float(kernel.dtype(), kernel.name())? {
        Float::F32 => run_typed::<f32>(kernel, memory),
        Float::F16 => run_typed::<f16>(kernel, memory),
        Float::BF16 => run_typed::<bf16>(kernel, memory),
    }
}

/// The twin of `strided_scatter_b*` in `kernels/scatter.cu`: contiguous `src` written
/// into the strided view at `dst`.
pub(super) fn strided_scatter(
    width: usize,
    src: DevicePtr,
    dst: DevicePtr,
    layout: &Strided,
    n: usize,
    memory: &dyn HostAccess,
) -> Result<()> {
    if ![1, 2, 4, 8].contains(&width) {
        return Err(Error::InvalidArgument(format!(
            "no strided scatter for {width}-byte elements"
        )));
    }
    if layout.numel() != n {
        return Err(Error::InvalidArgument(format!(
            "strided scatter of {n} elements into a view of {}",
            layout.numel()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let (low, count) = layout.extent();
    let start = dst.wrapping_add_signed(low * width as i64);
    access(memory, &[(src, n * width), (start, count * width)], |p| {
        for i in 0..n {
            let at = (layout.offset(i as u64) - low) as usize;
            // SAFETY: `i < n` and `at < count`: inside the two ranges asked for.
            unsafe { std::ptr::copy(p[0].add(i * width), p[1].add(at * width), width) };
        }
    })
}

/// Views of the ranges `ranges` asked for, as typed slices: `(ptr, elements, width)`.
pub(super) fn with<const K: usize>(
    memory: &dyn HostAccess,
    ranges: [(DevicePtr, usize, usize); K],
    mut f: impl FnMut([*mut u8; K]),
) -> Result<()> {
    if ranges.iter().all(|r| r.1 == 0) {
        return Ok(()); // an empty launch, which the GPU skips too
    }
    // Absent optional pointers ask for nothing (an empty range at a live address).
    let live = ranges.iter().find(|r| r.1 > 0).map(|r| r.0).unwrap_or(0);
    let asked: Vec<(DevicePtr, usize)> = ranges
        .iter()
        .map(|&(p, n, w)| if n == 0 { (live, 0) } else { (p, n * w) })
        .collect();
    access(memory, &asked, |p| {
        let mut ptrs = [std::ptr::null_mut(); K];
        ptrs.copy_from_slice(&p[..K]);
        f(ptrs)
    })
}

fn run_typed<E: FloatElement>(kernel: &RowKernel, memory: &dyn HostAccess) -> Result<()> {
    let e = std::mem::size_of::<E>();
    // SAFETY (every `Raw::new` below): each pointer is valid for the range asked for it.
    match *kernel {
        RowKernel::Softmax { .. } | RowKernel::SoftmaxBackward { .. } => {
            unreachable!("softmax twins are in cpu_softmax.rs")
        }
        RowKernel::LayerNorm {
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
        } => {
            let n = rows * cols;
            let (wn, bn) = (weight.map_or(0, |_| cols), bias.map_or(0, |_| cols));
            let ranges = [
                (x, n, e),
                (weight.unwrap_or(0), wn, e),
                (bias.unwrap_or(0), bn, e),
                (out, n, e),
                (mean, rows, 4),
                (rstd, rows, 4),
            ];
            with(memory, ranges, |p| {
                let x = unsafe { Raw::<E>::new(p[0], n) };
                let w = unsafe { Raw::<E>::new(p[1], wn) };
                let b = unsafe { Raw::<E>::new(p[2], bn) };
                let y = unsafe { Raw::<E>::new(p[3], n) };
                let (mean, rstd) =
                    unsafe { (Raw::<f32>::new(p[4], rows), Raw::<f32>::new(p[5], rows)) };
                for r in 0..rows {
                    let at = |c: usize| x.get(r * cols + c).widen();
                    let mu = (0..cols).map(at).sum::<f32>() / cols as f32;
                    let var =
                        (0..cols).map(|c| (at(c) - mu) * (at(c) - mu)).sum::<f32>() / cols as f32;
                    let rs = 1.0 / (var + eps).sqrt();
                    mean.set(r, mu);
                    rstd.set(r, rs);
                    for c in 0..cols {
                        let mut o = (at(c) - mu) * rs;
                        if wn > 0 {
                            o *= w.get(c).widen();
                        }
                        if bn > 0 {
                            o += b.get(c).widen();
                        }
                        y.set(r * cols + c, E::narrow(o));
                    }
                }
            })
        }
        RowKernel::LayerNormBackward {
            x,
            weight,
            grad,
            mean,
            rstd,
            out,
            rows,
            cols,
            ..
        } => {
            let n = rows * cols;
            let wn = weight.map_or(0, |_| cols);
            let ranges = [
                (x, n, e),
                (weight.unwrap_or(0), wn, e),
                (grad, n, e),
                (mean, rows, 4),
                (rstd, rows, 4),
                (out, n, e),
            ];
            with(memory, ranges, |p| {
                let x = unsafe { Raw::<E>::new(p[0], n) };
                let w = unsafe { Raw::<E>::new(p[1], wn) };
                let g = unsafe { Raw::<E>::new(p[2], n) };
                let (mean, rstd) =
                    unsafe { (Raw::<f32>::new(p[3], rows), Raw::<f32>::new(p[4], rows)) };
                let dx = unsafe { Raw::<E>::new(p[5], n) };
                for r in 0..rows {
                    let (mu, rs) = (mean.get(r), rstd.get(r));
                    let gw = |c: usize| {
                        g.get(r * cols + c).widen() * if wn > 0 { w.get(c).widen() } else { 1.0 }
                    };
                    let xhat = |c: usize| (x.get(r * cols + c).widen() - mu) * rs;
                    let a = (0..cols).map(gw).sum::<f32>() / cols as f32;
                    let b = (0..cols).map(|c| gw(c) * xhat(c)).sum::<f32>() / cols as f32;
                    for c in 0..cols {
                        dx.set(r * cols + c, E::narrow(rs * (gw(c) - a - xhat(c) * b)));
                    }
                }
            })
        }
        RowKernel::LayerNormParamGrads {
            x,
            grad,
            mean,
            rstd,
            partial,
            rows,
            cols,
            chunks,
            ..
        } => {
            let n = rows * cols;
            let ranges = [
                (x, n, e),
                (grad, n, e),
                (mean, rows, 4),
                (rstd, rows, 4),
                (partial, 2 * chunks * cols, 4),
            ];
            with(memory, ranges, |p| {
                let x = unsafe { Raw::<E>::new(p[0], n) };
                let g = unsafe { Raw::<E>::new(p[1], n) };
                let (mean, rstd) =
                    unsafe { (Raw::<f32>::new(p[2], rows), Raw::<f32>::new(p[3], rows)) };
                let partial = unsafe { Raw::<f32>::new(p[4], 2 * chunks * cols) };
                let span = rows.div_ceil(chunks);
                for k in 0..chunks {
                    let (begin, end) = ((k * span).min(rows), ((k + 1) * span).min(rows));
                    for c in 0..cols {
                        let (mut sw, mut sb) = (0f32, 0f32);
                        for r in begin..end {
                            let gv = g.get(r * cols + c).widen();
                            sw += gv * ((x.get(r * cols + c).widen() - mean.get(r)) * rstd.get(r));
                            sb += gv;
                        }
                        partial.set(k * cols + c, sw);
                        partial.set(chunks * cols + k * cols + c, sb);
                    }
                }
            })
        }
        RowKernel::LayerNormParamFinish {
            partial,
            dweight,
            dbias,
            cols,
            chunks,
            ..
        } => {
            let (wn, bn) = (dweight.map_or(0, |_| cols), dbias.map_or(0, |_| cols));
            let ranges = [
                (partial, 2 * chunks * cols, 4),
                (dweight.unwrap_or(0), wn, e),
                (dbias.unwrap_or(0), bn, e),
            ];
            with(memory, ranges, |p| {
                let partial = unsafe { Raw::<f32>::new(p[0], 2 * chunks * cols) };
                let dw = unsafe { Raw::<E>::new(p[1], wn) };
                let db = unsafe { Raw::<E>::new(p[2], bn) };
                for c in 0..cols {
                    let sw: f32 = (0..chunks).map(|k| partial.get(k * cols + c)).sum();
                    let sb: f32 = (0..chunks)
                        .map(|k| partial.get(chunks * cols + k * cols + c))
                        .sum();
                    if wn > 0 {
                        dw.set(c, E::narrow(sw));
                    }
                    if bn > 0 {
                        db.set(c, E::narrow(sb));
                    }
                }
            })
        }
        RowKernel::Dropout {
            x,
            out,
            mask,
            n,
            keep,
            scale,
            seed,
            offset,
            ..
        } => with(memory, [(x, n, e), (out, n, e), (mask, n, 1)], |p| {
            let (x, y) = unsafe { (Raw::<E>::new(p[0], n), Raw::<E>::new(p[1], n)) };
            let m = unsafe { Raw::<u8>::new(p[2], n) };
            for i in 0..n {
                let kept = dropout_uniform(seed, offset.wrapping_add(i as u64)) < keep;
                m.set(i, kept as u8);
                let v = if kept { x.get(i).widen() * scale } else { 0.0 };
                y.set(i, E::narrow(v));
            }
        }),
        RowKernel::MaskedScale {
            x,
            mask,
            out,
            n,
            scale,
            ..
        } => with(memory, [(x, n, e), (mask, n, 1), (out, n, e)], |p| {
            let x = unsafe { Raw::<E>::new(p[0], n) };
            let m = unsafe { Raw::<u8>::new(p[1], n) };
            let y = unsafe { Raw::<E>::new(p[2], n) };
            for i in 0..n {
                let v = if m.get(i) != 0 {
                    x.get(i).widen() * scale
                } else {
                    0.0
                };
                y.set(i, E::narrow(v));
            }
        }),
        RowKernel::Embedding {
            weight,
            indices,
            out,
            n,
            dim,
            vocab,
            ..
        } => with(
            memory,
            [(weight, vocab * dim, e), (indices, n, 8), (out, n * dim, e)],
            |p| {
                let w = unsafe { Raw::<E>::new(p[0], vocab * dim) };
                let idx = unsafe { Raw::<i64>::new(p[1], n) };
                let y = unsafe { Raw::<E>::new(p[2], n * dim) };
                for j in 0..n {
                    let t = idx.get(j);
                    for c in 0..dim {
                        let v = if (0..vocab as i64).contains(&t) {
                            w.get(t as usize * dim + c)
                        } else {
                            E::narrow(0.0)
                        };
                        y.set(j * dim + c, v);
                    }
                }
            },
        ),
        RowKernel::EmbeddingBackward {
            grad,
            indices,
            out,
            n,
            dim,
            vocab,
            ..
        } => with(
            memory,
            [(grad, n * dim, e), (indices, n, 8), (out, vocab * dim, 4)],
            |p| {
                let g = unsafe { Raw::<E>::new(p[0], n * dim) };
                let idx = unsafe { Raw::<i64>::new(p[1], n) };
                let dw = unsafe { Raw::<f32>::new(p[2], vocab * dim) };
                for j in 0..n {
                    let t = idx.get(j);
                    if !(0..vocab as i64).contains(&t) {
                        continue;
                    }
                    for c in 0..dim {
                        let at = t as usize * dim + c;
                        dw.set(at, dw.get(at) + g.get(j * dim + c).widen());
                    }
                }
            },
        ),
        RowKernel::NarrowF32 { x, out, n, .. } => with(memory, [(x, n, 4), (out, n, e)], |p| {
            let (x, y) = unsafe { (Raw::<f32>::new(p[0], n), Raw::<E>::new(p[1], n)) };
            for i in 0..n {
                y.set(i, E::narrow(x.get(i)));
            }
        }),
        RowKernel::NllLoss {
            logp,
            target,
            out,
            count,
            rows,
            cols,
            ignore_index,
            ..
        } => with(
            memory,
            [
                (logp, rows * cols, e),
                (target, rows, 8),
                (out, 1, e),
                (count, 1, 4),
            ],
            |p| {
                let lp = unsafe { Raw::<E>::new(p[0], rows * cols) };
                let t = unsafe { Raw::<i64>::new(p[1], rows) };
                let (out, count) = unsafe { (Raw::<E>::new(p[2], 1), Raw::<f32>::new(p[3], 1)) };
                let (mut s, mut k) = (0f32, 0f32);
                for r in 0..rows {
                    let t = t.get(r);
                    if t != ignore_index && (0..cols as i64).contains(&t) {
                        s -= lp.get(r * cols + t as usize).widen();
                        k += 1.0;
                    }
                }
                out.set(0, E::narrow(s / k));
                count.set(0, k);
            },
        ),
        RowKernel::NllLossBackward {
            grad,
            count,
            target,
            out,
            rows,
            cols,
            ignore_index,
            ..
        } => with(
            memory,
            [
                (grad, 1, e),
                (count, 1, 4),
                (target, rows, 8),
                (out, rows * cols, e),
            ],
            |p| {
                let g = unsafe { Raw::<E>::new(p[0], 1) };
                let k = unsafe { Raw::<f32>::new(p[1], 1) };
                let t = unsafe { Raw::<i64>::new(p[2], rows) };
                let dx = unsafe { Raw::<E>::new(p[3], rows * cols) };
                let v = -g.get(0).widen() / k.get(0);
                for r in 0..rows {
                    let t = t.get(r);
                    for c in 0..cols {
                        let hit = t != ignore_index && t == c as i64;
                        dx.set(r * cols + c, E::narrow(if hit { v } else { 0.0 }));
                    }
                }
            },
        ),
        RowKernel::MseLossBackward {
            grad,
            x,
            y,
            out,
            n,
            scale,
            ..
        } => with(
            memory,
            [(grad, 1, e), (x, n, e), (y, n, e), (out, n, e)],
            |p| {
                let g = unsafe { Raw::<E>::new(p[0], 1) }.get(0).widen();
                let x = unsafe { Raw::<E>::new(p[1], n) };
                let y = unsafe { Raw::<E>::new(p[2], n) };
                let dx = unsafe { Raw::<E>::new(p[3], n) };
                for i in 0..n {
                    dx.set(
                        i,
                        E::narrow(scale * (x.get(i).widen() - y.get(i).widen()) * g),
                    );
                }
            },
        ),
        RowKernel::MaxRows {
            x,
            values,
            indices,
            rows,
            cols,
            ..
        } => with(
            memory,
            [(x, rows * cols, e), (values, rows, e), (indices, rows, 8)],
            |p| {
                let x = unsafe { Raw::<E>::new(p[0], rows * cols) };
                let v = unsafe { Raw::<E>::new(p[1], rows) };
                let idx = unsafe { Raw::<i64>::new(p[2], rows) };
                let beats = |a: f32, b: f32| a > b || (a.is_nan() && !b.is_nan());
                for r in 0..rows {
                    let mut best = 0;
                    for c in 1..cols {
                        if beats(x.get(r * cols + c).widen(), x.get(r * cols + best).widen()) {
                            best = c;
                        }
                    }
                    v.set(r, x.get(r * cols + best));
                    idx.set(r, best as i64);
                }
            },
        ),
        RowKernel::ScatterRows {
            grad,
            indices,
            out,
            rows,
            cols,
            ..
        } => with(
            memory,
            [(grad, rows, e), (indices, rows, 8), (out, rows * cols, e)],
            |p| {
                let g = unsafe { Raw::<E>::new(p[0], rows) };
                let idx = unsafe { Raw::<i64>::new(p[1], rows) };
                let out = unsafe { Raw::<E>::new(p[2], rows * cols) };
                for r in 0..rows {
                    out.set(r * cols + idx.get(r) as usize, g.get(r));
                }
            },
        ),
        RowKernel::SumPartials {
            x,
            partial,
            rows,
            cols,
            chunks,
            ..
        } => with(
            memory,
            [(x, rows * cols, e), (partial, rows * chunks, 4)],
            |p| {
                let x = unsafe { Raw::<E>::new(p[0], rows * cols) };
                let partial = unsafe { Raw::<f32>::new(p[1], rows * chunks) };
                let span = cols.div_ceil(chunks);
                for w in 0..rows * chunks {
                    let (r, k) = (w / chunks, w % chunks);
                    let (begin, end) = ((k * span).min(cols), ((k + 1) * span).min(cols));
                    let acc: f32 = (begin..end).map(|c| x.get(r * cols + c).widen()).sum();
                    partial.set(w, acc);
                }
            },
        ),
        RowKernel::SumFinish {
            partial,
            out,
            rows,
            chunks,
            alpha,
            ..
        } => with(memory, [(partial, rows * chunks, 4), (out, rows, e)], |p| {
            let partial = unsafe { Raw::<f32>::new(p[0], rows * chunks) };
            let out = unsafe { Raw::<E>::new(p[1], rows) };
            for r in 0..rows {
                let acc: f32 = (0..chunks).map(|k| partial.get(r * chunks + k)).sum();
                out.set(r, E::narrow(alpha * acc));
            }
        }),
    }
}
