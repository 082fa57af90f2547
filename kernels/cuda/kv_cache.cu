// Scatter this step's keys/values (float32) into the float16 paged caches [num_blocks, block_size, Hkv, Dh].
// k, v are [T, Hkv, Dh] with element strides (last dim contiguous); slot_mapping [T] holds flat slots
// block * block_size + offset. Slots outside [0, num_slots) are skipped so bad input never writes
// outside the cache. One thread block per token.
#include "common.cuh"

extern "C" __global__ void write_kv_f16(const float* __restrict__ k, const float* __restrict__ v,
                                        __half* __restrict__ k_cache, __half* __restrict__ v_cache,
                                        const long long* __restrict__ slot_mapping, long long num_slots,
                                        int Hkv, int Dh, long long k_stride_t, long long k_stride_h,
                                        long long v_stride_t, long long v_stride_h) {
    const long long t = blockIdx.x;
    const long long slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) return;
    const int row = Hkv * Dh;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int h = i / Dh, d = i - h * Dh;
        store(k_cache + slot * row + i, k[t * k_stride_t + h * k_stride_h + d]);
        store(v_cache + slot * row + i, v[t * v_stride_t + h * v_stride_h + d]);
    }
}
