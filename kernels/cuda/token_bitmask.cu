// Structured output: logits [R, V] (row stride in elements) get -inf wherever bit (v % 32) of
// bitmask[r, v / 32] (int32 [R, W], contiguous) is 0. Columns at or past 32 * W are disallowed too.
// Grid (ceil(V / threads), R): one thread per logit.
extern "C" __global__ void apply_token_bitmask_f32(float* __restrict__ logits, const int* __restrict__ bitmask,
                                                   int V, int W, long long stride_r) {
    const int r = blockIdx.y;
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= V) return;
    const int w = v >> 5;
    const bool allowed = w < W && ((bitmask[(long long)r * W + w] >> (v & 31)) & 1);
    if (!allowed) logits[(long long)r * stride_r + v] = -__int_as_float(0x7f800000);
}
