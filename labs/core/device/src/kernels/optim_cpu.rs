//! CPU twins of `kernels/optim.cu`: the same arithmetic in the same order, one rounding
//! per operation (the CUDA source spells its roundings out so that it does not fuse
//! them into `fma`), so `sim` gives the GPU's bits.

use super::cpu::{access, FloatElement, HostAccess, Raw};
use super::optim::{AdamStep, SgdStep};
use crate::error::Result;

/// The twin of `sgd_step_*`.
pub(super) fn sgd<E: FloatElement>(s: &SgdStep, memory: &dyn HostAccess) -> Result<()> {
    let n = s.n;
    if n == 0 {
        return Ok(());
    }
    let size = std::mem::size_of::<E>();
    let with_buffer = s.momentum != 0.0;
    let mut ranges = vec![(s.param, n * size), (s.grad, n * size)];
    if with_buffer {
        ranges.push((s.momentum_buffer, n * 4));
    }
    access(memory, &ranges, |p| {
        // SAFETY (each `Raw::new`): `p[k]` is valid for the k-th range asked.
        let param = unsafe { Raw::<E>::new(p[0], n) };
        let grad = unsafe { Raw::<E>::new(p[1], n) };
        let buf = with_buffer.then(|| unsafe { Raw::<f32>::new(p[2], n) });
        for i in 0..n {
            let p = param.get(i).widen();
            let mut d = grad.get(i).widen();
            if s.weight_decay != 0.0 {
                d += s.weight_decay * p;
            }
            if let Some(buf) = &buf {
                let b = if s.first {
                    d
                } else {
                    s.momentum * buf.get(i) + (1.0 - s.dampening) * d
                };
                buf.set(i, b);
                d = if s.nesterov { d + s.momentum * b } else { b };
            }
            param.set(i, E::narrow(p - s.lr * d));
        }
    })
}

/// The twin of `adam_step_*`.
pub(super) fn adam<E: FloatElement>(s: &AdamStep, memory: &dyn HostAccess) -> Result<()> {
    let n = s.n;
    if n == 0 {
        return Ok(());
    }
    let size = std::mem::size_of::<E>();
    let mut ranges = vec![
        (s.param, n * size),
        (s.grad, n * size),
        (s.exp_avg, n * 4),
        (s.exp_avg_sq, n * 4),
    ];
    if s.step != 0 {
        ranges.push((s.step, 4));
    }
    access(memory, &ranges, |p| {
        // capturable: the bias corrections from the count on the device, in float32 as
        // the kernel computes them.
        let (step_size, bias_correction2_sqrt) = if s.step != 0 {
            // SAFETY: `p[4]` is valid for the 4 bytes of the step asked above.
            let t = unsafe { Raw::<f32>::new(p[4], 1) }.get(0);
            let beta1 = 1.0f32 - s.one_minus_beta1;
            (s.lr / (1.0 - beta1.powf(t)), (1.0 - s.beta2.powf(t)).sqrt())
        } else {
            (s.step_size, s.bias_correction2_sqrt)
        };
        // SAFETY (each `Raw::new`): `p[k]` is valid for the k-th range asked.
        let param = unsafe { Raw::<E>::new(p[0], n) };
        let grad = unsafe { Raw::<E>::new(p[1], n) };
        let exp_avg = unsafe { Raw::<f32>::new(p[2], n) };
        let exp_avg_sq = unsafe { Raw::<f32>::new(p[3], n) };
        for i in 0..n {
            let mut p = param.get(i).widen();
            let mut g = grad.get(i).widen();
            if s.param_decay != 1.0 {
                p *= s.param_decay;
            }
            if s.weight_decay != 0.0 {
                g += s.weight_decay * p;
            }
            let mut m = exp_avg.get(i);
            m += s.one_minus_beta1 * (g - m);
            let v = s.beta2 * exp_avg_sq.get(i) + s.one_minus_beta2 * (g * g);
            exp_avg.set(i, m);
            exp_avg_sq.set(i, v);
            let denom = v.sqrt() / bias_correction2_sqrt + s.eps;
            param.set(i, E::narrow(p - step_size * (m / denom)));
        }
    })
}
