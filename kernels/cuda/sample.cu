// Sampling on the device: one token id per row of logits [R, V], so that a step copies back ids, not logits.
//
// The semantics are the host sampler's (kernels/row_sampling.py `draw`), row by row, with the uniform u drawn
// on the host from the sequence's own generator:
//   x = logits row (structured-output mask already applied). Any NaN, every x at -inf, or (when sampling) a
//   best logit of +inf: -1. Temperature 0: the first maximum. Otherwise z = (x - max) / temperature and
//   w = exp(z) (max 1), then
//   top-k   (0 < k < V): keep z >= the k-th largest z (ties with it kept);
//   top-p   (< 1): keep the smallest set of largest w whose sum reaches top_p * (sum of the w left), ties at
//           the cut going to lower ids;
//   min-p:  keep w >= min_p;
//   pick:   the first id whose running sum of kept w, in id order, exceeds u * (their total).
//
// One block of SAMPLE_THREADS threads per row; no sort. The k-th largest z and the nucleus cut are radix
// selects over 32-bit keys that order like the values: 4 passes of 8 bits, each a histogram (counts and
// float64 weights) of the values still matching the chosen prefix, walked from the top bin down until the
// weight above plus the bin's reaches the goal (k for top-k, counting 1 a value; top_p * total for top-p,
// weighing w). Tokens with z = -inf (masked) or w = 0 take no part: they carry no mass; nor do those below the
// host's bound for the nucleus (`Nucleus`), which sit under the cut whatever it is. Ties at the nucleus
// cut are kept up to the lowest ids that reach the goal, found by a prefix count over contiguous chunks of
// the row (a chunk per thread); the pick walks the same chunks after a float64 prefix sum of their mass.
// Sums are float64 like the host's cumulative sums, in another order: picks can differ from the host's only
// where u * total lies within rounding of a boundary between two tokens.
#include "common.cuh"

#define SAMPLE_THREADS 512
#define SAMPLE_COLUMNS 5  // per row of params: temperature, top_k, top_p, min_p, u

// Sum of v over this thread and those before it (in thread order); *before gets the sum without this
// thread's v (exactly the previous thread's result) and *total the sum over all.
template <typename T>
__device__ T block_scan(T v, T* before, T* total) {
    __shared__ T s[SAMPLE_THREADS];
    const int t = threadIdx.x;
    __syncthreads();
    s[t] = v;
    __syncthreads();
    for (int offset = 1; offset < SAMPLE_THREADS; offset <<= 1) {  // Hillis-Steele: inclusive sums
        const T before = t >= offset ? s[t - offset] : T(0);
        __syncthreads();
        s[t] += before;
        __syncthreads();
    }
    *before = t ? s[t - 1] : T(0);
    *total = s[SAMPLE_THREADS - 1];
    return s[t];
}

// Keys that order like the float values (-inf lowest, no NaN here).
__device__ __forceinline__ unsigned order_key(float v) {
    const unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct Cut {
    unsigned key;  // the selected key
    double above;  // weight of the taking-part items with a larger key
    int ties;      // taking-part items with exactly this key
};

// The largest key c such that the weight of the taking-part items with keys >= c reaches `goal` (or, if
// rounding leaves every key short of it, the smallest key). item(i, &key, &weight) says whether item i takes
// part; at least one must.
template <typename Item>
__device__ Cut radix_select(const Item& item, int V, double goal) {
    __shared__ double bin_weight[256];
    __shared__ int bin_count[256];
    __shared__ Cut cut;
    if (threadIdx.x == 0) cut = Cut{0u, 0.0, 0};
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS) bin_weight[b] = 0.0, bin_count[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SAMPLE_THREADS) {
            unsigned key;
            double weight;
            if (!item(i, &key, &weight) || (shift < 24 && (key >> (shift + 8)) != (cut.key >> (shift + 8)))) continue;
            const int b = (key >> shift) & 255;
            atomicAdd(&bin_weight[b], weight);
            atomicAdd(&bin_count[b], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int lowest = 0;
            while (!bin_count[lowest]) ++lowest;  // the prefix came from a bin with items: one is here
            int b = 255;
            for (;; --b) {
                if (!bin_count[b]) continue;
                if (b == lowest || cut.above + bin_weight[b] >= goal) break;
                cut.above += bin_weight[b];
            }
            cut.key |= (unsigned)b << shift;
            cut.ties = bin_count[b];
        }
        __syncthreads();
    }
    return cut;
}

struct Row {
    const float* x;
    float max, temperature;
    __device__ float z(int i) const { return (x[i] - max) / temperature; }
};

struct TopK {  // the candidates of the k-th largest z: every finite z, counting 1
    Row row;
    __device__ bool operator()(int i, unsigned* key, double* weight) const {
        const float z = row.z(i);
        *key = order_key(z);
        *weight = 1.0;
        return z > -__int_as_float(0x7f800000);
    }
};

struct Filter {
    Row row;
    bool top_k, top_p;
    unsigned kth;    // top_k: the key of the k-th largest z
    float cut;       // top_p: the smallest w kept ...
    int last_tie;    // ... and the last id kept among the w equal to it
    float min_p;
    // Whether the top-k (and, once set, the top-p and min-p) filters keep item i; *w gets exp(z).
    __device__ bool keeps(int i, float* w) const {
        const float z = row.z(i);
        *w = expf(z);
        if (top_k && order_key(z) < kth) return false;
        if (top_p && (*w < cut || (*w == cut && i > last_tie))) return false;
        return *w >= min_p;
    }
};

// The candidates of the top-p cut: what top-k keeps with w >= floor (and w > 0), weighing w. Every w below
// floor = (1 - top_p) * total / n (n: the tokens top-k keeps) together holds less than (1 - top_p) of the mass,
// so the cut lies among the rest (the host's bound): fewer histogram atomics.
struct Nucleus {
    Filter f;
    float floor;
    __device__ bool operator()(int i, unsigned* key, double* weight) const {
        float w;
        const bool kept = f.keeps(i, &w);
        *key = __float_as_uint(w);  // w >= 0: the bits order like the values
        *weight = w;
        return kept && w > 0.0f && w >= floor;
    }
};

// logits [R, V] (row stride stride_r), params float64 [R, SAMPLE_COLUMNS] -> out int64 [R]. Grid (R), block
// (SAMPLE_THREADS).
extern "C" __global__ void sample_rows_f32(const float* __restrict__ logits, const double* __restrict__ params,
                                           long long* __restrict__ out, int V, long long stride_r) {
    const int r = blockIdx.x, t = threadIdx.x;
    const double* p = params + (long long)r * SAMPLE_COLUMNS;
    Row row{logits + r * stride_r, 0.0f, (float)p[0]};
    const float inf = __int_as_float(0x7f800000);

    float best = -inf;
    int nans = 0, finite = 0;
    for (int i = t; i < V; i += SAMPLE_THREADS) {
        const float v = row.x[i];
        nans += v != v;
        finite += v > -inf && v < inf;
        best = v > best ? v : best;
    }
    row.max = block_reduce(best, Max<float>());
    nans = block_reduce(nans, Add<int>());
    finite = block_reduce(finite, Add<int>());
    if (nans || row.max == -inf || (row.max == inf && row.temperature != 0.0f)) {
        if (t == 0) out[r] = -1;
        return;
    }
    if (row.temperature == 0.0f) {
        int first = V;
        for (int i = t; i < V; i += SAMPLE_THREADS) first = row.x[i] == row.max && i < first ? i : first;
        first = block_reduce(first, Min<int>());
        if (t == 0) out[r] = first;
        return;
    }

    // Contiguous chunks of the row, one a thread, for what counts or sums in id order.
    const int chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS, begin = t * chunk, end = min(V, begin + chunk);
    const int k = (int)p[1];
    Filter f{row, false, false, 0u, 0.0f, V, -1.0f};
    double kept = V;  // tokens top-k keeps
    if (0 < k && k < finite) {  // with k >= the finite z, top-k keeps every token with mass
        const Cut c = radix_select(TopK{row}, V, (double)k);
        f.kth = c.key;
        f.top_k = true;
        kept = c.above + c.ties;
    }
    const double top_p = p[2];
    if (top_p < 1.0) {
        double mass = 0.0;
        for (int i = t; i < V; i += SAMPLE_THREADS) {
            float w;
            mass += f.keeps(i, &w) ? w : 0.0f;
        }
        const double total = (float)block_reduce(mass, Add<double>());  // the host's total is float32
        const double goal = top_p * total;
        const Cut c = radix_select(Nucleus{f, (float)((1.0 - top_p) * total / kept)}, V, goal);
        f.cut = __uint_as_float(c.key);
        const double need = ceil((goal - c.above) / (double)f.cut);  // ties at the cut that reach the goal
        const int keep_ties = need < 1.0 ? 1 : need > (double)c.ties ? c.ties : (int)need;
        // The id of tie number keep_ties, counting up from id 0.
        int mine = 0, before, all;
        for (int i = begin; i < end; ++i) {
            float w;
            mine += f.keeps(i, &w) && w == f.cut;
        }
        const int upto = block_scan(mine, &before, &all);
        __shared__ int last_tie;
        if (before < keep_ties && keep_ties <= upto) {
            for (int i = begin, n = before; i < end; ++i) {
                float w;
                n += f.keeps(i, &w) && w == f.cut;
                if (n == keep_ties) { last_tie = i; break; }
            }
        }
        __syncthreads();
        f.last_tie = last_tie;
        f.top_p = true;
    }
    f.min_p = (float)p[3];

    // Pick: the chunk whose float64 prefix range [lo, hi) holds u * total, then the id inside it.
    double mass = 0.0, lo, total;
    int last = -1;  // the chunk's last id with mass
    for (int i = begin; i < end; ++i) {
        float w;
        if (f.keeps(i, &w) && w > 0.0f) mass += w, last = i;
    }
    const double hi = block_scan(mass, &lo, &total);
    const double target = p[4] * total;
    __shared__ int picked;
    const int row_last = block_reduce(last, Max<int>());  // where a target rounded up to the total lands
    if (t == 0) picked = row_last;
    __syncthreads();
    if (lo <= target && target < hi) {  // one thread at most: the ranges tile [0, total)
        int at = last;  // if rounding inside the chunk never passes the target
        double run = lo;
        for (int i = begin; i < end; ++i) {
            float w;
            if (!f.keeps(i, &w) || w == 0.0f) continue;
            run += w;
            if (run > target) { at = i; break; }
        }
        picked = at;
    }
    __syncthreads();
    if (t == 0) out[r] = picked;
}
