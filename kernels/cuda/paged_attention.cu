// Paged causal attention for a flattened varlen batch (decode and prefill-with-prefix alike).
//
// One thread block per (query token, head), PA_WARPS warps. Query t of sequence b (rows
// query_start[b] .. query_start[b+1]-1, n of them) sits at position pos = context_lens[b] - n + j
// and attends to keys 0..pos, read through the sequence's block table. Warp w takes keys
// w, w + PA_WARPS, ...: the warp computes one q.k dot product (each lane holds dims lane, lane+32, ...)
// and folds it into its running (max, sum, acc) with an online softmax; the warps' partial results
// are merged at the end. GQA: head h reads kv head h / (H / Hkv). float32 throughout.
//
// k_cache, v_cache: [num_blocks, block_size, Hkv, Dh]; q: [T, H, Dh] with element strides (last dim
// contiguous); out: [T, H, Dh] contiguous; block_tables: [B, max_blocks] int32. Dh <= PA_MAX_DH.

#define PA_WARPS 4
#define PA_MAX_DH 256
#define PA_LANE_DIMS (PA_MAX_DH / 32)
#define PA_NEG_BIG (-3.402823466e+38f)  // NVRTC has no INFINITY macro; exp(PA_NEG_BIG - x) == 0

__device__ __forceinline__ float pa_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

extern "C" __global__ void paged_attention_f32(
    float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ k_cache,
    const float* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ context_lens,
    const int* __restrict__ block_tables, int B, int H, int Hkv, int Dh, int block_size, int max_blocks,
    long long q_stride_t, long long q_stride_h, float scale) {
    const int t = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    // The sequence owning row t: the last b with query_start[b] <= t.
    int lo = 0, hi = B - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (query_start[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int b = lo;
    const int n = query_start[b + 1] - query_start[b];
    const int pos = context_lens[b] - n + (t - query_start[b]);
    const int kvh = h / (H / Hkv);
    const int* table = block_tables + (long long)b * max_blocks;
    const long long slot_stride = (long long)Hkv * Dh;

    float qr[PA_LANE_DIMS], acc[PA_LANE_DIMS];
    const float* qp = q + (long long)t * q_stride_t + (long long)h * q_stride_h;
#pragma unroll
    for (int i = 0; i < PA_LANE_DIMS; ++i) {
        const int d = lane + 32 * i;
        qr[i] = d < Dh ? qp[d] * scale : 0.0f;
        acc[i] = 0.0f;
    }

    float m = PA_NEG_BIG, l = 0.0f;
    for (int j = warp; j <= pos; j += PA_WARPS) {
        const long long slot = (long long)table[j / block_size] * block_size + (j % block_size);
        const float* kp = k_cache + slot * slot_stride + (long long)kvh * Dh;
        const float* vp = v_cache + slot * slot_stride + (long long)kvh * Dh;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < PA_LANE_DIMS; ++i) {
            const int d = lane + 32 * i;
            if (d < Dh) dot += qr[i] * kp[d];
        }
        dot = pa_warp_sum(dot);
        const float m_new = fmaxf(m, dot);
        const float corr = expf(m - m_new);
        const float p = expf(dot - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < PA_LANE_DIMS; ++i) {
            const int d = lane + 32 * i;
            if (d < Dh) acc[i] = acc[i] * corr + p * vp[d];
        }
        m = m_new;
    }

    __shared__ float s_m[PA_WARPS], s_l[PA_WARPS];
    __shared__ float s_acc[PA_WARPS][PA_MAX_DH];
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < PA_LANE_DIMS; ++i) {
        const int d = lane + 32 * i;
        if (d < Dh) s_acc[warp][d] = acc[i];
    }
    __syncthreads();

    float m_all = PA_NEG_BIG;
    for (int w = 0; w < PA_WARPS; ++w) m_all = fmaxf(m_all, s_m[w]);
    float weight[PA_WARPS];
    float l_all = 0.0f;
    for (int w = 0; w < PA_WARPS; ++w) {
        weight[w] = expf(s_m[w] - m_all);  // 0 for a warp that saw no key
        l_all += s_l[w] * weight[w];
    }
    float* op = out + ((long long)t * H + h) * Dh;
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < PA_WARPS; ++w) o += s_acc[w][d] * weight[w];
        op[d] = o / l_all;
    }
}
