// engine.gemm_fp8: the engine's GEMM for e4m3 operands with scales, from the same named parts as
// engine/gemm.cu (kernels/common/):
//   fp8_traits.cuh      every compile-time choice by name (Fp8GemmTraits), written by gemmlab.planner.Fp8Plan
//   pipeline.cuh        the shared-memory ring
//   tile_scheduler.cuh  data-parallel persistent tiles (split-K / stream-K not yet wired for fp8)
//   mainloop.cuh        the producer's TMA loads (128-byte rows = 128 e4m3 values per k-step)
//   mainloop_fp8.cuh    the consumers' k32 e4m3 wgmmas and the promotion into fp32 (fp8_promote.cuh)
//   epilogue_store.cuh  fused epilogue (alpha = scale_a * scale_b per-tensor, bias, activation) and stores
// out (M x N) = act(alpha * sum_k A[m, k] B[n, k] (x block scales) + bias[n]); A (M, K) and B (N, K) e4m3,
// both K-major (the fp8 wgmma reads no MN-major operand); any M, N; K a multiple of 16 (TMA rows).
#include "common/epilogue_store.cuh"
#include "common/fp8_traits.cuh"
#include "common/mainloop.cuh"
#include "common/mainloop_fp8.cuh"

template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, 1)
engine_gemm_fp8(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmA_short,
                const __grid_constant__ CUtensorMap tmB, const __grid_constant__ CUtensorMap tmC,
                const __grid_constant__ CUtensorMap tmC_tail, const __grid_constant__ CUtensorMap tmSA,
                const __grid_constant__ CUtensorMap tmSB, const int* __restrict__ order, int M, int N, int K,
                const float* __restrict__ scale_a, const float* __restrict__ scale_b,
                const typename Tr::TBIAS* __restrict__ bias, typename Tr::TO* __restrict__ Out, long long ldo,
                int a_rows) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    extern __shared__ unsigned char smem_raw[];
    T* sA = reinterpret_cast<T*>(align_1024(smem_raw));
    T* sB = sA + Tr::STAGES * BM * BK;
    unsigned char* sC = reinterpret_cast<unsigned char*>(sB + Tr::STAGES * BN * BK);
    __shared__ Ring<Tr::STAGES> ring;

    const int wg = Tr::UNIFORM_WG ? warpgroup_index() : static_cast<int>(threadIdx.x / 128), t = threadIdx.x % 128;
    const int tiles_n = (N + BN - 1) / BN, num_tiles = ((M + BM - 1) / BM) * tiles_n;
    const int k_iters = (K + BK - 1) / BK;  // a ragged last k-step reads TMA zero fill: adds nothing
    // Block scales: one slot per stage after the output slabs, loaded with the stage's operands.
    float* s_scales = reinterpret_cast<float*>(sC + Tr::SLABS_BYTES);
    if (threadIdx.x == 0) ring.init(Tr::CONSUMERS);
    __syncthreads();
    pdl_wait();  // programmatic dependent launch: the previous kernel has completed (ptx.cuh)
    pdl_trigger_early();

    TileScheduler<DATA_PARALLEL> sched(num_tiles, k_iters, ScheduleArgs{1, 0, 0});
    WorkUnit u;
    if (wg == 0) {
        if constexpr (Tr::CONSUMERS > 1) setmaxnreg_dec<Tr::PRODUCER_REGS>();
        if (t == 0) {
            RingCursor cur;
            while (sched.next(u)) {
                const int packed = order[u.tile];
                const int m0 = (packed >> 16) * BM, n0 = (packed & 0xffff) * BN;
                if constexpr (Tr::SCALE == SCALE_BLOCK)  // the k-step's scales ride with its operands
                    produce_unit<Tr>(ring, cur, sA, sB, &tmA, &tmA_short, &tmB, m0, n0, u.k_begin, u.k_end, M, a_rows,
                                     BlockScaleLoads<Tr>{s_scales, &tmSA, &tmSB, m0, n0 / 128});
                else
                    produce_unit<Tr>(ring, cur, sA, sB, &tmA, &tmA_short, &tmB, m0, n0, u.k_begin, u.k_end, M, a_rows);
            }
        }
        return;
    }

    if constexpr (Tr::CONSUMERS > 1) setmaxnreg_inc<Tr::CONSUMER_REGS>();
    const int consumer = wg - 1;
    // Per-tensor scales are read on the device (no host sync); block scales are applied at promotion.
    const float alpha = Tr::SCALE == SCALE_TENSOR ? __ldg(scale_a) * __ldg(scale_b) : 1.0f;
    const EpilogueArgs<Tr> ep{alpha, 0.0f, nullptr, 0, 0, bias, Out, ldo, M, N};
    unsigned char* slabs = sC + consumer * 2 * Tr::SLAB_BYTES;
    RingCursor cur;
    int pieces = 0;
    float acc[Tr::MI][BN / 2];
    float part[Tr::MI][Tr::PART_N / 2];  // the wgmmas' partial sums (split promotion: a part of the columns)
    while (sched.next(u)) {
        const int packed = order[u.tile];
        const int m0 = (packed >> 16) * BM, n0 = (packed & 0xffff) * BN;
        const int row0 = m0 + consumer * Tr::MI * 64;
        consume_unit_fp8<Tr>(ring, cur, sA, sB, consumer, t, acc, part, u.k_begin, u.k_end, s_scales, n0);
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi)
            store_block<Tr>(acc[mi], row0 + mi * 64, n0, ep, slabs, pieces, &tmC, &tmC_tail, t, consumer);
    }
    pdl_trigger_late();  // this CTA's last tile is stored or on its way: the next kernel may be scheduled
    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();
}
