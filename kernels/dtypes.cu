// How each element type is widened to its math type and narrowed back, without
// cuda_fp16.h (NVRTC would need the toolkit's include path for it). source.rs keeps
// the section of the element type a module is generated for, between its BEGIN and END
// markers (the cast module keeps every section, each in a namespace of its name).
//
// Each section defines ELEM (the stored type), MATH (the type ops compute in: float
// for the float types, as PyTorch's "opmath" does for half types; the integer itself,
// or int for uint8, for the integer types) and to_math/from_math. Integer arithmetic
// wraps, as it does on the GPU and in PyTorch.

// BEGIN f32
typedef float ELEM;
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float from_float(float v) { return v; }
typedef float MATH;
__device__ __forceinline__ MATH to_math(ELEM v) { return to_float(v); }
__device__ __forceinline__ ELEM from_math(MATH v) { return from_float(v); }
// END f32

// BEGIN f16
// IEEE half, converted by the hardware's cvt instructions (round to nearest even).
typedef unsigned short ELEM;
__device__ __forceinline__ float to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short from_float(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
typedef float MATH;
__device__ __forceinline__ MATH to_math(ELEM v) { return to_float(v); }
__device__ __forceinline__ ELEM from_math(MATH v) { return from_float(v); }
// END f16

// BEGIN bf16
// bfloat16 is the top half of a float: widening is a shift; narrowing rounds to
// nearest even by hand (the cvt instruction for it needs sm_80) and keeps NaNs NaN.
typedef unsigned short ELEM;
__device__ __forceinline__ float to_float(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short from_float(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
typedef float MATH;
__device__ __forceinline__ MATH to_math(ELEM v) { return to_float(v); }
__device__ __forceinline__ ELEM from_math(MATH v) { return from_float(v); }
// END bf16

// BEGIN i32
typedef int ELEM;
typedef int MATH;
__device__ __forceinline__ MATH to_math(ELEM v) { return v; }
__device__ __forceinline__ ELEM from_math(MATH v) { return v; }
// END i32

// BEGIN i64
typedef long long ELEM;
typedef long long MATH;
__device__ __forceinline__ MATH to_math(ELEM v) { return v; }
__device__ __forceinline__ ELEM from_math(MATH v) { return v; }
// END i64

// BEGIN u8
// uint8 (and PyTorch's bool, which the labs store as uint8 0/1) computes in int, as C
// promotes it; narrowing keeps the low 8 bits (255 + 1 wraps to 0).
typedef unsigned char ELEM;
typedef int MATH;
__device__ __forceinline__ MATH to_math(ELEM v) { return (int)v; }
__device__ __forceinline__ ELEM from_math(MATH v) { return (unsigned char)v; }
// END u8
