// Gathers a strided view into contiguous memory: element i of the output is the
// element of the view at the i-th index in row-major order. One kernel family per
// element width, because a copy does not care what the bytes mean.
//
// What keeps it near memory bandwidth:
// - The layout stays in registers. Every loop over dimensions is unrolled over the
//   slots of the record and reads each shape and stride at a place known when
//   compiling. A slot picked at run time (`s.shape[rank - 1]`) would make each thread
//   copy the whole 136-byte record into local memory first, and read it back from
//   there for every element: for a few-MB tensor, more local-memory traffic than data.
// - Ranks 1 to 4 have loops of their own, so that an element's offset costs one
//   division per dimension below the outermost and nothing else; higher ranks share one
//   loop that skips the unused slots. A launch of fewer than 2^32 elements divides in
//   32 bits, several times cheaper than 64.
// - A view whose last dimension is contiguous (a narrowed or permuted tensor whose rows
//   stay whole, the common case), with its row length and other strides multiples of
//   16 bytes and both pointers 16-byte aligned, is moved 16 bytes at a time: the same
//   loop over the layout counted in 16-byte vectors.
// - A transpose, whose contiguous dimension is not the last, goes through shared-memory
//   tiles (`strided_copy_tiled_b*`): read along its contiguous dimension, written along
//   the last, so that both sides touch whole 32-byte sectors.
// The host merges dimensions that are contiguous with one another before the launch
// (`Strided::coalesced`), so most views have a rank of two to four, and picks the
// kernel and grid (`strided_plan` in labs/core/device/src/cuda/kernels.rs).

// BEGIN layout (source.rs also puts this part in the elementwise modules)
// Mirrors `Strided` in labs/core/device/src/kernels/strided.rs (passed by value).
#define STRIDED_MAX_DIMS 8
struct Strided {
    unsigned long long rank;
    unsigned long long shape[STRIDED_MAX_DIMS];
    long long strides[STRIDED_MAX_DIMS];
};

// ANCHOR: strided_offset
// The element offset, in the source, of the i-th element in row-major order. Unrolled
// over every slot, skipping those past the rank, so that the record is read in place
// (see the top of this file) rather than copied to local memory.
__device__ __forceinline__ long long strided_offset(const Strided& s, unsigned long long i) {
    long long offset = 0;
#pragma unroll
    for (int d = STRIDED_MAX_DIMS - 1; d >= 0; --d) {
        if (d < (int)s.rank) {
            unsigned long long size = s.shape[d];
            offset += (long long)(i % size) * s.strides[d];
            i /= size;
        }
    }
    return offset;
}
// ANCHOR_END: strided_offset
// END layout

// BEGIN moves (source.rs puts this part, after the layout, in the scatter module)
// Sixteen bytes, moved by one load and one store.
struct alignas(16) Vec16 {
    unsigned long long lo, hi;
};

// R dimensions of a layout, in registers as long as every index is a constant. `rank`
// is R, or, for the shared loop of higher ranks (MASKED), the view's rank (at most R).
template <int R>
struct Dims {
    unsigned long long shape[R];
    long long strides[R];
    int rank;
};

// The layout's first R slots, its last dimension counted in vectors of V elements
// (V = 1: elements) and the other strides in vectors too.
template <int R, bool MASKED, int V>
__device__ __forceinline__ Dims<R> dims_of(const Strided& s) {
    Dims<R> l;
    l.rank = MASKED ? (int)s.rank : R;
#pragma unroll
    for (int d = 0; d < R; ++d) {
        const bool last = d + 1 == l.rank;
        l.shape[d] = last ? s.shape[d] / V : s.shape[d];
        l.strides[d] = last ? s.strides[d] : s.strides[d] / V;
    }
    return l;
}

// The offset of the i-th element (or vector) of `l`. The outermost dimension needs no
// modulo: i is below the product of the sizes.
template <int R, bool MASKED, typename I>
__device__ __forceinline__ long long dims_offset(const Dims<R>& l, I i) {
    long long offset = 0;
#pragma unroll
    for (int d = R - 1; d > 0; --d) {
        if (!MASKED || d < l.rank) {
            const I size = (I)l.shape[d];
            offset += (long long)(i % size) * l.strides[d];
            i /= size;
        }
    }
    return offset + (long long)i * l.strides[0];
}

// The grid-stride loop of a copy (the view is the source) or a scatter (the view is
// the destination) of n units E, offsets computed in the index type I.
template <typename E, bool SCATTER, int R, bool MASKED, typename I>
__device__ __forceinline__ void move_dims(const E* src, E* dst, const Dims<R>& l,
                                          unsigned long long n) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += step) {
        const long long o = dims_offset<R, MASKED, I>(l, (I)i);
        if (SCATTER) {
            dst[o] = src[i];
        } else {
            dst[i] = src[o];
        }
    }
}

// The loop for the view's rank: one per rank up to 4, one shared above, and the shared
// one with 64-bit division for launches of 2^32 units or more.
template <typename E, bool SCATTER, int V>
__device__ __forceinline__ void move_ranked(const E* src, E* dst, const Strided& s,
                                            unsigned long long n) {
    if (n > 0xffffffffull) {
        move_dims<E, SCATTER, STRIDED_MAX_DIMS, true, unsigned long long>(
            src, dst, dims_of<STRIDED_MAX_DIMS, true, V>(s), n);
        return;
    }
    switch (s.rank) {
    case 0:
    case 1:
        move_dims<E, SCATTER, 1, false, unsigned int>(src, dst, dims_of<1, false, V>(s), n);
        break;
    case 2:
        move_dims<E, SCATTER, 2, false, unsigned int>(src, dst, dims_of<2, false, V>(s), n);
        break;
    case 3:
        move_dims<E, SCATTER, 3, false, unsigned int>(src, dst, dims_of<3, false, V>(s), n);
        break;
    case 4:
        move_dims<E, SCATTER, 4, false, unsigned int>(src, dst, dims_of<4, false, V>(s), n);
        break;
    default:
        move_dims<E, SCATTER, STRIDED_MAX_DIMS, true, unsigned int>(
            src, dst, dims_of<STRIDED_MAX_DIMS, true, V>(s), n);
        break;
    }
}

// Whether a view of T elements can be moved 16 bytes at a time: the last dimension
// contiguous and a whole number of vectors long, every other stride a whole number of
// vectors, both pointers aligned to 16 bytes. `Strided::moves_in_vectors` is the same
// rule on the host, which sizes the grid by it.
template <typename T>
__device__ __forceinline__ bool moves_in_vectors(const void* a, const void* b,
                                                 const Strided& s) {
    const long long v = 16 / (long long)sizeof(T);
    const int rank = (int)s.rank;
    if (v <= 1 || rank == 0 || rank > STRIDED_MAX_DIMS) return false;
    if ((((unsigned long long)a) | ((unsigned long long)b)) % 16 != 0) return false;
    bool ok = true;
#pragma unroll
    for (int d = 0; d < STRIDED_MAX_DIMS; ++d) {
        if (d + 1 == rank) {
            ok = ok && s.strides[d] == 1 && s.shape[d] % (unsigned long long)v == 0;
        } else if (d + 1 < rank) {
            ok = ok && (s.shape[d] == 1 || s.strides[d] % v == 0);
        }
    }
    return ok;
}

// A copy or scatter of n T elements, in 16-byte vectors when the view allows.
template <typename T, bool SCATTER>
__device__ __forceinline__ void strided_kernel(const T* src, T* dst, const Strided& s,
                                               unsigned long long n) {
    const int v = (int)(16 / sizeof(T));
    if (moves_in_vectors<T>(src, dst, s)) {
        move_ranked<Vec16, SCATTER, (int)(16 / sizeof(T))>((const Vec16*)src, (Vec16*)dst,
                                                             s, n / v);
    } else {
        move_ranked<T, SCATTER, 1>(src, dst, s, n);
    }
}

// The tiled transpose: tiles of STRIDED_TILE x STRIDED_TILE elements over the view's
// dimension `k` (of stride 1, which the host picked) and its last dimension, one tile
// per block of STRIDED_TILE x STRIDED_TILE_ROWS threads at a time, the other dimensions
// a batch (grid z). The strided side is accessed with threadIdx.x along `k`, the
// contiguous side with threadIdx.x along the last dimension: both in whole sectors.
// Any `k` below the last gives the right elements; the stride makes it fast.
#define STRIDED_TILE 32
#define STRIDED_TILE_ROWS 8

template <typename T, bool SCATTER>
__device__ __forceinline__ void tiled_move(const T* src, T* dst, const Strided& s,
                                           unsigned int k,
                                           T (*tile)[STRIDED_TILE + 1]) {
    const int rank = (int)s.rank;
    const int last = rank - 1;
    if (rank < 2 || rank > STRIDED_MAX_DIMS || (int)k >= last) return;
    // The contiguous side's row-major strides, and the two tiled dimensions.
    long long dense[STRIDED_MAX_DIMS];
    unsigned long long size_a = 1, size_b = 1, batches = 1;
    long long stride_a = 0, stride_b = 0, dense_a = 0;
    long long acc = 1;
#pragma unroll
    for (int d = STRIDED_MAX_DIMS - 1; d >= 0; --d) {
        dense[d] = acc;
        if (d < rank) {
            const unsigned long long size = s.shape[d];
            if (d == (int)k) {
                size_a = size;
                stride_a = s.strides[d];
                dense_a = acc;
            } else if (d == last) {
                size_b = size;
                stride_b = s.strides[d];
            } else {
                batches *= size;
            }
            acc *= (long long)size;
        }
    }
    const unsigned long long tiles_a = (size_a + STRIDED_TILE - 1) / STRIDED_TILE;
    const unsigned long long tiles_b = (size_b + STRIDED_TILE - 1) / STRIDED_TILE;
    const unsigned int tx = threadIdx.x, ty = threadIdx.y;
    for (unsigned long long z = blockIdx.z; z < batches; z += gridDim.z) {
        // Where batch z starts, on the strided side and on the contiguous one.
        long long base_s = 0, base_d = 0;
        unsigned long long rest = z;
#pragma unroll
        for (int d = STRIDED_MAX_DIMS - 1; d >= 0; --d) {
            if (d < last && d != (int)k) {
                const unsigned long long size = s.shape[d];
                const unsigned long long index = rest % size;
                rest /= size;
                base_s += (long long)index * s.strides[d];
                base_d += (long long)index * dense[d];
            }
        }
        for (unsigned long long ta = blockIdx.y; ta < tiles_a; ta += gridDim.y) {
            for (unsigned long long tb = blockIdx.x; tb < tiles_b; tb += gridDim.x) {
                const unsigned long long a0 = ta * STRIDED_TILE, b0 = tb * STRIDED_TILE;
                // In: tile[r][tx] holds element (a0 + tx, b0 + r) of a copy (read on
                // the strided side), (a0 + r, b0 + tx) of a scatter (the contiguous).
                for (unsigned int r = ty; r < STRIDED_TILE; r += STRIDED_TILE_ROWS) {
                    if (SCATTER) {
                        const unsigned long long a = a0 + r, b = b0 + tx;
                        if (a < size_a && b < size_b)
                            tile[r][tx] = src[base_d + (long long)a * dense_a + (long long)b];
                    } else {
                        const unsigned long long a = a0 + tx, b = b0 + r;
                        if (a < size_a && b < size_b)
                            tile[r][tx] =
                                src[base_s + (long long)a * stride_a + (long long)b * stride_b];
                    }
                }
                __syncthreads();
                // Out: the transpose of In, written on the other side.
                for (unsigned int r = ty; r < STRIDED_TILE; r += STRIDED_TILE_ROWS) {
                    if (SCATTER) {
                        const unsigned long long a = a0 + tx, b = b0 + r;
                        if (a < size_a && b < size_b)
                            dst[base_s + (long long)a * stride_a + (long long)b * stride_b] =
                                tile[tx][r];
                    } else {
                        const unsigned long long a = a0 + r, b = b0 + tx;
                        if (a < size_a && b < size_b)
                            dst[base_d + (long long)a * dense_a + (long long)b] = tile[tx][r];
                    }
                }
                __syncthreads();
            }
        }
    }
}
// END moves

#define DEFINE_STRIDED_COPY(NAME, T)                                                  \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n) {                           \
        strided_kernel<T, false>(src, dst, layout, n);                                \
    }

// The tiled transpose, launched with blocks of STRIDED_TILE x STRIDED_TILE_ROWS
// threads; `dim` is the view's dimension of stride 1.
#define DEFINE_STRIDED_COPY_TILED(NAME, T)                                            \
    extern "C" __global__ void NAME(const T* src, T* dst, Strided layout,             \
                                    unsigned long long n, unsigned int dim) {         \
        __shared__ T tile[STRIDED_TILE][STRIDED_TILE + 1];                            \
        tiled_move<T, false>(src, dst, layout, dim, tile);                            \
    }

DEFINE_STRIDED_COPY(strided_copy_b1, unsigned char)
DEFINE_STRIDED_COPY(strided_copy_b2, unsigned short)
DEFINE_STRIDED_COPY(strided_copy_b4, unsigned int)
DEFINE_STRIDED_COPY(strided_copy_b8, unsigned long long)
DEFINE_STRIDED_COPY_TILED(strided_copy_tiled_b1, unsigned char)
DEFINE_STRIDED_COPY_TILED(strided_copy_tiled_b2, unsigned short)
DEFINE_STRIDED_COPY_TILED(strided_copy_tiled_b4, unsigned int)
DEFINE_STRIDED_COPY_TILED(strided_copy_tiled_b8, unsigned long long)
