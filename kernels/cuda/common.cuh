// Helpers shared by the kernels in this directory (each .cu file is its own NVRTC program).
#pragma once
#include <cuda_fp16.h>

#define FORGE_FULL_MASK 0xffffffffu
// NVRTC has no INFINITY macro; a finite "minus infinity" keeps exp(x - max) free of inf - inf.
#define FORGE_NEG_BIG (-3.402823466e+38f)

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FORGE_FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FORGE_FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
