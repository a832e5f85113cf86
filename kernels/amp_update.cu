// Mixed precision: the gradient scaler's update (torch.amp.GradScaler's
// _amp_update_scale_, PyTorch's amp_update_scale_cuda_kernel). The scale (one float)
// and the growth tracker (one int) live in device memory, so the update runs on the
// device and the host never waits for it:
//
//   if found_inf:  scale *= backoff_factor;  tracker = 0
//   else:          tracker += 1
//                  if tracker == growth_interval: scale *= growth_factor (if finite); tracker = 0
//
// One thread does it (the launch has one element). found_inf is the sum of the
// optimizers' flags, so any non-zero value is an overflow. The products round once
// (__fmul_rn), as the CPU twin's float32 multiplication does. The CPU twin is
// `update_scale` in labs/core/device/src/kernels/amp_cpu.rs.

// ANCHOR: update_scale_kernel
extern "C" __global__ void amp_update_scale(float* scale, int* growth_tracker,
                                            const float* found_inf, float growth_factor,
                                            float backoff_factor,
                                            unsigned int growth_interval) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (*found_inf != 0.0f) {
        *scale = __fmul_rn(*scale, backoff_factor);
        *growth_tracker = 0;
        return;
    }
    int successful = *growth_tracker + 1;
    if ((unsigned int)successful == growth_interval) {
        float grown = __fmul_rn(*scale, growth_factor);
        if (fabsf(grown) <= 3.402823466e38f) *scale = grown;
        *growth_tracker = 0;
    } else {
        *growth_tracker = successful;
    }
}
// ANCHOR_END: update_scale_kernel
