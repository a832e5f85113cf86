// The inverse of the strided copy: contiguous elements written into a strided view
// (`cat` writes each input into its `narrow`ed part of the output this way). Not
// compiled as it is: source.rs prepends kernels/strided.cu for `Strided` and
// `strided_kernel` (16-byte vectors when the view allows). One kernel per element
// width; the twin is `strided_scatter` in labs/core/src/kernels/cpu_rows.rs.

#define DEFINE_STRIDED_SCATTER(NAME, T)                                               \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n) {                           \
        strided_kernel<T, true>(src, dst, layout, n);                                 \
    }

DEFINE_STRIDED_SCATTER(strided_scatter_b1, unsigned char)
DEFINE_STRIDED_SCATTER(strided_scatter_b2, unsigned short)
DEFINE_STRIDED_SCATTER(strided_scatter_b4, unsigned int)
DEFINE_STRIDED_SCATTER(strided_scatter_b8, unsigned long long)
