// Optimizer steps: one fused pass per parameter that reads the gradient, updates the
// optimizer's state and writes the parameter, with PyTorch's update rules
// (torch.optim.SGD, Adam and AdamW). source.rs prepends the element type's helpers
// (ELEM, to_float, from_float) of the parameter's dtype and renames each function
// `{name}_{dtype}`. The parameter and its gradient are ELEM; the state (momentum
// buffer, exp_avg, exp_avg_sq) is always float, whatever the parameter's dtype. The
// host computes every per-step scalar (bias corrections, step size) in double, as
// PyTorch does in Python, and passes them as float; except for a capturable Adam, whose
// step count lives on the device and whose kernel computes them from it in float. Grid-stride loops, 64-bit sizes.
// The explicit __fmul_rn/__fadd_rn keep NVRTC from contracting into fma, so the GPU
// gives the CPU twin's bits (labs/core/device/src/kernels/optim_cpu.rs).

// SGD: d = g + weight_decay * p; with momentum, buf = g on the first step (PyTorch
// clones it, no dampening), else buf = momentum * buf + (1 - dampening) * d; nesterov
// uses d + momentum * buf, else buf; p -= lr * d. `buf` is unused when momentum is 0.
extern "C" __global__ void sgd_step(ELEM* param, const ELEM* grad, float* buf,
                                    float lr, float momentum, float dampening,
                                    float weight_decay, unsigned int nesterov,
                                    unsigned int first, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        float p = to_float(param[i]);
        float d = to_float(grad[i]);
        if (weight_decay != 0.0f) d = __fadd_rn(d, __fmul_rn(weight_decay, p));
        if (momentum != 0.0f) {
            float b;
            if (first) {
                b = d;
            } else {
                b = __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(1.0f - dampening, d));
            }
            buf[i] = b;
            d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
        }
        param[i] = from_float(__fsub_rn(p, __fmul_rn(lr, d)));
    }
}

// Adam and AdamW (torch.optim.Adam, non-amsgrad): `weight_decay` is Adam's L2 term
// added to the gradient (0 for AdamW); `param_decay` multiplies the parameter first
// (AdamW's decoupled decay 1 - lr * weight_decay; 1 for Adam).
//   m = m + (1 - beta1) * (g - m)            (exp_avg.lerp_(g, 1 - beta1))
//   v = beta2 * v + (1 - beta2) * g * g      (exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2))
//   p = p - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bias_correction2_sqrt = sqrt(1 - beta2^t);
// 1 - beta1 and 1 - beta2 come from the host too (Python computes them in double).
extern "C" __global__ void adam_step(ELEM* param, const ELEM* grad, float* exp_avg,
                                     float* exp_avg_sq, float one_minus_beta1, float beta2,
                                     float one_minus_beta2,
                                     float step_size, float bias_correction2_sqrt,
                                     float eps, float weight_decay, float param_decay,
                                     const float* step, float lr,
                                     unsigned long long n) {
    // capturable: the count on the device, the bias corrections from it (as PyTorch's
    // capturable Adam computes them, in float32).
    if (step != nullptr) {
        float t = *step;
        step_size = __fdiv_rn(lr, __fsub_rn(1.0f, powf(__fsub_rn(1.0f, one_minus_beta1), t)));
        bias_correction2_sqrt = sqrtf(__fsub_rn(1.0f, powf(beta2, t)));
    }
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        float p = to_float(param[i]);
        float g = to_float(grad[i]);
        if (param_decay != 1.0f) p = __fmul_rn(p, param_decay);
        if (weight_decay != 0.0f) g = __fadd_rn(g, __fmul_rn(weight_decay, p));
        float m = exp_avg[i];
        m = __fadd_rn(m, __fmul_rn(one_minus_beta1, __fsub_rn(g, m)));
        float v = __fadd_rn(__fmul_rn(beta2, exp_avg_sq[i]),
                            __fmul_rn(one_minus_beta2, __fmul_rn(g, g)));
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        float denom = __fadd_rn(__fdiv_rn(sqrtf(v), bias_correction2_sqrt), eps);
        param[i] = from_float(__fsub_rn(p, __fmul_rn(step_size, __fdiv_rn(m, denom))));
    }
}
