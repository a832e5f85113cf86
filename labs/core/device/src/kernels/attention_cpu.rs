//! CPU twins of `kernels/attention.cu`: the same float32 arithmetic, a straightforward
//! loop per row (scores of one row at a time, never the whole T x T matrix). The GPU
//! walks keys in tiles with a running max and sums lanes in another order: results
//! agree to rounding. The dropout flags are the GPU's bit for bit
//! ([`attention_keep_row`]).

use half::{bf16, f16};

use super::attention::{
    attention_keep_row, AttentionDropout, AttentionKernel, AttentionShape, HeadsOperand,
};
use super::cpu::{access, float, Float, FloatElement, HostAccess, Raw};
use crate::device_id::DevicePtr;
use crate::error::Result;

pub(super) fn run(kernel: &AttentionKernel, memory: &dyn HostAccess) -> Result<()> {
    match float(kernel.dtype(), kernel.name())? {
        Float::F32 => run_typed::<f32>(kernel, memory),
        Float::F16 => run_typed::<f16>(kernel, memory),
        Float::BF16 => run_typed::<bf16>(kernel, memory),
    }
}

/// An operand of `t` rows per batch-head as the kernels see it.
struct Rows<'a> {
    op: &'a HeadsOperand,
    shape: &'a AttentionShape,
    t: usize,
}

impl Rows<'_> {
    fn len(&self) -> usize {
        self.op
            .extent(self.shape.bh, self.shape.heads, self.t, self.shape.d)
    }
    fn range(&self, e: usize) -> (DevicePtr, usize) {
        (self.op.ptr, self.len() * e)
    }
    /// The operand's rows as a dense float32 `[bh, t, d]`.
    fn gather<E: FloatElement>(&self, raw: &Raw<E>) -> Vec<f32> {
        let (s, d) = (self.shape, self.shape.d);
        let mut out = Vec::with_capacity(s.bh * self.t * d);
        for b in 0..s.bh {
            for i in 0..self.t {
                let start = self.op.row(b, s.heads, i);
                out.extend((0..d).map(|c| raw.get(start + c).widen()));
            }
        }
        out
    }
    /// Writes a dense `[bh, t, d]` into the operand's rows.
    fn scatter<E: FloatElement>(&self, raw: &Raw<E>, values: &[f32]) {
        let (s, d) = (self.shape, self.shape.d);
        for b in 0..s.bh {
            for i in 0..self.t {
                let start = self.op.row(b, s.heads, i);
                for c in 0..d {
                    raw.set(start + c, E::narrow(values[(b * self.t + i) * d + c]));
                }
            }
        }
    }
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

/// The factor each weight of row `row` takes: `Z / keep` under dropout, 1 without.
fn factors(dropout: &AttentionDropout, row: usize, tk: usize) -> Vec<f32> {
    if !dropout.active() {
        return vec![1.0; tk];
    }
    let scale = dropout.scale();
    attention_keep_row(dropout, row, tk)
        .into_iter()
        .map(|kept| if kept { scale } else { 0.0 })
        .collect()
}

/// The inputs the backward kernels share, gathered: q, k, v, dO, lse, delta.
struct Backward {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    lse: Vec<f32>,
    delta: Vec<f32>,
}

fn run_typed<E: FloatElement>(kernel: &AttentionKernel, memory: &dyn HostAccess) -> Result<()> {
    let e = std::mem::size_of::<E>();
    // SAFETY (every `Raw::new` below): each pointer is valid for the range asked for it.
    match kernel {
        AttentionKernel::Forward {
            q,
            k,
            v,
            out,
            lse,
            shape,
            scale,
            causal,
            dropout,
            ..
        } => {
            let s = *shape;
            let (tq, tk, d) = (s.tq, s.tk, s.d);
            let rq = |op| Rows { op, shape, t: tq };
            let rk = |op| Rows { op, shape, t: tk };
            let (q, k, v, out) = (rq(q), rk(k), rk(v), rq(out));
            if s.bh * tq * d == 0 {
                return Ok(());
            }
            let ranges = [
                q.range(e),
                k.range(e),
                v.range(e),
                out.range(e),
                (*lse, s.bh * tq * 4),
            ];
            access(memory, &ranges, |p| {
                let raw = |i: usize, n| unsafe { Raw::<E>::new(p[i], n) };
                let (qf, kf, vf) = (
                    q.gather(&raw(0, q.len())),
                    k.gather(&raw(1, k.len())),
                    v.gather(&raw(2, v.len())),
                );
                let lr = unsafe { Raw::<f32>::new(p[4], s.bh * tq) };
                let mut of = vec![0.0f32; s.bh * tq * d];
                let mut scores = vec![0.0f32; tk];
                for b in 0..s.bh {
                    for i in 0..tq {
                        let r = b * tq + i;
                        let row = &qf[r * d..][..d];
                        let keys = visible(i, tk, *causal);
                        let z = factors(dropout, r, tk);
                        for (j, sc) in scores[..keys].iter_mut().enumerate() {
                            *sc = dot(row, &kf[(b * tk + j) * d..][..d]) * scale;
                        }
                        let m = scores[..keys]
                            .iter()
                            .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                        let l: f32 = scores[..keys].iter().map(|s| (s - m).exp()).sum();
                        for c in 0..d {
                            let acc: f32 = (0..keys)
                                .map(|j| (scores[j] - m).exp() * z[j] * vf[(b * tk + j) * d + c])
                                .sum();
                            of[r * d + c] = acc / l;
                        }
                        lr.set(r, m + l.ln());
                    }
                }
                out.scatter(&raw(3, out.len()), &of);
            })
        }
        AttentionKernel::Delta {
            out,
            dout,
            delta,
            shape,
            ..
        } => {
            let (rows, d) = (shape.bh * shape.tq, shape.d);
            if rows * d == 0 {
                return Ok(());
            }
            let (o, g) = (
                Rows {
                    op: out,
                    shape,
                    t: shape.tq,
                },
                Rows {
                    op: dout,
                    shape,
                    t: shape.tq,
                },
            );
            access(memory, &[o.range(e), g.range(e), (*delta, rows * 4)], |p| {
                let (of, gf) = unsafe {
                    (
                        o.gather(&Raw::<E>::new(p[0], o.len())),
                        g.gather(&Raw::<E>::new(p[1], g.len())),
                    )
                };
                let dl = unsafe { Raw::<f32>::new(p[2], rows) };
                for r in 0..rows {
                    dl.set(r, dot(&of[r * d..][..d], &gf[r * d..][..d]));
                }
            })
        }
        AttentionKernel::BackwardDq {
            q,
            k,
            v,
            dout,
            lse,
            delta,
            dq,
            shape,
            scale,
            causal,
            dropout,
            ..
        } => {
            let s = *shape;
            if s.bh * s.tq * s.d == 0 {
                return Ok(());
            }
            let dq = Rows {
                op: dq,
                shape,
                t: s.tq,
            };
            backward::<E>(
                memory,
                [q, k, v, dout],
                *lse,
                *delta,
                &[dq.range(e)],
                shape,
                |x, p| {
                    let (tq, tk, d) = (s.tq, s.tk, s.d);
                    let mut dqf = vec![0.0f32; s.bh * tq * d];
                    for b in 0..s.bh {
                        for i in 0..tq {
                            let r = b * tq + i;
                            let (qi, gi) = (&x.q[r * d..][..d], &x.g[r * d..][..d]);
                            let z = factors(dropout, r, tk);
                            let acc = &mut dqf[r * d..][..d];
                            for (j, zj) in z[..visible(i, tk, *causal)].iter().enumerate() {
                                let (kj, vj) =
                                    (&x.k[(b * tk + j) * d..][..d], &x.v[(b * tk + j) * d..][..d]);
                                let p = (dot(qi, kj) * scale - x.lse[r]).exp();
                                let ds = p * (dot(gi, vj) * zj - x.delta[r]);
                                for (a, kc) in acc.iter_mut().zip(kj) {
                                    *a += ds * kc;
                                }
                            }
                            acc.iter_mut().for_each(|a| *a *= scale);
                        }
                    }
                    dq.scatter(&unsafe { Raw::<E>::new(p[0], dq.len()) }, &dqf);
                },
            )
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
            shape,
            scale,
            causal,
            dropout,
            ..
        } => {
            let s = *shape;
            if s.bh * s.tk * s.d == 0 {
                return Ok(());
            }
            let rk = |op| Rows { op, shape, t: s.tk };
            let (dk, dv) = (rk(dk), rk(dv));
            let outs = [dk.range(e), dv.range(e)];
            backward::<E>(
                memory,
                [q, k, v, dout],
                *lse,
                *delta,
                &outs,
                shape,
                |x, p| {
                    let (tq, tk, d) = (s.tq, s.tk, s.d);
                    let (mut dkf, mut dvf) =
                        (vec![0.0f32; s.bh * tk * d], vec![0.0f32; s.bh * tk * d]);
                    for b in 0..s.bh {
                        for i in 0..tq {
                            // Row by row of queries, so that each row's flags are drawn once.
                            let r = b * tq + i;
                            let (qi, gi) = (&x.q[r * d..][..d], &x.g[r * d..][..d]);
                            let z = factors(dropout, r, tk);
                            for (j, zj) in z[..visible(i, tk, *causal)].iter().enumerate() {
                                let kr = (b * tk + j) * d;
                                let (kj, vj) = (&x.k[kr..][..d], &x.v[kr..][..d]);
                                let p = (dot(qi, kj) * scale - x.lse[r]).exp();
                                let ds = p * (dot(gi, vj) * zj - x.delta[r]);
                                for (a, g) in dvf[kr..][..d].iter_mut().zip(gi) {
                                    *a += p * zj * g;
                                }
                                for (a, qc) in dkf[kr..][..d].iter_mut().zip(qi) {
                                    *a += ds * qc;
                                }
                            }
                        }
                    }
                    dkf.iter_mut().for_each(|a| *a *= scale);
                    dk.scatter(&unsafe { Raw::<E>::new(p[0], dk.len()) }, &dkf);
                    dv.scatter(&unsafe { Raw::<E>::new(p[1], dv.len()) }, &dvf);
                },
            )
        }
    }
}

/// Gathers the backward kernels' shared inputs and hands them to `f` with the host
/// pointers of the `outputs` ranges.
#[allow(clippy::too_many_arguments)]
fn backward<E: FloatElement>(
    memory: &dyn HostAccess,
    [q, k, v, dout]: [&HeadsOperand; 4],
    lse: DevicePtr,
    delta: DevicePtr,
    outputs: &[(DevicePtr, usize)],
    shape: &AttentionShape,
    f: impl FnOnce(&Backward, &[*mut u8]),
) -> Result<()> {
    let e = std::mem::size_of::<E>();
    let rows = shape.bh * shape.tq;
    let (rq, rk) = (
        |op| Rows {
            op,
            shape,
            t: shape.tq,
        },
        |op| Rows {
            op,
            shape,
            t: shape.tk,
        },
    );
    let (q, k, v, g) = (rq(q), rk(k), rk(v), rq(dout));
    let mut ranges = vec![
        q.range(e),
        k.range(e),
        v.range(e),
        g.range(e),
        (lse, rows * 4),
        (delta, rows * 4),
    ];
    ranges.extend_from_slice(outputs);
    let mut f = Some(f);
    access(memory, &ranges, |p| {
        // SAFETY: each pointer is valid for the range asked for it.
        let raw = |i: usize, n| unsafe { Raw::<E>::new(p[i], n) };
        let floats = |i: usize| {
            let r = unsafe { Raw::<f32>::new(p[i], rows) };
            (0..rows).map(|j| r.get(j)).collect::<Vec<_>>()
        };
        let x = Backward {
            q: q.gather(&raw(0, q.len())),
            k: k.gather(&raw(1, k.len())),
            v: v.gather(&raw(2, v.len())),
            g: g.gather(&raw(3, g.len())),
            lse: floats(4),
            delta: floats(5),
        };
        if let Some(f) = f.take() {
            f(&x, &p[6..]);
        }
    })
}
