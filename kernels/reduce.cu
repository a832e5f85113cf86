// Row sums: out[r] = alpha * sum(in[r * cols + c] for c < cols), accumulated in float.
// source.rs prepends the element type's helpers (ELEM, to_float, from_float), as for
// the elementwise families. One warp per row, in a grid-stride loop over warps, so the
// launch's usual grid (elements = rows * 32) covers any number of rows; lanes stride
// over the row's columns and the warp adds its lanes' partial sums with shuffles.

extern "C" __global__ void sum_rows(const ELEM* in, ELEM* out, float alpha,
                                    unsigned long long rows, unsigned long long cols) {
    unsigned long long warp = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    unsigned long long warps = (gridDim.x * (unsigned long long)blockDim.x) / 32;
    unsigned int lane = threadIdx.x % 32;
    for (unsigned long long r = warp; r < rows; r += warps) {
        const ELEM* row = in + r * cols;
        float acc = 0.0f;
        for (unsigned long long c = lane; c < cols; c += 32) acc += to_float(row[c]);
        for (int offset = 16; offset > 0; offset /= 2)
            acc += __shfl_down_sync(0xffffffffu, acc, offset);
        if (lane == 0) out[r] = from_float(alpha * acc);
    }
}
