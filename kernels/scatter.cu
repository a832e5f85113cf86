// The inverse of the strided copy: contiguous elements written into a strided view
// (`cat` writes each input into its `narrow`ed part of the output this way). Not
// compiled as it is: source.rs prepends the layout and moves parts of
// kernels/strided.cu (`Strided`, `strided_kernel` with its 16-byte vectors, and
// `tiled_move` for transposes). One kernel family per element width; the twin is
// `strided_scatter` in labs/core/device/src/kernels/cpu_rows.rs.

#define DEFINE_STRIDED_SCATTER(NAME, T)                                               \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n) {                           \
        strided_kernel<T, true>(src, dst, layout, n);                                 \
    }

// The tiled transpose, launched with blocks of STRIDED_TILE x STRIDED_TILE_ROWS
// threads; `dim` is the view's dimension of stride 1.
#define DEFINE_STRIDED_SCATTER_TILED(NAME, T)                                         \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n, unsigned int dim) {         \
        __shared__ T tile[STRIDED_TILE][STRIDED_TILE + 1];                            \
        tiled_move<T, true>(src, dst, layout, dim, tile);                             \
    }

DEFINE_STRIDED_SCATTER(strided_scatter_b1, unsigned char)
DEFINE_STRIDED_SCATTER(strided_scatter_b2, unsigned short)
DEFINE_STRIDED_SCATTER(strided_scatter_b4, unsigned int)
DEFINE_STRIDED_SCATTER(strided_scatter_b8, unsigned long long)
DEFINE_STRIDED_SCATTER_TILED(strided_scatter_tiled_b1, unsigned char)
DEFINE_STRIDED_SCATTER_TILED(strided_scatter_tiled_b2, unsigned short)
DEFINE_STRIDED_SCATTER_TILED(strided_scatter_tiled_b4, unsigned int)
DEFINE_STRIDED_SCATTER_TILED(strided_scatter_tiled_b8, unsigned long long)
