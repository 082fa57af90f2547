// Rows of a quantized weight (kernels/weight.py layouts) -> float32 or float16 out [R, K]:
// out[i, k] = scale * q + min of weight row ids[i], or of row row0 + i when ids is null (a panel of consecutive rows).
// Rows outside [0, N) come out as zeros. scale * q and the + min round separately (no FMA contraction), and a q4
// weight without mins is scale * (q - zero), as Weight.dequantize computes them, so float32 rows are bit-equal to
// it. Grid-stride loops.
//
// q4: data uint8 [N, K/2]; in each group of 32 values (16 bytes), byte j holds value j in its low nibble and value
//     j + 16 in its high one; scale/min [N, K/32], or no mins and a zero point (Q4_0: 8).
// q8: data int8 [N, K]; scale (and min, or null) [N, K/group].
// Scales and mins are float32, or float16 as the file stores them (the `_hs` kernels: GGUF Q4_0, Q4_1, Q8_0).
#include "common.cuh"

template <typename T, typename S>
__device__ void q4_rows(T* __restrict__ out, const unsigned char* __restrict__ data, const S* __restrict__ scale,
                        const S* __restrict__ mins, const long long* __restrict__ ids, long long row0, long long N,
                        int R, int K, int zero) {
    const int bytes = K / 2, groups = K / 32;
    const long long n = (long long)R * bytes;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < n; b += (long long)gridDim.x * blockDim.x) {
        const long long i = b / bytes;
        const int c = (int)(b - i * bytes), g = c >> 4, j = c & 15;
        const long long row = ids ? ids[i] : row0 + i;
        T* o = out + i * K + g * 32 + j;
        if (row < 0 || row >= N) {
            store(o, 0.0f);
            store(o + 16, 0.0f);
            continue;
        }
        const int q = data[row * bytes + c];
        const float s = to_float(scale[row * groups + g]);
        if (mins) {
            const float m = to_float(mins[row * groups + g]);
            store(o, __fadd_rn(__fmul_rn(s, (float)(q & 15)), m));
            store(o + 16, __fadd_rn(__fmul_rn(s, (float)(q >> 4)), m));
        } else {
            store(o, __fmul_rn(s, (float)((q & 15) - zero)));
            store(o + 16, __fmul_rn(s, (float)((q >> 4) - zero)));
        }
    }
}

template <typename T, typename S>
__device__ void q8_rows(T* __restrict__ out, const signed char* __restrict__ data, const S* __restrict__ scale,
                        const S* __restrict__ mins, const long long* __restrict__ ids, long long row0, long long N,
                        int R, int K, int group) {
    const int groups = K / group;
    const long long n = (long long)R * K;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const long long i = e / K;
        const int k = (int)(e - i * K), g = k / group;
        const long long row = ids ? ids[i] : row0 + i;
        if (row < 0 || row >= N) {
            store(out + e, 0.0f);
            continue;
        }
        float v = __fmul_rn(to_float(scale[row * groups + g]), (float)data[row * K + k]);
        if (mins) v = __fadd_rn(v, to_float(mins[row * groups + g]));
        store(out + e, v);
    }
}

extern "C" __global__ void q4_rows_f32(float* out, const unsigned char* data, const float* scale, const float* mins,
                                       const long long* ids, long long row0, long long N, int R, int K, int zero) {
    q4_rows(out, data, scale, mins, ids, row0, N, R, K, zero);
}

extern "C" __global__ void q4_rows_f16(__half* out, const unsigned char* data, const float* scale, const float* mins,
                                       const long long* ids, long long row0, long long N, int R, int K, int zero) {
    q4_rows(out, data, scale, mins, ids, row0, N, R, K, zero);
}

extern "C" __global__ void q4_rows_f32_hs(float* out, const unsigned char* data, const __half* scale,
                                          const __half* mins, const long long* ids, long long row0, long long N, int R,
                                          int K, int zero) {
    q4_rows(out, data, scale, mins, ids, row0, N, R, K, zero);
}

extern "C" __global__ void q4_rows_f16_hs(__half* out, const unsigned char* data, const __half* scale,
                                          const __half* mins, const long long* ids, long long row0, long long N, int R,
                                          int K, int zero) {
    q4_rows(out, data, scale, mins, ids, row0, N, R, K, zero);
}

extern "C" __global__ void q8_rows_f32(float* out, const signed char* data, const float* scale, const float* mins,
                                       const long long* ids, long long row0, long long N, int R, int K, int group) {
    q8_rows(out, data, scale, mins, ids, row0, N, R, K, group);
}

extern "C" __global__ void q8_rows_f16(__half* out, const signed char* data, const float* scale, const float* mins,
                                       const long long* ids, long long row0, long long N, int R, int K, int group) {
    q8_rows(out, data, scale, mins, ids, row0, N, R, K, group);
}

extern "C" __global__ void q8_rows_f32_hs(float* out, const signed char* data, const __half* scale,
                                          const __half* mins, const long long* ids, long long row0, long long N, int R,
                                          int K, int group) {
    q8_rows(out, data, scale, mins, ids, row0, N, R, K, group);
}

extern "C" __global__ void q8_rows_f16_hs(__half* out, const signed char* data, const __half* scale,
                                          const __half* mins, const long long* ids, long long row0, long long N, int R,
                                          int K, int group) {
    q8_rows(out, data, scale, mins, ids, row0, N, R, K, group);
}
