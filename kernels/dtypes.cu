// How each element type is widened to float and rounded back, without cuda_fp16.h
// (NVRTC would need the toolkit's include path for it). source.rs keeps the section
// of the element type a module is generated for, between its BEGIN and END markers.

// BEGIN f32
typedef float ELEM;
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float from_float(float v) { return v; }
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
// END bf16
