//! The CPU twin of `kernels/amp.cu`: the same test and the same single rounding.

use super::amp::UnscaleGrad;
use super::cpu::{access, FloatElement, HostAccess, Raw};
use crate::error::Result;

/// The twin of `non_finite_check_and_unscale_*`.
pub(super) fn unscale<E: FloatElement>(k: &UnscaleGrad, memory: &dyn HostAccess) -> Result<()> {
    let n = k.n;
    if n == 0 {
        return Ok(());
    }
    let size = std::mem::size_of::<E>();
    access(memory, &[(k.grad, n * size), (k.found_inf, 4)], |p| {
        // SAFETY (each `Raw::new`): `p[k]` is valid for the k-th range asked.
        let grad = unsafe { Raw::<E>::new(p[0], n) };
        let found_inf = unsafe { Raw::<f32>::new(p[1], 1) };
        for i in 0..n {
            let g = grad.get(i).widen();
            if !g.is_finite() {
                found_inf.set(0, 1.0);
            }
            let unscaled = if k.inv_scale == 1.0 {
                g
            } else {
                g * k.inv_scale
            };
            grad.set(i, E::narrow(unscaled));
        }
    })
}
