// RMSNorm (and the fused residual-add variant) over rows of a contiguous float32 [T, D] matrix.
// One thread block per row; blockDim.x must be a multiple of 32 (at most 1024).
#include "common.cuh"

// out = x / sqrt(mean(x^2) + eps) * weight
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ weight,
                                        float* __restrict__ out, int D, float eps) {
    const long long row = blockIdx.x;
    const float* xr = x + row * D;
    float* outr = out + row * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = block_reduce(ss, Add<float>());
    const float denom = sqrtf(ss * (1.0f / (float)D) + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) outr[i] = xr[i] / denom * weight[i];
}

// residual += x (in place); out = rms_norm(residual) * weight
extern "C" __global__ void add_rms_norm_f32(const float* __restrict__ x, float* __restrict__ residual,
                                            const float* __restrict__ weight, float* __restrict__ out, int D, float eps) {
    const long long row = blockIdx.x;
    const float* xr = x + row * D;
    float* rr = residual + row * D;
    float* outr = out + row * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = xr[i] + rr[i];
        rr[i] = v;
        ss += v * v;
    }
    ss = block_reduce(ss, Add<float>());
    const float denom = sqrtf(ss * (1.0f / (float)D) + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) outr[i] = rr[i] / denom * weight[i];
}
