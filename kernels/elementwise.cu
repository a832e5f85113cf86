// The templates of the elementwise op families. This file is not compiled as it is:
// labs/core/src/kernels/source.rs prepends the element type's helpers (ELEM, to_float,
// from_float) and appends one DEFINE_* line per op of labs/core/src/kernels/ops.rs, for
// example `DEFINE_BINARY(add_f32, a + b)`, then NVRTC compiles the result.
//
// Every kernel is a grid-stride loop, so any grid size covers any n; n is 64-bit
// because tensors past 2^31 elements are real on an 80 GB card. Each element is
// widened to float, the op's expression runs in float, and the result is rounded back
// to the element type.

#define GRID_STRIDE_LOOP(i, n)                                                        \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +         \
                                threadIdx.x;                                          \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// ANCHOR: unary_template
// out[i] = EXPR(x[i]); `out` may be `in` (in place).
#define DEFINE_UNARY(NAME, EXPR)                                                      \
    extern "C" __global__ void NAME(const ELEM* in, ELEM* out, float alpha,           \
                                    unsigned long long n) {                           \
        GRID_STRIDE_LOOP(i, n) {                                                      \
            float x = to_float(in[i]);                                                \
            out[i] = from_float(EXPR);                                                \
        }                                                                             \
    }
// ANCHOR_END: unary_template

// ANCHOR: binary_template
// out[i] = EXPR(a[i], b[i]); `out` may be either input (in place).
#define DEFINE_BINARY(NAME, EXPR)                                                     \
    extern "C" __global__ void NAME(const ELEM* a_, const ELEM* b_, ELEM* out,        \
                                    float alpha, unsigned long long n) {              \
        GRID_STRIDE_LOOP(i, n) {                                                      \
            float a = to_float(a_[i]);                                                \
            float b = to_float(b_[i]);                                                \
            out[i] = from_float(EXPR);                                                \
        }                                                                             \
    }
// ANCHOR_END: binary_template
