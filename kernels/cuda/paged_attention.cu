// Paged causal attention over float16 K/V caches [num_blocks, block_size, Hkv, Dh], for a flattened varlen batch.
//
// q [T, H, Dh] float32 (element strides, last dim contiguous); out [T, H, Dh] float32 contiguous. Sequence b owns
// query rows query_start[b] .. query_start[b+1]-1 (n of them); its row i sits at position context_lens[b] - n + i
// and sees keys 0 .. that position, read through block_tables[b] ([B, max_blocks] int32). Head h reads kv head
// h / (H / Hkv). Dh % 8 == 0, Dh <= PA_MAX_DH.
//
// A warp walks keys 32 at a time (a tile): one key per lane for the scores, then lanes over dims for P.V, folding each
// tile into a running max / sum / accumulator per query row (online softmax): no [rows, keys] matrix is stored.
//   decode:  one query row per sequence; a block's PA_WARPS warps split the keys and merge their states at the end.
//   prefill: up to PA_WARPS * PA_ROWS consecutive rows of one sequence a block, PA_ROWS per warp, each warp over
//            every key tile its rows can see.
#include "common.cuh"

#define PA_MAX_DH 256
#define PA_PAIRS (PA_MAX_DH / 64)  // in P.V lane l holds dims 2l + 64i and 2l + 64i + 1, i < PA_PAIRS
#define PA_WARPS 4
#define PA_ROWS 4

// Fold keys j0 .. j0 + 31 (those < n_keys) into the online-softmax state of a warp's R query rows.
// qs: the rows' scaled queries [R][PA_MAX_DH] (shared memory); last[r]: the last key row r may see (-1: none).
// table: the sequence's block table; head_off: kv head * Dh. m, l, acc: the rows' state, the same in every lane
// (m, l) or this lane's dims (acc).
template <int R>
__device__ __forceinline__ void fold_tile(const float* qs, const int* last, int n_keys, int j0,
                                          const __half* __restrict__ k_cache, const __half* __restrict__ v_cache,
                                          const int* __restrict__ table, int block_size, long long slot_stride,
                                          long long head_off, int Dh, float (&m)[R], float (&l)[R],
                                          float (&acc)[R][2 * PA_PAIRS]) {
    const int lane = threadIdx.x & 31;
    const int j = j0 + lane;
    const bool in_range = j < n_keys;
    const int jj = in_range ? j : j0;  // lanes past the end read a real key and drop it
    const long long base = ((long long)table[jj / block_size] * block_size + jj % block_size) * slot_stride + head_off;

    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    const uint4* kp = reinterpret_cast<const uint4*>(k_cache + base);
    for (int d8 = 0; d8 < Dh / 8; ++d8) {
        const uint4 raw = kp[d8];
        const __half2* k2 = reinterpret_cast<const __half2*>(&raw);
        const float2 k0 = __half22float2(k2[0]), k1 = __half22float2(k2[1]);
        const float2 k2f = __half22float2(k2[2]), k3 = __half22float2(k2[3]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float* q = qs + r * PA_MAX_DH + 8 * d8;  // the same address in every lane: a broadcast
            s[r] += q[0] * k0.x + q[1] * k0.y + q[2] * k1.x + q[3] * k1.y
                  + q[4] * k2f.x + q[5] * k2f.y + q[6] * k3.x + q[7] * k3.y;
        }
    }

    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const bool visible = in_range && j <= last[r];
        const float m_new = fmaxf(m[r], warp_max(visible ? s[r] : FORGE_NEG_BIG));
        const float corr = expf(m[r] - m_new);
        p[r] = visible ? expf(s[r] - m_new) : 0.0f;
        l[r] = l[r] * corr + warp_sum(p[r]);
        m[r] = m_new;
#pragma unroll
        for (int i = 0; i < 2 * PA_PAIRS; ++i) acc[r][i] *= corr;
    }

    const int count = min(32, n_keys - j0);
    for (int key = 0; key < count; ++key) {
        const long long vbase = __shfl_sync(FORGE_FULL_MASK, base, key);
        const __half2* vp = reinterpret_cast<const __half2*>(v_cache + vbase);
        float pk[R];
#pragma unroll
        for (int r = 0; r < R; ++r) pk[r] = __shfl_sync(FORGE_FULL_MASK, p[r], key);
#pragma unroll
        for (int i = 0; i < PA_PAIRS; ++i) {
            const int d = 2 * lane + 64 * i;
            if (d < Dh) {
                const float2 v = __half22float2(vp[d / 2]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    acc[r][2 * i] += pk[r] * v.x;
                    acc[r][2 * i + 1] += pk[r] * v.y;
                }
            }
        }
    }
}

// Grid (len(seq_ids), H): block (i, h) is sequence seq_ids[i] (one query row), head h. Context 0 gives zeros.
extern "C" __global__ void paged_attention_decode_f16(
    float* __restrict__ out, const float* __restrict__ q, const __half* __restrict__ k_cache,
    const __half* __restrict__ v_cache, const int* __restrict__ seq_ids, const int* __restrict__ query_start,
    const int* __restrict__ context_lens, const int* __restrict__ block_tables, int H, int Hkv, int Dh, int block_size,
    int max_blocks, long long q_stride_t, long long q_stride_h, float scale) {
    const int b = seq_ids[blockIdx.x], h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long t = query_start[b];
    const int n_keys = context_lens[b];

    __shared__ float qs[PA_MAX_DH];
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) qs[d] = q[t * q_stride_t + h * q_stride_h + d] * scale;
    __syncthreads();

    const int last[1] = {n_keys - 1};
    float m[1] = {FORGE_NEG_BIG}, l[1] = {0.0f}, acc[1][2 * PA_PAIRS] = {};
    const int* table = block_tables + (long long)b * max_blocks;
    const long long head_off = (long long)(h / (H / Hkv)) * Dh;
    for (int j0 = 32 * warp; j0 < n_keys; j0 += 32 * PA_WARPS)
        fold_tile<1>(qs, last, n_keys, j0, k_cache, v_cache, table, block_size, (long long)Hkv * Dh, head_off, Dh, m, l, acc);

    __shared__ float s_m[PA_WARPS], s_l[PA_WARPS], s_acc[PA_WARPS][PA_MAX_DH];
    if (lane == 0) {
        s_m[warp] = m[0];
        s_l[warp] = l[0];
    }
#pragma unroll
    for (int i = 0; i < PA_PAIRS; ++i) {
        const int d = 2 * lane + 64 * i;
        if (d < Dh) {
            s_acc[warp][d] = acc[0][2 * i];
            s_acc[warp][d + 1] = acc[0][2 * i + 1];
        }
    }
    __syncthreads();

    float m_all = FORGE_NEG_BIG;
    for (int w = 0; w < PA_WARPS; ++w) m_all = fmaxf(m_all, s_m[w]);
    float weight[PA_WARPS], l_all = 0.0f;
    for (int w = 0; w < PA_WARPS; ++w) {
        weight[w] = expf(s_m[w] - m_all);  // 0 for a warp that saw no key
        l_all += s_l[w] * weight[w];
    }
    float* o = out + (t * H + h) * Dh;
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < PA_WARPS; ++w) v += s_acc[w][d] * weight[w];
        o[d] = l_all > 0.0f ? v / l_all : 0.0f;
    }
}

// Grid (n_items, H): item i = items[2i] (sequence), items[2i + 1] (its first row in this block); head h.
extern "C" __global__ void paged_attention_prefill_f16(
    float* __restrict__ out, const float* __restrict__ q, const __half* __restrict__ k_cache,
    const __half* __restrict__ v_cache, const int* __restrict__ items, const int* __restrict__ query_start,
    const int* __restrict__ context_lens, const int* __restrict__ block_tables, int H, int Hkv, int Dh, int block_size,
    int max_blocks, long long q_stride_t, long long q_stride_h, float scale) {
    constexpr int ROWS = PA_WARPS * PA_ROWS;
    const int b = items[2 * blockIdx.x], first = items[2 * blockIdx.x + 1], h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q0 = query_start[b], n = query_start[b + 1] - q0;
    const int ctx = context_lens[b], pos0 = ctx - n;  // position of the sequence's row 0

    __shared__ float qs[ROWS * PA_MAX_DH];
    __shared__ int last[ROWS];
    for (int i = threadIdx.x; i < ROWS * Dh; i += blockDim.x) {
        const int r = i / Dh, d = i - r * Dh, row = first + r;
        qs[r * PA_MAX_DH + d] = row < n ? q[(long long)(q0 + row) * q_stride_t + h * q_stride_h + d] * scale : 0.0f;
    }
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) last[r] = first + r < n ? pos0 + first + r : -1;
    __syncthreads();

    const int row0 = first + warp * PA_ROWS;  // this warp's rows: row0 .. row0 + PA_ROWS - 1 (those < n)
    const int n_keys = row0 < n ? min(pos0 + row0 + PA_ROWS, ctx) : 0;
    float m[PA_ROWS], l[PA_ROWS], acc[PA_ROWS][2 * PA_PAIRS] = {};
#pragma unroll
    for (int r = 0; r < PA_ROWS; ++r) {
        m[r] = FORGE_NEG_BIG;
        l[r] = 0.0f;
    }
    const int* table = block_tables + (long long)b * max_blocks;
    const long long head_off = (long long)(h / (H / Hkv)) * Dh;
    for (int j0 = 0; j0 < n_keys; j0 += 32)
        fold_tile<PA_ROWS>(qs + warp * PA_ROWS * PA_MAX_DH, last + warp * PA_ROWS, n_keys, j0, k_cache, v_cache, table,
                           block_size, (long long)Hkv * Dh, head_off, Dh, m, l, acc);

#pragma unroll
    for (int r = 0; r < PA_ROWS; ++r) {
        if (row0 + r >= n) break;
        float* o = out + ((long long)(q0 + row0 + r) * H + h) * Dh;
#pragma unroll
        for (int i = 0; i < PA_PAIRS; ++i) {
            const int d = 2 * lane + 64 * i;
            if (d < Dh) {
                o[d] = acc[r][2 * i] / l[r];
                o[d + 1] = acc[r][2 * i + 1] / l[r];
            }
        }
    }
}
