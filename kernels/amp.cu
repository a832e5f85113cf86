// Mixed precision: the gradient scaler's fused check (torch.amp.GradScaler's
// _amp_foreach_non_finite_check_and_unscale_). One launch per gradient multiplies
// every element by the inverse of the scale in place and, if any element was infinite
// or NaN before
// the multiplication, sets the single float at found_inf to 1. Every thread that sees
// one writes the same value, so the race is benign and no atomic is needed; found_inf
// is never reset here (the scaler zeroes it once per step), so one flag can collect
// every gradient's check. source.rs prepends the element type's helpers (ELEM,
// to_float, from_float) and renames the function `{name}_{dtype}`. The finiteness test
// is a comparison (NaN fails it, an infinity exceeds FLT_MAX), so it needs no header.
// The scale is read from device memory (the scaler keeps it there, so that no step has
// to copy it to the host) and inverted as PyTorch does, in double precision rounded to
// float: `scale.double().reciprocal().float()`.
// The CPU twin is labs/core/device/src/kernels/amp_cpu.rs.

// ANCHOR: unscale_kernel
extern "C" __global__ void non_finite_check_and_unscale(ELEM* grad, float* found_inf,
                                                        const float* scale,
                                                        unsigned long long n) {
    float inv_scale = (float)(1.0 / (double)(*scale));
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        float g = to_float(grad[i]);
        if (!(fabsf(g) <= 3.402823466e38f)) *found_inf = 1.0f;
        grad[i] = from_float(inv_scale == 1.0f ? g : __fmul_rn(g, inv_scale));
    }
}
// ANCHOR_END: unscale_kernel
