//! CPU twins of `kernels/attention.cu`: the same float32 arithmetic, a straightforward
//! loop per row (scores of one row at a time, never the whole T x T matrix). The GPU
//! walks keys in tiles with a running max and sums lanes in another order: results
//! agree to rounding.

use half::{bf16, f16};

use super::attention::AttentionKernel;
use super::cpu::{access, float, Float, FloatElement, HostAccess, Raw};
use crate::error::Result;

pub(super) fn run(kernel: &AttentionKernel, memory: &dyn HostAccess) -> Result<()> {
    match float(kernel.dtype(), kernel.name())? {
        Float::F32 => run_typed::<f32>(kernel, memory),
        Float::F16 => run_typed::<f16>(kernel, memory),
        Float::BF16 => run_typed::<bf16>(kernel, memory),
    }
}

/// The elements of a dense tensor as float32.
fn widen<E: FloatElement>(raw: &Raw<E>, n: usize) -> Vec<f32> {
    (0..n).map(|i| raw.get(i).widen()).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The keys query row `i` sees.
fn visible(i: usize, tk: usize, causal: bool) -> usize {
    if causal {
        tk.min(i + 1)
    } else {
        tk
    }
}

fn run_typed<E: FloatElement>(kernel: &AttentionKernel, memory: &dyn HostAccess) -> Result<()> {
    let e = std::mem::size_of::<E>();
    // SAFETY (every `Raw::new` below): each pointer is valid for the range asked for it.
    match *kernel {
        AttentionKernel::Forward {
            q,
            k,
            v,
            out,
            lse,
            bh,
            tq,
            tk,
            d,
            scale,
            causal,
            ..
        } => {
            let (nq, nk) = (bh * tq * d, bh * tk * d);
            if nq == 0 {
                return Ok(());
            }
            let ranges = [
                (q, nq * e),
                (k, nk * e),
                (v, nk * e),
                (out, nq * e),
                (lse, bh * tq * 4),
            ];
            access(memory, &ranges, |p| {
                let (qr, kr, vr, or, lr) = unsafe {
                    (
                        Raw::<E>::new(p[0], nq),
                        Raw::<E>::new(p[1], nk),
                        Raw::<E>::new(p[2], nk),
                        Raw::<E>::new(p[3], nq),
                        Raw::<f32>::new(p[4], bh * tq),
                    )
                };
                let (qf, kf, vf) = (widen(&qr, nq), widen(&kr, nk), widen(&vr, nk));
                let mut scores = vec![0.0f32; tk];
                for b in 0..bh {
                    for i in 0..tq {
                        let row = &qf[(b * tq + i) * d..][..d];
                        let keys = visible(i, tk, causal);
                        for (j, s) in scores[..keys].iter_mut().enumerate() {
                            *s = dot(row, &kf[(b * tk + j) * d..][..d]) * scale;
                        }
                        let m = scores[..keys]
                            .iter()
                            .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                        let l: f32 = scores[..keys].iter().map(|s| (s - m).exp()).sum();
                        for c in 0..d {
                            let acc: f32 = (0..keys)
                                .map(|j| (scores[j] - m).exp() * vf[(b * tk + j) * d + c])
                                .sum();
                            or.set((b * tq + i) * d + c, E::narrow(acc / l));
                        }
                        lr.set(b * tq + i, m + l.ln());
                    }
                }
            })
        }
        AttentionKernel::Delta {
            out,
            dout,
            delta,
            rows,
            d,
            ..
        } => {
            let n = rows * d;
            if n == 0 {
                return Ok(());
            }
            access(
                memory,
                &[(out, n * e), (dout, n * e), (delta, rows * 4)],
                |p| {
                    let (o, g, dl) = unsafe {
                        (
                            Raw::<E>::new(p[0], n),
                            Raw::<E>::new(p[1], n),
                            Raw::<f32>::new(p[2], rows),
                        )
                    };
                    for r in 0..rows {
                        let s: f32 = (0..d)
                            .map(|c| o.get(r * d + c).widen() * g.get(r * d + c).widen())
                            .sum();
                        dl.set(r, s);
                    }
                },
            )
        }
        AttentionKernel::BackwardDq {
            q,
            k,
            v,
            dout,
            lse,
            delta,
            dq,
            bh,
            tq,
            tk,
            d,
            scale,
            causal,
            ..
        } => {
            let (nq, nk, rows) = (bh * tq * d, bh * tk * d, bh * tq);
            if nq == 0 {
                return Ok(());
            }
            let ranges = [
                (q, nq * e),
                (k, nk * e),
                (v, nk * e),
                (dout, nq * e),
                (lse, rows * 4),
                (delta, rows * 4),
                (dq, nq * e),
            ];
            access(memory, &ranges, |p| {
                let (qr, kr, vr, gr, lr, dr, dqr) = unsafe {
                    (
                        Raw::<E>::new(p[0], nq),
                        Raw::<E>::new(p[1], nk),
                        Raw::<E>::new(p[2], nk),
                        Raw::<E>::new(p[3], nq),
                        Raw::<f32>::new(p[4], rows),
                        Raw::<f32>::new(p[5], rows),
                        Raw::<E>::new(p[6], nq),
                    )
                };
                let (qf, kf, vf, gf) = (
                    widen(&qr, nq),
                    widen(&kr, nk),
                    widen(&vr, nk),
                    widen(&gr, nq),
                );
                let mut acc = vec![0.0f32; d];
                for b in 0..bh {
                    for i in 0..tq {
                        let r = b * tq + i;
                        let (qi, gi) = (&qf[r * d..][..d], &gf[r * d..][..d]);
                        acc.iter_mut().for_each(|a| *a = 0.0);
                        for j in 0..visible(i, tk, causal) {
                            let (kj, vj) =
                                (&kf[(b * tk + j) * d..][..d], &vf[(b * tk + j) * d..][..d]);
                            let p = (dot(qi, kj) * scale - lr.get(r)).exp();
                            let ds = p * (dot(gi, vj) - dr.get(r));
                            for (a, kc) in acc.iter_mut().zip(kj) {
                                *a += ds * kc;
                            }
                        }
                        for (c, a) in acc.iter().enumerate() {
                            dqr.set(r * d + c, E::narrow(a * scale));
                        }
                    }
                }
            })
        }
        AttentionKernel::BackwardDkDv {
            q,
            k,
            v,
            dout,
            lse,
            delta,
            dk,
            dv,
            bh,
            tq,
            tk,
            d,
            scale,
            causal,
            ..
        } => {
            let (nq, nk, rows) = (bh * tq * d, bh * tk * d, bh * tq);
            if nk == 0 {
                return Ok(());
            }
            let ranges = [
                (q, nq * e),
                (k, nk * e),
                (v, nk * e),
                (dout, nq * e),
                (lse, rows * 4),
                (delta, rows * 4),
                (dk, nk * e),
                (dv, nk * e),
            ];
            access(memory, &ranges, |p| {
                let (qr, kr, vr, gr, lr, dr, dkr, dvr) = unsafe {
                    (
                        Raw::<E>::new(p[0], nq),
                        Raw::<E>::new(p[1], nk),
                        Raw::<E>::new(p[2], nk),
                        Raw::<E>::new(p[3], nq),
                        Raw::<f32>::new(p[4], rows),
                        Raw::<f32>::new(p[5], rows),
                        Raw::<E>::new(p[6], nk),
                        Raw::<E>::new(p[7], nk),
                    )
                };
                let (qf, kf, vf, gf) = (
                    widen(&qr, nq),
                    widen(&kr, nk),
                    widen(&vr, nk),
                    widen(&gr, nq),
                );
                let (mut dk_acc, mut dv_acc) = (vec![0.0f32; d], vec![0.0f32; d]);
                for b in 0..bh {
                    for j in 0..tk {
                        let (kj, vj) = (&kf[(b * tk + j) * d..][..d], &vf[(b * tk + j) * d..][..d]);
                        dk_acc.iter_mut().for_each(|a| *a = 0.0);
                        dv_acc.iter_mut().for_each(|a| *a = 0.0);
                        let first = if causal { j } else { 0 };
                        for i in first..tq {
                            let r = b * tq + i;
                            let (qi, gi) = (&qf[r * d..][..d], &gf[r * d..][..d]);
                            let p = (dot(qi, kj) * scale - lr.get(r)).exp();
                            let ds = p * (dot(gi, vj) - dr.get(r));
                            for (a, g) in dv_acc.iter_mut().zip(gi) {
                                *a += p * g;
                            }
                            for (a, qc) in dk_acc.iter_mut().zip(qi) {
                                *a += ds * qc;
                            }
                        }
                        for c in 0..d {
                            dkr.set((b * tk + j) * d + c, E::narrow(dk_acc[c] * scale));
                            dvr.set((b * tk + j) * d + c, E::narrow(dv_acc[c]));
                        }
                    }
                }
            })
        }
    }
}
