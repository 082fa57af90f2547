// RMSNorm (and the fused residual-add variant) over rows of a contiguous float32 [T, D] matrix.
// One thread block per row; blockDim.x must be a multiple of 32 (at most 1024).

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum of v over the whole block; every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int num_warps = (blockDim.x + 31) >> 5;
        float s = lane < num_warps ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

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
    ss = block_sum(ss);
    const float denom = sqrtf(ss * (1.0f / (float)D) + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) outr[i] = xr[i] / denom * weight[i];
}

// new_residual = x + residual; out = rms_norm(new_residual) * weight
extern "C" __global__ void add_rms_norm_f32(const float* __restrict__ x, const float* __restrict__ residual,
                                            const float* __restrict__ weight, float* __restrict__ out,
                                            float* __restrict__ new_residual, int D, float eps) {
    const long long row = blockIdx.x;
    const float* xr = x + row * D;
    const float* rr = residual + row * D;
    float* nr = new_residual + row * D;
    float* outr = out + row * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = xr[i] + rr[i];
        nr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    const float denom = sqrtf(ss * (1.0f / (float)D) + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) outr[i] = nr[i] / denom * weight[i];
}
