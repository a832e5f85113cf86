// The templates of the elementwise op families. This file is not compiled as it is:
// labs/core/device/src/kernels/source.rs prepends the element type's helpers (ELEM, MATH,
// to_math, from_math) and the layout part of kernels/strided.cu, and appends one
// DEFINE_* line per op of labs/core/device/src/kernels/ops.rs, for example
// `DEFINE_BINARY(add_f32, a + b)`, then NVRTC compiles the result.
//
// Every kernel is a grid-stride loop, so any grid size covers any n; n is 64-bit
// because tensors past 2^31 elements are real on an 80 GB card. Each element is
// widened to its math type (float for the float types), the op's expression runs in
// it, and the result is narrowed back to the element type.

#define GRID_STRIDE_LOOP(i, n)                                                        \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +         \
                                threadIdx.x;                                          \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// Elements per 16-byte vector: the dense kernels move 16 bytes per load and store
// (one 128-bit instruction) when every pointer is 16-byte aligned, which a tensor
// fresh from the caching allocator always is.
#define PACK (16 / sizeof(ELEM))
struct alignas(16) Pack {
    ELEM e[PACK];
};

__device__ __forceinline__ bool aligned16(const void* p) {
    return ((unsigned long long)p & 15ull) == 0;
}

// base^exp for an integer math type, by squaring, wrapping as the type does. A negative
// exponent gives what PyTorch's integer pow gives: 1 for base 1, +-1 for base -1, else 0.
template <typename T>
__device__ __forceinline__ T int_pow(T base, T exp) {
    if (exp < 0) {
        if (base == 1) return 1;
        if (base == -1) return (exp & 1) ? -1 : 1;
        return 0;
    }
    T result = 1;
    while (exp != 0) {
        if (exp & 1) result *= base;
        exp >>= 1;
        base *= base;
    }
    return result;
}

// ANCHOR: unary_template
// out[i] = EXPR(x[i]); `out` may be `in` (in place). Whole 16-byte vectors first when
// the pointers allow, then the tail (or everything) one element at a time.
#define DEFINE_UNARY(NAME, EXPR)                                                      \
    extern "C" __global__ void NAME(const ELEM* in, ELEM* out, float alpha,           \
                                    unsigned long long n) {                           \
        unsigned long long done = 0;                                                  \
        if (aligned16(in) && aligned16(out)) {                                        \
            const unsigned long long packs = n / PACK;                                \
            GRID_STRIDE_LOOP(p, packs) {                                              \
                Pack v = ((const Pack*)in)[p];                                        \
                for (int k = 0; k < (int)PACK; ++k) {                                 \
                    MATH x = to_math(v.e[k]);                                         \
                    v.e[k] = from_math(EXPR);                                         \
                }                                                                     \
                ((Pack*)out)[p] = v;                                                  \
            }                                                                         \
            done = packs * PACK;                                                      \
        }                                                                             \
        GRID_STRIDE_LOOP(j, n - done) {                                               \
            unsigned long long i = done + j;                                          \
            MATH x = to_math(in[i]);                                                  \
            out[i] = from_math(EXPR);                                                 \
        }                                                                             \
    }
// ANCHOR_END: unary_template

// ANCHOR: binary_template
// out[i] = EXPR(a[i], b[i]); `out` may be either input (in place).
#define BINARY_ELEMENT(EXPR, A, B, OUT)                                               \
    {                                                                                 \
        MATH a = to_math(A);                                                          \
        MATH b = to_math(B);                                                          \
        OUT = from_math(EXPR);                                                        \
    }

#define DEFINE_BINARY(NAME, EXPR)                                                     \
    extern "C" __global__ void NAME(const ELEM* a_, const ELEM* b_, ELEM* out,        \
                                    float alpha, unsigned long long n) {              \
        unsigned long long done = 0;                                                  \
        if (aligned16(a_) && aligned16(b_) && aligned16(out)) {                       \
            const unsigned long long packs = n / PACK;                                \
            GRID_STRIDE_LOOP(p, packs) {                                              \
                Pack va = ((const Pack*)a_)[p];                                       \
                Pack vb = ((const Pack*)b_)[p];                                       \
                for (int k = 0; k < (int)PACK; ++k)                                   \
                    BINARY_ELEMENT(EXPR, va.e[k], vb.e[k], va.e[k])                   \
                ((Pack*)out)[p] = va;                                                 \
            }                                                                         \
            done = packs * PACK;                                                      \
        }                                                                             \
        GRID_STRIDE_LOOP(j, n - done) {                                               \
            unsigned long long i = done + j;                                          \
            BINARY_ELEMENT(EXPR, a_[i], b_[i], out[i])                                \
        }                                                                             \
    }
// ANCHOR_END: binary_template

// out[i] = EXPR(a[i], b[i % cols]), or with row_first EXPR(a[i % cols], b[i]): one
// operand dense over all n elements, the other a dense row of `cols` broadcast over it
// (a linear layer's bias). The same expression as the strided kernel, so the same bits,
// without its per-dimension index arithmetic: whole 16-byte vectors when `cols` is a
// multiple of one and every pointer is aligned (a vector of the row never wraps), else
// one element at a time with one modulo. `out` may be the dense operand (in place).
#define DEFINE_BINARY_ROWS(NAME, EXPR)                                                \
    extern "C" __global__ void NAME(const ELEM* a_, const ELEM* b_, ELEM* out,        \
                                    float alpha, unsigned long long n,                \
                                    unsigned long long cols, unsigned int row_first) { \
        const ELEM* full_ = row_first ? b_ : a_;                                      \
        const ELEM* row_ = row_first ? a_ : b_;                                       \
        unsigned long long done = 0;                                                  \
        if (cols % PACK == 0 && aligned16(full_) && aligned16(row_) && aligned16(out)) { \
            const unsigned long long packs = n / PACK;                                \
            const unsigned long long row_packs = cols / PACK;                         \
            GRID_STRIDE_LOOP(p, packs) {                                              \
                Pack vf = ((const Pack*)full_)[p];                                    \
                Pack vr = ((const Pack*)row_)[p % row_packs];                         \
                for (int k = 0; k < (int)PACK; ++k) {                                 \
                    if (row_first)                                                    \
                        BINARY_ELEMENT(EXPR, vr.e[k], vf.e[k], vf.e[k])               \
                    else                                                              \
                        BINARY_ELEMENT(EXPR, vf.e[k], vr.e[k], vf.e[k])               \
                }                                                                     \
                ((Pack*)out)[p] = vf;                                                 \
            }                                                                         \
            done = packs * PACK;                                                      \
        }                                                                             \
        GRID_STRIDE_LOOP(j, n - done) {                                               \
            unsigned long long i = done + j;                                          \
            unsigned long long c = i % cols;                                          \
            if (row_first)                                                            \
                BINARY_ELEMENT(EXPR, row_[c], full_[i], out[i])                       \
            else                                                                      \
                BINARY_ELEMENT(EXPR, full_[i], row_[c], out[i])                       \
        }                                                                             \
    }

// The same op over operands of any layout (broadcast dimensions have stride 0) into a
// dense output: element i of the output reads each input at its row-major index i.
#define DEFINE_BINARY_STRIDED(NAME, EXPR)                                             \
    extern "C" __global__ void NAME(const ELEM* a_, Strided la, const ELEM* b_,       \
                                    Strided lb, ELEM* out, float alpha,               \
                                    unsigned long long n) {                           \
        GRID_STRIDE_LOOP(i, n) {                                                      \
            BINARY_ELEMENT(EXPR, a_[strided_offset(la, i)], b_[strided_offset(lb, i)], \
                           out[i])                                                    \
        }                                                                             \
    }

// out[i] = 1 if EXPR(a, b) holds, else 0: a uint8 mask (PyTorch's bool), strided
// operands as above.
#define DEFINE_COMPARE(NAME, EXPR)                                                    \
    extern "C" __global__ void NAME(const ELEM* a_, Strided la, const ELEM* b_,       \
                                    Strided lb, unsigned char* out,                   \
                                    unsigned long long n) {                           \
        GRID_STRIDE_LOOP(i, n) {                                                      \
            MATH a = to_math(a_[strided_offset(la, i)]);                              \
            MATH b = to_math(b_[strided_offset(lb, i)]);                              \
            out[i] = (EXPR) ? 1 : 0;                                                  \
        }                                                                             \
    }

// out[i] = cond[i] ? a[i] : b[i] (PyTorch's where), every operand strided.
#define DEFINE_WHERE(NAME)                                                            \
    extern "C" __global__ void NAME(const unsigned char* c_, Strided lc,              \
                                    const ELEM* a_, Strided la, const ELEM* b_,       \
                                    Strided lb, ELEM* out, unsigned long long n) {    \
        GRID_STRIDE_LOOP(i, n) {                                                      \
            out[i] = c_[strided_offset(lc, i)] ? a_[strided_offset(la, i)]            \
                                               : b_[strided_offset(lb, i)];           \
        }                                                                             \
    }
