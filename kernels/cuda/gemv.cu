// Products of a few activation rows with a quantized weight, read once from memory and dequantized in registers:
// out [T, N] float32 = x [T, K] float32 (contiguous) times the weight's rows, out[t, n] = sum_k x[t, k] * w[n, k],
// with w = scale * q + min per group (layouts as in dequant.cu; a q4 weight without mins has min = -zero * scale,
// exact for zero = 8). Sums in float32; per group the lane adds scale * sum(x * q) + min * sum(x). Scales and
// mins are float32 (`gemv_q4`, `gemv_q8`) or float16 as in the file (`_hs`: the device reads the file's bytes).
//
// Two forms. `gemv_tiled_*` (the route the backend takes) stages x in shared memory: every GEMV_SPANS spans of K
// (a span: the 16 weight bytes one lane loads, 32 values of q4 or 16 of q8) the block copies those columns of
// its activation rows there once, coalesced, and each value a lane reads serves GEMV_TILE_ROWS weight rows; the
// weights of a round are loaded during the round before, so their trip to memory overlaps the staging. The
// plain `gemv_*` form reads x straight from global memory for every weight row: each of its float4 loads touches
// 32 lines (a lane's span is 64 or 128 bytes past its neighbour's), which bounds it by L1 wavefronts, not by the
// weight bytes; it stays as the route the start-up gate falls back to.
//
// Plain block: GEMV_WARPS warps, warp w takes weight row blockIdx.y * GEMV_WARPS + w; its lanes split the row's
// groups (q4: 32 values, q8: 16-value chunks) and sum across the warp at the end. Activation rows blockIdx.x *
// GEMV_ROWS onwards (GEMV_ROWS of them or what is left) share the weight bytes each lane loads; the blocks of one
// weight row group are neighbours in the grid, so that after the first their weight reads can hit L2.
// K must be a multiple of 32 (q4) or 16 (q8, whose group is 16 or 32).
#include "common.cuh"

#define GEMV_WARPS 4
#define GEMV_ROWS 8
// The tiled form: weight rows per warp, and spans of K staged per round (one per lane).
#define GEMV_TILE_ROWS 2
#define GEMV_SPANS 32

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

// ---- the tiled form ---------------------------------------------------------------------------------------------
// In shared memory a lane's V values sit V + 4 floats past its neighbour's, so the 8 lanes of a quarter warp read
// their 16-byte vectors from distinct banks; an activation row takes GEMV_SPANS * (V + 4) floats.
template <int V> struct Stage {
    static constexpr int VALUES = GEMV_SPANS * V;    // x values per activation row per round
    static constexpr int STRIDE = V + 4;             // floats between two lanes' values
    static constexpr int ROW = GEMV_SPANS * STRIDE;  // floats of one activation row
};

// x's columns k0 .. k0 + Stage<V>::VALUES - 1 of `rows` rows (row stride K, 16-byte aligned) into xs; columns past
// K read as 0. Every thread's float4 loads are independent and unrolled, so a round waits for one trip to memory,
// not one per load. Needs blockDim.x == 32 * GEMV_WARPS.
template <int V>
__device__ __forceinline__ void stage_x(float* xs, const float* x, int rows, int K, int k0) {
    constexpr int PER_THREAD = Stage<V>::VALUES / 4 / (32 * GEMV_WARPS);
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        if (r < rows) {
#pragma unroll
            for (int c = 0; c < PER_THREAD; ++c) {
                const int j = 4 * (threadIdx.x + c * 32 * GEMV_WARPS);  // a float4 never straddles two lanes' values
                float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                if (k0 + j < K) v = *reinterpret_cast<const float4*>(x + (long long)r * K + k0 + j);
                *reinterpret_cast<float4*>(xs + r * Stage<V>::ROW + (j / V) * Stage<V>::STRIDE + j % V) = v;
            }
        }
    }
}

// The 16 weight bytes of span s of rows n0 .. n0 + GEMV_TILE_ROWS - 1, with their scales and mins (zeros past N).
template <typename S, bool Q4>
__device__ __forceinline__ void load_spans(uint4 (&p)[GEMV_TILE_ROWS], float (&sc)[GEMV_TILE_ROWS],
                                           float (&mn)[GEMV_TILE_ROWS], const unsigned char* __restrict__ data,
                                           const S* __restrict__ scale, const S* __restrict__ mins, int n0, int N,
                                           long long row_bytes, int groups, int s, int last) {
#pragma unroll
    for (int w = 0; w < GEMV_TILE_ROWS; ++w) {
        const int n = n0 + w;
        p[w] = uint4{0u, 0u, 0u, 0u};
        sc[w] = mn[w] = 0.0f;
        if (n < N) {
            p[w] = reinterpret_cast<const uint4*>(data + (long long)n * row_bytes)[s];
            const long long g = (long long)n * groups + (Q4 ? s : s * 16 / last);
            sc[w] = to_float(scale[g]);
            mn[w] = mins ? to_float(mins[g]) : (Q4 ? -(float)last * sc[w] : 0.0f);
        }
    }
}

// Value j of a 16-byte span: q4 as GGUF packs a block (byte i: value i in the low nibble, i + 16 in the high),
// q8 one signed byte each.
template <bool Q4>
__device__ __forceinline__ float span_value(const uint4& p, int j) {
    if (Q4) return (float)(j < 16 ? (byte_of(p, j) & 15u) : (byte_of(p, j - 16) >> 4));
    return (float)(signed char)byte_of(p, j);
}

// `last`: q4 the zero (used without mins), q8 the group size.
template <typename S, bool Q4>
__device__ __forceinline__ void gemv_tiled(float* __restrict__ out, const float* __restrict__ x,
                                           const unsigned char* __restrict__ data, const S* __restrict__ scale,
                                           const S* __restrict__ mins, int T, int N, int K, int last) {
    constexpr int V = Q4 ? 32 : 16;
    __shared__ float4 staged[GEMV_ROWS * Stage<V>::ROW / 4];
    float* xs = reinterpret_cast<float*>(staged);
    const int lane = threadIdx.x & 31;
    const int n0 = (blockIdx.y * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_TILE_ROWS;
    const int t0 = blockIdx.x * GEMV_ROWS, rows = min(GEMV_ROWS, T - t0);
    const int spans = K / V, groups = Q4 ? K / 32 : K / last;
    const long long row_bytes = Q4 ? K / 2 : K;
    float acc[GEMV_TILE_ROWS][GEMV_ROWS] = {};
    // This round's weights were loaded during the last one: their trip to memory overlaps the staging of x.
    uint4 p[GEMV_TILE_ROWS], next_p[GEMV_TILE_ROWS] = {};
    float sc[GEMV_TILE_ROWS], mn[GEMV_TILE_ROWS], next_sc[GEMV_TILE_ROWS] = {}, next_mn[GEMV_TILE_ROWS] = {};
    if (lane < spans)
        load_spans<S, Q4>(next_p, next_sc, next_mn, data, scale, mins, n0, N, row_bytes, groups, lane, last);
    for (int s0 = 0; s0 < spans; s0 += GEMV_SPANS) {
        const int s = s0 + lane;
#pragma unroll
        for (int w = 0; w < GEMV_TILE_ROWS; ++w) p[w] = next_p[w], sc[w] = next_sc[w], mn[w] = next_mn[w];
        __syncthreads();  // every warp is done with the last round's values
        stage_x<V>(xs, x + (long long)t0 * K, rows, K, s0 * V);
        if (s + GEMV_SPANS < spans) {
            const int ahead = s + GEMV_SPANS;
            load_spans<S, Q4>(next_p, next_sc, next_mn, data, scale, mins, n0, N, row_bytes, groups, ahead, last);
        }
        __syncthreads();
        if (s >= spans) continue;  // the tail round: lanes past K still reach the next barrier
        float dot[GEMV_TILE_ROWS][GEMV_ROWS] = {}, sum[GEMV_ROWS] = {};
#pragma unroll
        for (int i = 0; i < V / 4; ++i) {
            float q[GEMV_TILE_ROWS][4];
#pragma unroll
            for (int w = 0; w < GEMV_TILE_ROWS; ++w)
#pragma unroll
                for (int c = 0; c < 4; ++c) q[w][c] = span_value<Q4>(p[w], 4 * i + c);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) {
                if (r < rows) {
                    const float* xr = xs + r * Stage<V>::ROW + lane * Stage<V>::STRIDE;
                    const float4 v = reinterpret_cast<const float4*>(xr)[i];
                    sum[r] += (v.x + v.y) + (v.z + v.w);
#pragma unroll
                    for (int w = 0; w < GEMV_TILE_ROWS; ++w)
                        dot[w][r] += v.x * q[w][0] + v.y * q[w][1] + v.z * q[w][2] + v.w * q[w][3];
                }
            }
        }
#pragma unroll
        for (int w = 0; w < GEMV_TILE_ROWS; ++w)
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) acc[w][r] += sc[w] * dot[w][r] + mn[w] * sum[r];
    }
#pragma unroll
    for (int w = 0; w < GEMV_TILE_ROWS; ++w) {
        if (n0 + w < N) write_rows(out + (long long)t0 * N, acc[w], N, n0 + w, rows);  // n0 + w: the same for a warp
    }
}

extern "C" __global__ void gemv_tiled_q4(float* __restrict__ out, const float* __restrict__ x,
                                         const unsigned char* __restrict__ data, const float* __restrict__ scale,
                                         const float* __restrict__ mins, int T, int N, int K, int zero) {
    gemv_tiled<float, true>(out, x, data, scale, mins, T, N, K, zero);
}

extern "C" __global__ void gemv_tiled_q4_hs(float* __restrict__ out, const float* __restrict__ x,
                                            const unsigned char* __restrict__ data, const __half* __restrict__ scale,
                                            const __half* __restrict__ mins, int T, int N, int K, int zero) {
    gemv_tiled<__half, true>(out, x, data, scale, mins, T, N, K, zero);
}

extern "C" __global__ void gemv_tiled_q8(float* __restrict__ out, const float* __restrict__ x,
                                         const signed char* __restrict__ data, const float* __restrict__ scale,
                                         const float* __restrict__ mins, int T, int N, int K, int group) {
    gemv_tiled<float, false>(out, x, reinterpret_cast<const unsigned char*>(data), scale, mins, T, N, K, group);
}

extern "C" __global__ void gemv_tiled_q8_hs(float* __restrict__ out, const float* __restrict__ x,
                                            const signed char* __restrict__ data, const __half* __restrict__ scale,
                                            const __half* __restrict__ mins, int T, int N, int K, int group) {
    gemv_tiled<__half, false>(out, x, reinterpret_cast<const unsigned char*>(data), scale, mins, T, N, K, group);
}
