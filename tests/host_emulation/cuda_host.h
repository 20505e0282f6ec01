// Run the fp32 ladder's CUDA kernels on the host, to check their indexing, edge guards and barriers
// without a GPU (tests/test_sgemm_emulated.py).
//
// Each CUDA thread of a block is a ucontext coroutine. __syncthreads() yields to a scheduler that
// resumes every thread of the block once per barrier phase, in an order the test picks (forward,
// reverse or shuffled), so a missing barrier shows up as a wrong result. A thread that returns
// while others wait at a barrier, or threads that pass different numbers of barriers, fail the run.
// __shared__ becomes `static`: blocks run one after another, so one copy per kernel suffices.
// Faithful for kernels without warp-level operations (shuffles, votes, tensor cores): the sgemm
// ladder up to k10.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint3_ {
    unsigned x = 0, y = 0, z = 0;
};
static uint3_ threadIdx, blockIdx, blockDim, gridDim;

namespace host_emulation {

struct Thread {
    ucontext_t ctx;
    char* stack = nullptr;
    bool done = false;
    int barriers = 0;
    uint3_ idx;
};

constexpr size_t kStackBytes = 256 * 1024;
static std::vector<char*> stack_pool;  // reused across blocks
static ucontext_t scheduler;
static std::vector<Thread>* block_threads;
static int current = -1;
static std::function<void()> kernel_body;

static void thread_entry() {
    kernel_body();
    (*block_threads)[current].done = true;
}  // returns to uc_link, the scheduler

inline void syncthreads() {
    (*block_threads)[current].barriers++;
    swapcontext(&(*block_threads)[current].ctx, &scheduler);
}

enum Order { kForward = 0, kReverse = 1, kShuffled = 2 };

// Runs `body` as every thread of one block; false (with a message) on a barrier mismatch.
inline bool run_block(uint3_ block, std::function<void()> body, Order order, std::mt19937& rng) {
    const int n = block.x * block.y * block.z;
    std::vector<Thread> ts(n);
    block_threads = &ts;
    kernel_body = std::move(body);
    blockDim = block;
    for (int i = 0; i < n; ++i) {
        if ((int)stack_pool.size() <= i) stack_pool.push_back(static_cast<char*>(std::malloc(kStackBytes)));
        ts[i].stack = stack_pool[i];
        ts[i].idx.x = i % block.x;
        ts[i].idx.y = (i / block.x) % block.y;
        ts[i].idx.z = i / (block.x * block.y);
        getcontext(&ts[i].ctx);
        ts[i].ctx.uc_stack.ss_sp = ts[i].stack;
        ts[i].ctx.uc_stack.ss_size = kStackBytes;
        ts[i].ctx.uc_link = &scheduler;
        makecontext(&ts[i].ctx, thread_entry, 0);
    }
    std::vector<int> sequence(n);
    for (int i = 0; i < n; ++i) sequence[i] = i;
    for (;;) {
        if (order == kReverse) std::reverse(sequence.begin(), sequence.end());
        if (order == kShuffled) std::shuffle(sequence.begin(), sequence.end(), rng);
        bool ran = false;
        for (int i : sequence) {
            if (ts[i].done) continue;
            ran = true;
            current = i;
            threadIdx = ts[i].idx;
            swapcontext(&scheduler, &ts[i].ctx);
        }
        if (!ran) break;
        int finished = 0;
        for (auto& t : ts) finished += t.done;
        if (finished && finished < n) {
            std::printf("FAIL: %d threads returned while %d wait at a barrier\n", finished, n - finished);
            return false;
        }
    }
    for (auto& t : ts) {
        if (t.barriers != ts[0].barriers) {
            std::printf("FAIL: threads passed different numbers of barriers\n");
            return false;
        }
    }
    return true;
}

}  // namespace host_emulation

#define __syncthreads() host_emulation::syncthreads()
