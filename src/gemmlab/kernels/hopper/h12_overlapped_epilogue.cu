// hopper.h12_overlapped_epilogue: h10 (CLUSTER = 1) with the epilogue moved under the next tile's
// tensor work. In h10 a consumer ends a tile with wgmma.wait_group 0, then converts and stores its
// 64 x BN fragment piece by piece while the tensor cores have nothing to do; the fitted cost is ~4.5 us
// per tile, ~9% of a 4096^3 run. Here the consumer packs the finished fragment to bf16 in registers
// (BN / 4 extra registers: 64 at BN = 256, next to the 128 accumulators of the next tile) and starts
// the next tile at once; the packed pieces go out through the same two 8 KB slabs during the first
// k-steps of the next tile, each right after that k-step's wgmma is issued, so stmatrix, the named
// barriers and the TMA store run while the tensor cores work (common/stash.cuh). The last tile's
// pieces are flushed after the loop.
//
// TN layout, M % 128 == 0, N % BN == 0, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/stash.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int QSIZE, int BN>
__global__ void __launch_bounds__(384, 1)
hopper_h12(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
           const __grid_constant__ CUtensorMap tmC, const int* __restrict__ order, int M, int N, int K) {
    constexpr int BM = 128, BK = 64, CONSUMERS = 2, SLABS = 2;
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(__nv_bfloat16);
    static_assert(BN % 64 == 0, "whole 64-column pieces");
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + QSIZE * BM * BK;
    __nv_bfloat16* sC = sB + QSIZE * BN * BK;  // CONSUMERS x SLABS slabs of 64 x 64
    __shared__ u64 full[QSIZE], empty[QSIZE];

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int tiles_n = N / BN, num_tiles = (M / BM) * tiles_n;
    const int k_iters = K / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < QSIZE; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMERS);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            int s = 0;
            u32 phase = 0;
            for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
                const int packed = order[tile];
                const int m0 = (packed >> 16) * BM, n0 = (packed & 0xffff) * BN;
                for (int kt = 0; kt < k_iters; ++kt) {
                    mbar_wait_parity(&empty[s], phase ^ 1);
                    mbar_expect_tx(&full[s], STAGE_BYTES);
                    tma_load_2d(sA + s * BM * BK, &tmA, &full[s], kt * BK, m0);
                    tma_load_2d(sB + s * BN * BK, &tmB, &full[s], kt * BK, n0);
                    if (++s == QSIZE) { s = 0; phase ^= 1; }
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int consumer = wg - 1, row = consumer * 64;
        unsigned char* slabs = reinterpret_cast<unsigned char*>(sC + consumer * SLABS * 64 * 64);
        int s = 0, prev = 0;
        u32 phase = 0;
        float d[BN / 2];  // the accumulators of the tile being computed
        Stash<BN> c;      // the previous tile, packed, stored during this tile's first k-steps
        c.pending = false;
        c.piece = 0;
        auto kstep = [&](int kt) {
            mbar_wait_parity(&full[s], phase);
            wgmma_fence();
            wgmma_k64<BN>(d, sA + s * BM * BK + row * BK, sB + s * BN * BK, kt == 0);
            wgmma_commit();
            if (kt > 0) {
                wgmma_wait<1>();
                if (t == 0) mbar_arrive_notoken(&empty[prev]);
            }
            prev = s;
            if (++s == QSIZE) { s = 0; phase ^= 1; }
        };
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
            const int packed = order[tile];
            const int m0 = (packed >> 16) * BM + row, n0 = (packed & 0xffff) * BN;
            ksteps_with_pieces<BN, 0>(c, k_iters, kstep, slabs, &tmC, t, consumer);
            for (int kt = BN / 64; kt < k_iters; ++kt) kstep(kt);
            wgmma_wait<0>();
            if (t == 0) mbar_arrive_notoken(&empty[prev]);

            // Pack now (the accumulators are needed for the next tile); store during its first k-steps.
#pragma unroll
            for (int j = 0; j < BN / 4; ++j) c.st[j] = pack_bf16x2(d[2 * j], d[2 * j + 1]);
            c.m0 = m0;
            c.n0 = n0;
            c.pending = true;
        }
        if (c.pending) flush_pieces<BN>(c, slabs, &tmC, t, consumer);
        if (t == 0) tma_store_wait_all<0>();
    }
}
