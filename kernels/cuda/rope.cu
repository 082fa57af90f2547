// Rotary embedding, rotate-half (NeoX / Hugging Face) convention: dims j and j + Dh/2 of every head turn by
// angle position * inv_freq[j]. cos/sin tables are float32 [T, Dh/2], computed once a step.
#include "common.cuh"

// cos_t, sin_t [T, half] at angle (float)positions[t] * inv_freq[j] (the Llama-3 / linear scaling is in inv_freq).
extern "C" __global__ void rope_cos_sin_f32(float* __restrict__ cos_t, float* __restrict__ sin_t,
                                            const long long* __restrict__ positions, const float* __restrict__ inv_freq,
                                            int T, int half) {
    const long long n = (long long)T * half;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / half;
        const int j = (int)(i - t * half);
        const float angle = __fmul_rn((float)positions[t], inv_freq[j]);
        float s, c;
        sincosf(angle, &s, &c);
        cos_t[i] = c;
        sin_t[i] = s;
    }
}

// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
__device__ __forceinline__ float2 rotate(float x1, float x2, float c, float s) {
    return make_float2(x1 * c - x2 * s, x2 * c + x1 * s);
}

// In place on float32 x [T, H, Dh], which may be a strided view (strides in elements, last dim contiguous).
// One thread block per token.
extern "C" __global__ void rope_neox_f32(float* __restrict__ x, const float* __restrict__ cos_t,
                                         const float* __restrict__ sin_t, int H, int half,
                                         long long stride_t, long long stride_h) {
    const long long t = blockIdx.x;
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int i = threadIdx.x; i < H * half; i += blockDim.x) {
        const int h = i / half, j = i - h * half;
        float* p = x + t * stride_t + h * stride_h;
        const float2 r = rotate(p[j], p[j + half], c[j], s[j]);
        p[j] = r.x;
        p[j + half] = r.y;
    }
}

// One row of qkv [T, (H + 2 Hkv) Dh] (row stride in elements) per thread block: the H query heads are rotated in
// place (float32); the Hkv key heads, rotated, and the Hkv value heads go to the float16 caches
// [num_blocks, block_size, Hkv, Dh] at flat slot slot_mapping[t] (skipped outside [0, num_slots)).
extern "C" __global__ void rope_write_kv_f16(float* __restrict__ qkv, const float* __restrict__ cos_t,
                                             const float* __restrict__ sin_t, __half* __restrict__ k_cache,
                                             __half* __restrict__ v_cache, const long long* __restrict__ slot_mapping,
                                             long long num_slots, int H, int Hkv, int Dh, long long stride_t) {
    const long long t = blockIdx.x;
    const int half = Dh / 2;
    float* row = qkv + t * stride_t;
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    const long long slot = slot_mapping[t];
    const bool write = slot >= 0 && slot < num_slots;
    const long long kv_row = slot * Hkv * Dh;
    for (int i = threadIdx.x; i < (H + Hkv) * half; i += blockDim.x) {
        const int h = i / half, j = i - h * half;
        float* p = row + h * Dh;
        const float2 r = rotate(p[j], p[j + half], c[j], s[j]);
        if (h < H) {
            p[j] = r.x;
            p[j + half] = r.y;
        } else if (write) {
            __half* k = k_cache + kv_row + (h - H) * Dh;
            store(k + j, r.x);
            store(k + j + half, r.y);
        }
    }
    if (!write) return;
    const float* v = row + (H + Hkv) * Dh;
    for (int i = threadIdx.x; i < Hkv * Dh; i += blockDim.x) store(v_cache + kv_row + i, v[i]);
}
