// SwiGLU activation: gate_up [T, 2F] = [gate | up] (row stride in elements) -> out [T, F] contiguous,
// out = silu(gate) * up with silu(g) = g / (1 + exp(-g)). Grid-stride loop over T * F elements.
extern "C" __global__ void silu_mul_f32(const float* __restrict__ gate_up, float* __restrict__ out,
                                        int F, long long stride_t, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long t = i / F;
        const int f = (int)(i - t * F);
        const float g = gate_up[t * stride_t + f];
        const float u = gate_up[t * stride_t + F + f];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}
