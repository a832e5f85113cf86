// Elementwise kernels over float32. Each is a grid-stride loop, so any grid size covers
// any n, and each has a CPU twin in labs/core/src/kernels/cpu.rs that the simulated GPU
// runs. n is 64-bit: tensors past 2^31 elements are real on an 80 GB card.

// ANCHOR: add_f32
extern "C" __global__ void add_f32(const float* a, const float* b, float* out,
                                   unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = a[i] + b[i];
    }
}
// ANCHOR_END: add_f32

extern "C" __global__ void mul_f32(const float* a, const float* b, float* out,
                                   unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = a[i] * b[i];
    }
}

// out = alpha * x (out may be x: in place).
extern "C" __global__ void scale_f32(const float* x, float alpha, float* out,
                                     unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = alpha * x[i];
    }
}

// y = alpha * x + y, the BLAS axpy.
extern "C" __global__ void axpy_f32(float alpha, const float* x, float* y,
                                    unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = alpha * x[i] + y[i];
    }
}

// A deliberately slow kernel: `iterations` dependent multiply-adds per element. The
// labs use it as a stand-in for real work of a chosen duration (for example to show
// that a launch returns long before the work is done).
extern "C" __global__ void spin_f32(float* x, unsigned long long n, unsigned int iterations) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = x[i];
        for (unsigned int k = 0; k < iterations; ++k) {
            v = v * 0.999999f + 0.000001f;
        }
        x[i] = v;
    }
}
