// Products of a few activation rows with a quantized weight, read once from memory and dequantized in registers:
// out [T, N] float32 = x [T, K] float32 (contiguous) times the weight's rows, out[t, n] = sum_k x[t, k] * w[n, k],
// with w = scale * q + min per group (layouts as in dequant.cu; a q4 weight without mins has min = -zero * scale,
// exact for zero = 8). Sums in float32; per group the lane adds scale * sum(x * q) + min * sum(x). Scales and
// mins are float32 (`gemv_q4`, `gemv_q8`) or float16 as in the file (`_hs`: the device reads the file's bytes).
//
// x is re-read from memory (L1/L2) for every weight row a warp takes; whether staging it in shared memory pays
// for batched decode is a question for a measurement on the device.
//
// Block: GEMV_WARPS warps, warp w takes weight row blockIdx.y * GEMV_WARPS + w; its lanes split the row's groups
// (q4: 32 values, q8: 16-value chunks) and sum across the warp at the end. Activation rows blockIdx.x * GEMV_ROWS
// onwards (GEMV_ROWS of them or what is left) share the weight bytes each lane loads; the blocks of one weight
// row group are neighbours in the grid, so that after the first their weight reads can hit L2.
// K must be a multiple of 32 (q4) or 16 (q8, whose group is 16 or 32).
#include "common.cuh"

#define GEMV_WARPS 4
#define GEMV_ROWS 8

// The 16 bytes of p as unsigned values.
__device__ __forceinline__ unsigned int byte_of(const uint4& p, int i) {
    const unsigned int w = i < 4 ? p.x : i < 8 ? p.y : i < 12 ? p.z : p.w;
    return (w >> (8 * (i & 3))) & 0xFFu;
}

// acc[r] += s * sum_i x_r[i] q[i] + m * sum_i x_r[i] over the N_VALUES values of one group / chunk, for the rows r < rows.
template <int N_VALUES>
__device__ __forceinline__ void accumulate(float (&acc)[GEMV_ROWS], const float (&q)[N_VALUES], float s, float m,
                                           const float* x, long long K, int rows) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        if (r < rows) {
            const float4* xv = reinterpret_cast<const float4*>(x + r * K);
            float dot = 0.0f, sum = 0.0f;
#pragma unroll
            for (int i = 0; i < N_VALUES / 4; ++i) {
                const float4 v = xv[i];
                dot += v.x * q[4 * i] + v.y * q[4 * i + 1] + v.z * q[4 * i + 2] + v.w * q[4 * i + 3];
                sum += (v.x + v.y) + (v.z + v.w);
            }
            acc[r] += s * dot + m * sum;
        }
    }
}

__device__ __forceinline__ void write_rows(float* out, const float (&acc)[GEMV_ROWS], int N, int n, int rows) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        if (r < rows) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) out[(long long)r * N + n] = v;
        }
    }
}

template <typename S>
__device__ __forceinline__ void gemv_q4(float* __restrict__ out, const float* __restrict__ x,
                                        const unsigned char* __restrict__ data, const S* __restrict__ scale,
                                        const S* __restrict__ mins, int T, int N, int K, int zero) {
    const int n = blockIdx.y * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int t0 = blockIdx.x * GEMV_ROWS, rows = min(GEMV_ROWS, T - t0);
    if (n >= N) return;  // whole warps only; no block-wide barrier below
    const int groups = K / 32;
    const uint4* w = reinterpret_cast<const uint4*>(data + (long long)n * (K / 2));
    const S* sc = scale + (long long)n * groups;
    const S* mn = mins ? mins + (long long)n * groups : nullptr;
    const float* xt = x + (long long)t0 * K;
    float acc[GEMV_ROWS] = {};
    for (int g = lane; g < groups; g += 32) {
        const uint4 p = w[g];
        float q[32];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const unsigned int b = byte_of(p, i);
            q[i] = (float)(b & 15u);
            q[i + 16] = (float)(b >> 4);
        }
        const float s = to_float(sc[g]);
        accumulate<32>(acc, q, s, mn ? to_float(mn[g]) : -(float)zero * s, xt + g * 32, K, rows);
    }
    write_rows(out + (long long)t0 * N, acc, N, n, rows);
}

// mins may be null (no offset).
template <typename S>
__device__ __forceinline__ void gemv_q8(float* __restrict__ out, const float* __restrict__ x,
                                        const signed char* __restrict__ data, const S* __restrict__ scale,
                                        const S* __restrict__ mins, int T, int N, int K, int group) {
    const int n = blockIdx.y * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int t0 = blockIdx.x * GEMV_ROWS, rows = min(GEMV_ROWS, T - t0);
    if (n >= N) return;  // whole warps only; no block-wide barrier below
    const int groups = K / group;
    const uint4* w = reinterpret_cast<const uint4*>(data + (long long)n * K);
    const S* sc = scale + (long long)n * groups;
    const S* mn = mins ? mins + (long long)n * groups : nullptr;
    const float* xt = x + (long long)t0 * K;
    float acc[GEMV_ROWS] = {};
    for (int c = lane; c < K / 16; c += 32) {
        const uint4 p = w[c];
        float q[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = (float)(signed char)byte_of(p, i);
        const int g = c * 16 / group;
        accumulate<16>(acc, q, to_float(sc[g]), mn ? to_float(mn[g]) : 0.0f, xt + c * 16, K, rows);
    }
    write_rows(out + (long long)t0 * N, acc, N, n, rows);
}

// mins may be null: a q4 weight then has min = -zero * scale (zero = 8: Q4_0's d * (q - 8)).
extern "C" __global__ void gemv_q4(float* __restrict__ out, const float* __restrict__ x,
                                   const unsigned char* __restrict__ data, const float* __restrict__ scale,
                                   const float* __restrict__ mins, int T, int N, int K, int zero) {
    gemv_q4<float>(out, x, data, scale, mins, T, N, K, zero);
}

extern "C" __global__ void gemv_q4_hs(float* __restrict__ out, const float* __restrict__ x,
                                      const unsigned char* __restrict__ data, const __half* __restrict__ scale,
                                      const __half* __restrict__ mins, int T, int N, int K, int zero) {
    gemv_q4<__half>(out, x, data, scale, mins, T, N, K, zero);
}

extern "C" __global__ void gemv_q8(float* __restrict__ out, const float* __restrict__ x,
                                   const signed char* __restrict__ data, const float* __restrict__ scale,
                                   const float* __restrict__ mins, int T, int N, int K, int group) {
    gemv_q8<float>(out, x, data, scale, mins, T, N, K, group);
}

extern "C" __global__ void gemv_q8_hs(float* __restrict__ out, const float* __restrict__ x,
                                      const signed char* __restrict__ data, const __half* __restrict__ scale,
                                      const __half* __restrict__ mins, int T, int N, int K, int group) {
    gemv_q8<__half>(out, x, data, scale, mins, T, N, K, group);
}
