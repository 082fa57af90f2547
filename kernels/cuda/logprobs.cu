// Logprobs on the device: the log-softmax of chosen rows of logits [R, V] at each row's token and at its n best
// tokens (best first, ties to the lower id), so that a step asking for logprobs copies back 1 + 2n numbers a
// row, not the row. The semantics are kernels/row_sampling.py `logprob_rows`.
//
// One block per row. lse = max + log(sum exp(x - max)), the sum in float64 over float32 exps. The n best are
// found one at a time: each is the block-wide maximum over the tokens that come after the previous one in
// (value descending, id ascending) order, then the lowest id holding that value: 2n reductions, n <= 20.
#include "common.cuh"

// rows int64 [W] (rows of logits, row stride stride_r), tokens int64 [W] -> chosen float64 [W],
// top_ids int64 [W, n], top_logprobs float64 [W, n]. Grid (W), block a multiple of 32 threads.
extern "C" __global__ void logprobs_f32(const float* __restrict__ logits, const long long* __restrict__ rows,
                                        const long long* __restrict__ tokens, double* __restrict__ chosen,
                                        long long* __restrict__ top_ids, double* __restrict__ top_logprobs,
                                        int n, int V, long long stride_r) {
    const int j = blockIdx.x, t = threadIdx.x;
    const float* x = logits + rows[j] * stride_r;
    const float inf = __int_as_float(0x7f800000);
    float m = -inf;
    for (int i = t; i < V; i += blockDim.x) m = x[i] > m ? x[i] : m;
    m = block_reduce(m, Max<float>());
    double sum = 0.0;
    for (int i = t; i < V; i += blockDim.x) sum += expf(x[i] - m);
    const double lse = (double)m + log((double)(float)block_reduce(sum, Add<double>()));  // the host sums in float32
    if (t == 0) chosen[j] = (double)x[tokens[j]] - lse;
    float prev = inf;
    int prev_id = -1;
    for (int r = 0; r < n; ++r) {
        float best = -inf;
        for (int i = t; i < V; i += blockDim.x) {
            const float v = x[i];
            if ((v < prev || (v == prev && i > prev_id)) && v > best) best = v;
        }
        best = block_reduce(best, Max<float>());
        int id = V;
        for (int i = t; i < V; i += blockDim.x) {
            const float v = x[i];
            if ((v < prev || (v == prev && i > prev_id)) && v == best && i < id) id = i;
        }
        id = block_reduce(id, Min<int>());
        if (t == 0) {
            top_ids[(long long)j * n + r] = id;
            top_logprobs[(long long)j * n + r] = (double)best - lse;
        }
        prev = best, prev_id = id;
    }
}
