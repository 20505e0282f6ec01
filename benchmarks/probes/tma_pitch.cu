// Probe (benchmarks/probes/probe_tma_pitch.py): TMA load throughput against the row pitch of a K-major
// operand (16- vs 32-byte aligned rows). One thread per CTA keeps STAGES boxes of 128 rows x 64 bf16 (16 KB)
// in flight; nothing consumes them. `dump` (optional): block 0 copies its last stage out.
#include "common/mbarrier.cuh"
#include "common/tma.cuh"

// MODE 0: 2-D map, box 64 x 128, 128-byte swizzle (the engine's K-major box).
// MODE 1: 2-D map, box 32 x 128, 64-byte swizzle, two per stage.
// MODE 3: 2-D map, box 8 x 128, no swizzle, eight per stage (16-byte pieces).
template <int MODE, int STAGES>
__global__ void __launch_bounds__(128) tma_pitch(const __grid_constant__ CUtensorMap map, int rblocks, int kblocks,
                                                 int iters, unsigned char* dump) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((size_t)smem_raw + 1023) & ~(size_t)1023);
    __shared__ alignas(8) u64 full[STAGES];
    constexpr u32 BOX = 128 * 64 * 2;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < iters; ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) mbar_wait_parity(&full[s], ((i / STAGES) - 1) & 1);
            const int unit = blockIdx.x + (i / kblocks) * gridDim.x;
            const int rb = unit % rblocks, kb = i % kblocks;
            unsigned char* dst = smem + s * BOX;
            mbar_expect_tx(&full[s], BOX);
            if constexpr (MODE == 0) {
                tma_load_2d(dst, &map, &full[s], kb * 64, rb * 128);
            } else if constexpr (MODE == 1) {
                tma_load_2d(dst, &map, &full[s], kb * 64, rb * 128);
                tma_load_2d(dst + BOX / 2, &map, &full[s], kb * 64 + 32, rb * 128);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) tma_load_2d(dst + j * (BOX / 8), &map, &full[s], kb * 64 + 8 * j, rb * 128);
            }
        }
        for (int i = iters > STAGES ? iters - STAGES : 0; i < iters; ++i)
            mbar_wait_parity(&full[i % STAGES], (i / STAGES) & 1);
    }
    __syncthreads();
    if (dump != nullptr && blockIdx.x == 0) {  // the last stage written, for comparing layouts
        const int s = (iters - 1) % STAGES;
        for (int b = threadIdx.x; b < (int)BOX; b += blockDim.x) dump[b] = smem[s * BOX + b];
    }
}

// Pairs of CTAs (clusters of 2) that both need the same 128 x 64 box each step, as two vertically adjacent
// GEMM tiles need the same B tile. MC = 1: each CTA loads the whole box itself (the L2 serves it twice);
// MC = 2: each loads one 64-row half and multicasts it to both (PTX ISA ".multicast::cluster"), the engine
// kernel's B multicast. Both keep the engine's protocol: a stage is reloaded only when both CTAs released it
// (each CTA's thread 0 arrives on both CTAs' "empty" barrier once it has waited for the stage's bytes).
// Every CTA receives 16 KB a step either way, so the rates compare the two delivery paths.
#include "common/ptx.cuh"

template <int MC, int STAGES>
__global__ void __launch_bounds__(128) tma_pair(const __grid_constant__ CUtensorMap map, int rblocks, int kblocks,
                                                int iters) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((size_t)smem_raw + 1023) & ~(size_t)1023);
    __shared__ alignas(8) u64 full[STAGES];
    __shared__ alignas(8) u64 empty[STAGES];
    constexpr u32 BOX = 128 * 64 * 2, HALF = BOX / 2;
    const u32 rank = cluster_ctarank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 2);
        }
        fence_mbarrier_init();
    }
    cluster_sync();
    if (threadIdx.x == 0) {
        const int pair = blockIdx.x / 2, pairs = gridDim.x / 2;
        auto release = [&](int j) {  // iteration j's bytes are here: free its stage in both CTAs
            mbar_wait_parity(&full[j % STAGES], (j / STAGES) & 1);
            mbar_arrive_notoken(&empty[j % STAGES]);
            mbar_arrive_cluster(&empty[j % STAGES], rank ^ 1);
        };
        for (int i = 0; i < iters; ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) mbar_wait_parity(&empty[s], ((i / STAGES) - 1) & 1);
            const int unit = pair + (i / kblocks) * pairs;
            const int rb = unit % rblocks, kb = i % kblocks;
            unsigned char* dst = smem + s * BOX;
            mbar_expect_tx(&full[s], BOX);
            if constexpr (MC == 1) {
                tma_load_2d(dst, &map, &full[s], kb * 64, rb * 128);
            } else {
                tma_load_2d_multicast(dst + rank * HALF, &map, &full[s], kb * 64, rb * 128 + 64 * rank, 0x3);
            }
            if (i >= STAGES - 1) release(i - (STAGES - 1));
        }
        for (int j = iters > STAGES - 1 ? iters - (STAGES - 1) : 0; j < iters; ++j) release(j);
    }
    cluster_sync();  // no CTA leaves while its peer's loads or arrivals may still reach it
}
