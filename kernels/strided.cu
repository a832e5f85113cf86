// Gathers a strided view into contiguous memory: element i of the output is the
// element of the view at the i-th index in row-major order. One kernel per element
// width, because a copy does not care what the bytes mean.

// BEGIN layout (source.rs also puts this part in the elementwise modules)
// Mirrors `Strided` in labs/core/src/kernels/strided.rs (passed by value).
struct Strided {
    unsigned long long rank;
    unsigned long long shape[8];
    long long strides[8];
};

// ANCHOR: strided_offset
// The element offset, in the source, of the i-th element in row-major order.
__device__ __forceinline__ long long strided_offset(const Strided& s, unsigned long long i) {
    long long offset = 0;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        unsigned long long size = s.shape[d];
        offset += (long long)(i % size) * s.strides[d];
        i /= size;
    }
    return offset;
}
// ANCHOR_END: strided_offset
// END layout

#define DEFINE_STRIDED_COPY(NAME, T)                                                  \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n) {                           \
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +     \
                                    threadIdx.x;                                      \
             i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                \
            dst[i] = src[strided_offset(layout, i)];                                  \
        }                                                                             \
    }

DEFINE_STRIDED_COPY(strided_copy_b1, unsigned char)
DEFINE_STRIDED_COPY(strided_copy_b2, unsigned short)
DEFINE_STRIDED_COPY(strided_copy_b4, unsigned int)
DEFINE_STRIDED_COPY(strided_copy_b8, unsigned long long)
