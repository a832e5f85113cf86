// Binary ops on float operands of two different dtypes (float32 with bfloat16, float16
// with float32, ...), each read in its own dtype: PyTorch's TensorIterator does this on
// CUDA ("dynamic casting": the cast is pushed into the kernel's loads), so that
// `x_f32 + y_bf16` needs no cast kernel and no float32 copy of `y`. The result is
// float32, the promoted dtype of any two different float dtypes.
//
// This file is not compiled as it is: labs/core/device/src/kernels/mixed.rs prepends the two
// dtypes' sections of kernels/dtypes.cu, each in a namespace of its name, the namespace
// aliases A and B (the first and the second operand's), and the layout part of
// kernels/strided.cu; it appends one DEFINE_MIXED* line per op of
// labs/core/device/src/kernels/ops.rs, for example `DEFINE_MIXED(add_f32_bf16, (a + b))`.
//
// Each operand is widened to float exactly (as a cast to float32 would), the op's
// expression runs in float, and the float result is stored: the bits of casting first
// and running the float32 kernel, without the cast.

typedef float MATH;

#define MIXED_LOOP(i, n)                                                              \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +         \
                                threadIdx.x;                                          \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// Four elements of T, moved by one load or store (16 bytes of float32, 8 of a half
// type).
template <typename T>
struct alignas(4 * sizeof(T)) Four {
    T e[4];
};

__device__ __forceinline__ bool aligned_to(const void* p, unsigned long long bytes) {
    return ((unsigned long long)p & (bytes - 1)) == 0;
}

// Whether a, b and out can move four elements at a time.
#define FOURS_ALIGNED(a_, b_, out)                                                    \
    (aligned_to(a_, 4 * sizeof(A::ELEM)) && aligned_to(b_, 4 * sizeof(B::ELEM)) &&   \
     aligned_to(out, 16))

#define MIXED_ELEMENT(EXPR, A_VALUE, B_VALUE, OUT)                                    \
    {                                                                                 \
        float a = A::to_math(A_VALUE);                                                \
        float b = B::to_math(B_VALUE);                                                \
        OUT = (EXPR);                                                                 \
    }

// out[i] = EXPR(a[i], b[i]) over n dense elements.
#define DEFINE_MIXED(NAME, EXPR)                                                      \
    extern "C" __global__ void NAME(const A::ELEM* a_, const B::ELEM* b_, float* out, \
                                    float alpha, unsigned long long n) {              \
        unsigned long long done = 0;                                                  \
        if (FOURS_ALIGNED(a_, b_, out)) {                                             \
            const unsigned long long fours = n / 4;                                   \
            MIXED_LOOP(p, fours) {                                                    \
                Four<A::ELEM> va = ((const Four<A::ELEM>*)a_)[p];                     \
                Four<B::ELEM> vb = ((const Four<B::ELEM>*)b_)[p];                     \
                Four<float> vo;                                                       \
                for (int k = 0; k < 4; ++k)                                           \
                    MIXED_ELEMENT(EXPR, va.e[k], vb.e[k], vo.e[k])                    \
                ((Four<float>*)out)[p] = vo;                                          \
            }                                                                         \
            done = fours * 4;                                                         \
        }                                                                             \
        MIXED_LOOP(j, n - done) {                                                     \
            unsigned long long i = done + j;                                          \
            MIXED_ELEMENT(EXPR, a_[i], b_[i], out[i])                                 \
        }                                                                             \
    }

// out[i] = EXPR(a[i], b[i % cols]), or with row_first EXPR(a[i % cols], b[i]): one
// operand dense over the n elements, the other a dense row of `cols` repeated over them
// (as DEFINE_BINARY_ROWS in kernels/elementwise.cu). Four at a time when `cols` is a
// multiple of four (a group never wraps around the row) and the pointers allow.
#define DEFINE_MIXED_ROWS(NAME, EXPR)                                                 \
    extern "C" __global__ void NAME(const A::ELEM* a_, const B::ELEM* b_, float* out, \
                                    float alpha, unsigned long long n,                \
                                    unsigned long long cols, unsigned int row_first) { \
        unsigned long long done = 0;                                                  \
        if (cols % 4 == 0 && FOURS_ALIGNED(a_, b_, out)) {                            \
            const unsigned long long fours = n / 4;                                   \
            const unsigned long long row_fours = cols / 4;                            \
            MIXED_LOOP(p, fours) {                                                    \
                const unsigned long long r = p % row_fours;                           \
                Four<A::ELEM> va = ((const Four<A::ELEM>*)a_)[row_first ? r : p];     \
                Four<B::ELEM> vb = ((const Four<B::ELEM>*)b_)[row_first ? p : r];     \
                Four<float> vo;                                                       \
                for (int k = 0; k < 4; ++k)                                           \
                    MIXED_ELEMENT(EXPR, va.e[k], vb.e[k], vo.e[k])                    \
                ((Four<float>*)out)[p] = vo;                                          \
            }                                                                         \
            done = fours * 4;                                                         \
        }                                                                             \
        MIXED_LOOP(j, n - done) {                                                     \
            unsigned long long i = done + j;                                          \
            unsigned long long c = i % cols;                                          \
            MIXED_ELEMENT(EXPR, a_[row_first ? c : i], b_[row_first ? i : c], out[i]) \
        }                                                                             \
    }

// The same op over operands of any layout (broadcast dimensions have stride 0) into a
// dense float32 output.
#define DEFINE_MIXED_STRIDED(NAME, EXPR)                                              \
    extern "C" __global__ void NAME(const A::ELEM* a_, Strided la, const B::ELEM* b_, \
                                    Strided lb, float* out, float alpha,              \
                                    unsigned long long n) {                           \
        MIXED_LOOP(i, n) {                                                            \
            MIXED_ELEMENT(EXPR, a_[strided_offset(la, i)], b_[strided_offset(lb, i)], \
                          out[i])                                                     \
        }                                                                             \
    }
