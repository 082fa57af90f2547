// Run CUDA kernels on the CPU, for tests on machines without a GPU (force-included before a .cu file).
//
// Every thread of a block is a fiber on the calling OS thread (started with ucontext, then switched with
// _setjmp/_longjmp, which unlike swapcontext make no system call); blocks run one after another. A fiber
// runs until it reaches __syncthreads or a warp shuffle, which are barriers: the block's (or the warp's)
// threads that have not exited all arrive before any goes on. __shared__ variables are static locals,
// which is right because one block runs at a time. This checks a kernel's logic (indexing, arithmetic,
// synchronisation points), not the GPU's memory model, timing or float contraction.
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }

namespace emu {

constexpr size_t kStack = 64 << 10;

struct Fiber {
    ucontext_t ctx;  // where it starts
    jmp_buf resume;  // where it waits
    uint3 tid;
    bool started, done;
};

struct Barrier {
    int live, arrived;
    unsigned generation;
};

struct Block {
    ucontext_t start;  // the scheduler, while it starts a fiber
    jmp_buf main;      // the scheduler, while a fiber runs
    Fiber* fibers;
    int current;
    Barrier all;
    Barrier* warps;
    uint64_t* slots;  // per warp: 2 x 32 shuffle slots, alternating by generation
    long long events;  // arrivals, releases and exits: a scheduling pass without any is a deadlock
    void (*body)(void*);
    void* args;
};

inline Block*& block() { static Block* b = nullptr; return b; }
inline dim3& grid_dim() { static dim3 d; return d; }
inline dim3& block_dim() { static dim3 d; return d; }
inline uint3& block_idx() { static uint3 i; return i; }

inline void yield() {
    Block* b = block();
    if (!_setjmp(b->fibers[b->current].resume)) _longjmp(b->main, 1);
}

inline int linear_tid() {
    const uint3 t = block()->fibers[block()->current].tid;
    return t.x + block_dim().x * (t.y + block_dim().y * t.z);
}

inline void release(Barrier& bar) {
    bar.arrived = 0;
    ++bar.generation;
    ++block()->events;
}

// Wait until every live fiber of `bar` has arrived (exited fibers no longer count).
inline void arrive(Barrier& bar) {
    const unsigned g = bar.generation;
    ++block()->events;
    if (++bar.arrived >= bar.live) return release(bar);
    while (bar.generation == g) yield();
}

template <typename T>
T shuffle(T v, int src_lane) {
    Block* b = block();
    const int tid = linear_tid(), w = tid / 32, lane = tid % 32;
    if (b->warps[w].live != 32) {
        std::fprintf(stderr, "cuda_on_cpu: a shuffle in a warp with %d live lanes\n", b->warps[w].live);
        std::abort();
    }
    uint64_t* slots = b->slots + 64 * w + 32 * (b->warps[w].generation & 1);
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    slots[lane] = bits;
    arrive(b->warps[w]);
    T out;
    std::memcpy(&out, &slots[src_lane & 31], sizeof(T));
    return out;
}

inline void trampoline() {
    Block* b = block();
    b->body(b->args);
    b->fibers[b->current].done = true;
    ++b->events;
    Barrier& warp = b->warps[linear_tid() / 32];
    // Fibers waiting at a barrier this one will never reach go on once the rest have arrived.
    if (--b->all.live > 0 && b->all.arrived >= b->all.live) release(b->all);
    if (--warp.live > 0 && warp.arrived >= warp.live) release(warp);
    _longjmp(b->main, 1);  // never returns: the fiber is over
}

inline void launch(dim3 grid, dim3 threads, void (*body)(void*), void* args) {
    const int n = threads.x * threads.y * threads.z, warps = (n + 31) / 32;
    Block b;
    b.fibers = new Fiber[n];
    b.warps = new Barrier[warps];
    b.slots = new uint64_t[64 * warps];
    char* stacks = new char[kStack * n];
    b.body = body;
    b.args = args;
    grid_dim() = grid;
    block_dim() = threads;
    block() = &b;
    ucontext_t base;
    getcontext(&base);  // once: every fiber's context starts as a copy
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                block_idx() = {bx, by, bz};
                b.all = {n, 0, 0};
                for (int w = 0; w < warps; ++w) b.warps[w] = {min(32, n - 32 * w), 0, 0};
                b.events = 0;
                for (int i = 0; i < n; ++i) {
                    Fiber& f = b.fibers[i];
                    f.tid = {unsigned(i % threads.x), unsigned(i / threads.x % threads.y), unsigned(i / (threads.x * threads.y))};
                    f.started = f.done = false;
                    f.ctx = base;
                    f.ctx.uc_stack.ss_sp = stacks + kStack * i;
                    f.ctx.uc_stack.ss_size = kStack;
                    f.ctx.uc_link = nullptr;
                    makecontext(&f.ctx, trampoline, 0);
                }
                for (int left = n; left > 0;) {
                    const long long before = b.events;
                    left = 0;
                    for (int i = 0; i < n; ++i) {
                        Fiber& f = b.fibers[i];
                        if (f.done) continue;
                        b.current = i;
                        if (!_setjmp(b.main)) {
                            if (f.started) _longjmp(f.resume, 1);
                            f.started = true;
                            swapcontext(&b.start, &f.ctx);
                        }
                        left += !f.done;
                    }
                    if (left && b.events == before) {
                        std::fprintf(stderr, "cuda_on_cpu: deadlock, %d threads wait at barriers the others never reach\n", left);
                        std::abort();
                    }
                }
            }
    block() = nullptr;
    delete[] stacks;
    delete[] b.slots;
    delete[] b.warps;
    delete[] b.fibers;
}

}  // namespace emu

#define threadIdx (emu::block()->fibers[emu::block()->current].tid)
#define blockIdx (emu::block_idx())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())

inline void __syncthreads() { emu::arrive(emu::block()->all); }
template <typename T>
T __shfl_sync(unsigned, T v, int src_lane) { return emu::shuffle(v, src_lane); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) { return emu::shuffle(v, (emu::linear_tid() % 32) ^ lane_mask); }

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
// One thread runs at a time and none yields inside: a plain read-modify-write is atomic.
template <typename T>
T atomicAdd(T* p, T v) { const T old = *p; *p = old + v; return old; }
