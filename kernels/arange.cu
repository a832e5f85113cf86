// out[i] = start + i for an int64 tensor of n elements: torch.arange on the device,
// which a captured graph can replay (a copy of host values cannot be captured).
// Grid-stride loop, 64-bit sizes.

extern "C" __global__ void arange_i64(long long* out, unsigned long long n, long long start) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = start + (long long)i;
    }
}
