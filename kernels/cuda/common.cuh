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

// A weight's group scales and mins are float32, or float16 as the file stores them (GGUF Q4_0, Q4_1, Q8_0).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

template <typename T> struct Add { __device__ T operator()(T a, T b) const { return a + b; } };
template <typename T> struct Max { __device__ T operator()(T a, T b) const { return a < b ? b : a; } };
template <typename T> struct Min { __device__ T operator()(T a, T b) const { return b < a ? b : a; } };

// op over v of every thread of the block (blockDim.x a multiple of 32); every thread gets the result.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
    __shared__ T partial[32];
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(FORGE_FULL_MASK, v, offset));
    __syncthreads();  // the previous call's readers are done with `partial`
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = partial[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) v = op(v, partial[w]);
    return v;
}
