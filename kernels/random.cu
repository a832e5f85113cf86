// Standard-normal random numbers from a counter-based generator: element i of a
// tensor made with (seed, offset) depends only on (seed, offset + i), so the GPU and
// the CPU twin produce the same stream (up to the last bits of logf/cosf) and any
// slice can be generated independently, in any order.

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void randn_f32(float* out, unsigned long long n,
                                     unsigned long long seed, unsigned long long offset) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long bits = splitmix64(seed ^ splitmix64(offset + i));
        // Two 24-bit uniforms; u1 in (0, 1] so that logf never sees zero.
        float u1 = ((float)(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);
        float u2 = (float)((bits >> 16) & 0xFFFFFFull) * (1.0f / 16777216.0f);
        out[i] = sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
    }
}
