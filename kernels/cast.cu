// Casts between dtypes (PyTorch's `tensor.to(dtype)`). source.rs prepends every
// section of kernels/dtypes.cu, each in a namespace named after its dtype (f32, f16,
// bf16, i32, i64, u8), then appends one DEFINE_CAST line per pair of distinct dtypes.
//
// An element goes from its math type to the destination's math type by a C cast:
// float to integer truncates toward zero (uint8 goes through int, so -1.0 wraps to
// 255 as in PyTorch); integer to float rounds to nearest; integer to integer keeps the
// low bits. Then the destination narrows (float16 and bfloat16 round to nearest even).

#define CAST_LOOP(i, n)                                                               \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +         \
                                threadIdx.x;                                          \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

#define DEFINE_CAST(NAME, FROM, TO)                                                   \
    extern "C" __global__ void NAME(const FROM::ELEM* in, TO::ELEM* out,              \
                                    unsigned long long n) {                           \
        CAST_LOOP(i, n) { out[i] = TO::from_math((TO::MATH)FROM::to_math(in[i])); }   \
    }
