//! The CPU twins of `kernels/amp.cu` and `kernels/amp_update.cu`: the same test, the
//! same single rounding, the same update rule.

use super::amp::{UnscaleGrad, UpdateScale};
use super::cpu::{access, FloatElement, HostAccess, Raw};
use crate::error::Result;

/// The twin of `non_finite_check_and_unscale_*`.
pub(super) fn unscale<E: FloatElement>(k: &UnscaleGrad, memory: &dyn HostAccess) -> Result<()> {
    let n = k.n;
    if n == 0 {
        return Ok(());
    }
    let size = std::mem::size_of::<E>();
    access(
        memory,
        &[(k.grad, n * size), (k.found_inf, 4), (k.scale, 4)],
        |p| {
            // SAFETY (each `Raw::new`): `p[k]` is valid for the k-th range asked.
            let grad = unsafe { Raw::<E>::new(p[0], n) };
            let found_inf = unsafe { Raw::<f32>::new(p[1], 1) };
            let scale = unsafe { Raw::<f32>::new(p[2], 1) };
            let inv_scale = (1.0 / scale.get(0) as f64) as f32;
            for i in 0..n {
                let g = grad.get(i).widen();
                if !g.is_finite() {
                    found_inf.set(0, 1.0);
                }
                let unscaled = if inv_scale == 1.0 { g } else { g * inv_scale };
                grad.set(i, E::narrow(unscaled));
            }
        },
    )
}

/// The twin of `amp_update_scale`.
pub(super) fn update_scale(k: &UpdateScale, memory: &dyn HostAccess) -> Result<()> {
    access(
        memory,
        &[(k.scale, 4), (k.growth_tracker, 4), (k.found_inf, 4)],
        |p| {
            // SAFETY (each `Raw::new`): `p[k]` is valid for the k-th range asked.
            let scale = unsafe { Raw::<f32>::new(p[0], 1) };
            let tracker = unsafe { Raw::<i32>::new(p[1], 1) };
            let found_inf = unsafe { Raw::<f32>::new(p[2], 1) };
            if found_inf.get(0) != 0.0 {
                scale.set(0, scale.get(0) * k.backoff_factor);
                tracker.set(0, 0);
                return;
            }
            let successful = tracker.get(0) + 1;
            if successful as u32 == k.growth_interval {
                let grown = scale.get(0) * k.growth_factor;
                if grown.is_finite() {
                    scale.set(0, grown);
                }
                tracker.set(0, 0);
            } else {
                tracker.set(0, successful);
            }
        },
    )
}
