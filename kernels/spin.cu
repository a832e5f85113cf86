// A deliberately slow kernel: `iterations` dependent multiply-adds per element. The
// labs use it as a stand-in for real work of a chosen duration (for example to show
// that a launch returns long before the work is done). Its CPU twin is `spin` in
// labs/core/device/src/kernels/cpu.rs.
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
