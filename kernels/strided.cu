// Gathers a strided view into contiguous memory: element i of the output is the
// element of the view at the i-th index in row-major order. One kernel per element
// width, because a copy does not care what the bytes mean.
//
// Two things keep it near memory bandwidth. A view whose last dimension is contiguous
// (a narrowed or permuted tensor whose rows stay whole, the common case), with its row
// lengths and other strides multiples of 16 bytes and both pointers 16-byte aligned,
// is moved 16 bytes at a time: the same loop over a layout counted in 16-byte
// vectors. And a launch of fewer than 2^32 elements computes offsets with 32-bit
// division, several times cheaper than 64-bit. The host merges dimensions that are
// contiguous with one another before the launch (`Strided::coalesced`), so most views
// have a rank of two or three.

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

// Sixteen bytes, moved by one load and one store.
struct alignas(16) Vec16 {
    unsigned long long lo, hi;
};

// `strided_offset` for an index below 2^32 (every size is then below 2^32 too).
__device__ __forceinline__ long long strided_offset32(const Strided& s, unsigned int i) {
    long long offset = 0;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        unsigned int size = (unsigned int)s.shape[d];
        offset += (long long)(i % size) * s.strides[d];
        i /= size;
    }
    return offset;
}

// Whether a view of T elements can be moved 16 bytes at a time: the last dimension
// contiguous and a whole number of vectors long, every other stride a whole number of
// vectors, both pointers aligned to 16 bytes.
template <typename T>
__device__ __forceinline__ bool moves_in_vectors(const void* a, const void* b,
                                                 const Strided& s) {
    const long long v = 16 / (long long)sizeof(T);
    if (v <= 1 || s.rank == 0) return false;
    if (s.strides[s.rank - 1] != 1 || s.shape[s.rank - 1] % (unsigned long long)v != 0)
        return false;
    if ((((unsigned long long)a) | ((unsigned long long)b)) % 16 != 0) return false;
    for (int d = 0; d + 1 < (int)s.rank; ++d)
        if (s.shape[d] > 1 && s.strides[d] % v != 0) return false;
    return true;
}

// The same view counted in 16-byte vectors (for a view `moves_in_vectors` accepts).
template <typename T>
__device__ __forceinline__ Strided in_vectors(const Strided& s) {
    const long long v = 16 / (long long)sizeof(T);
    Strided out = s;
    out.shape[s.rank - 1] = s.shape[s.rank - 1] / (unsigned long long)v;
    for (int d = 0; d + 1 < (int)s.rank; ++d) out.strides[d] = s.strides[d] / v;
    return out;
}

// The grid-stride loop of a copy (the view is the source) or a scatter (the view is
// the destination) of n elements of T.
template <typename T, bool SCATTER>
__device__ __forceinline__ void strided_move(const T* src, T* dst, const Strided& s,
                                             unsigned long long n) {
    unsigned long long first = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    if (n <= 0xffffffffull) {
        for (unsigned long long i = first; i < n; i += step) {
            long long o = strided_offset32(s, (unsigned int)i);
            if (SCATTER) {
                dst[o] = src[i];
            } else {
                dst[i] = src[o];
            }
        }
    } else {
        for (unsigned long long i = first; i < n; i += step) {
            long long o = strided_offset(s, i);
            if (SCATTER) {
                dst[o] = src[i];
            } else {
                dst[i] = src[o];
            }
        }
    }
}

// A copy or scatter of T elements, in 16-byte vectors when the view allows.
template <typename T, bool SCATTER>
__device__ __forceinline__ void strided_kernel(const T* src, T* dst, const Strided& s,
                                               unsigned long long n) {
    if (moves_in_vectors<T>(src, dst, s)) {
        const unsigned long long v = 16 / sizeof(T);
        strided_move<Vec16, SCATTER>((const Vec16*)src, (Vec16*)dst, in_vectors<T>(s),
                                     n / v);
    } else {
        strided_move<T, SCATTER>(src, dst, s, n);
    }
}

#define DEFINE_STRIDED_COPY(NAME, T)                                                  \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n) {                           \
        strided_kernel<T, false>(src, dst, layout, n);                                \
    }

DEFINE_STRIDED_COPY(strided_copy_b1, unsigned char)
DEFINE_STRIDED_COPY(strided_copy_b2, unsigned short)
DEFINE_STRIDED_COPY(strided_copy_b4, unsigned int)
DEFINE_STRIDED_COPY(strided_copy_b8, unsigned long long)
