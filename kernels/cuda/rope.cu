// Rotary embedding, rotate-half (NeoX / Hugging Face) convention, in place on float32 x [T, H, Dh].
// x may be a strided view (e.g. part of a fused QKV output): strides are in elements, last dim contiguous.
// cos/sin are contiguous [T, Dh/2]. One thread block per token.
extern "C" __global__ void rope_neox_f32(float* __restrict__ x, const float* __restrict__ cos_t,
                                         const float* __restrict__ sin_t, int H, int half,
                                         long long stride_t, long long stride_h) {
    const long long t = blockIdx.x;
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int i = threadIdx.x; i < H * half; i += blockDim.x) {
        const int h = i / half, j = i - h * half;
        float* p = x + t * stride_t + h * stride_h;
        const float x1 = p[j], x2 = p[j + half];
        const float cj = c[j], sj = s[j];
        p[j] = x1 * cj - x2 * sj;
        p[j + half] = x2 * cj + x1 * sj;
    }
}
