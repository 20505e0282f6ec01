// hopper.h07_cluster_multicast: CTAs run in clusters of two that take vertically adjacent tiles
// (256 rows x 256 columns together) and so need the same B slab. Each CTA loads its own A slab and half
// of the B slab, and the TMA multicasts that half into both CTAs' shared memory: B traffic from L2
// halves. A CTA's stage can only be refilled when both CTAs' consumers are done with it, so every
// consumer releases the stage in both CTAs ("empty" counts 2 consumers x 2 CTAs), through
// mbarrier arrives on the peer's shared memory (mapa + shared::cluster).
//
// Persistent as h05/h06, over cluster tiles in row-major order. TN layout, M % 256, N % 256, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int QSIZE>
__global__ void __launch_bounds__(384, 1)
hopper_h07(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
           int M, int N, int K) {
    constexpr int BM = 128, BN = 256, BK = 64, CONSUMERS = 2, CLUSTER = 2;
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(__nv_bfloat16);  // A + both B halves land here
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + QSIZE * BM * BK;
    __shared__ u64 full[QSIZE], empty[QSIZE];

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const u32 rank = cluster_ctarank();
    const int cluster_id = blockIdx.x / CLUSTER, num_clusters = gridDim.x / CLUSTER;
    const int tiles_n = N / BN, num_tiles = (M / (BM * CLUSTER)) * tiles_n;
    const int k_iters = K / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < QSIZE; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMERS * CLUSTER);
        }
        fence_mbarrier_init();
    }
    cluster_sync();  // the peer's barriers exist before any multicast or remote arrive reaches them

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            int s = 0;
            u32 phase = 0;
            for (int tile = cluster_id; tile < num_tiles; tile += num_clusters) {
                const int m0 = ((tile / tiles_n) * CLUSTER + rank) * BM, n0 = (tile % tiles_n) * BN;
                for (int kt = 0; kt < k_iters; ++kt) {
                    mbar_wait_parity(&empty[s], phase ^ 1);
                    mbar_expect_tx(&full[s], STAGE_BYTES);
                    tma_load_2d(sA + s * BM * BK, &tmA, &full[s], kt * BK, m0);
                    tma_load_2d_multicast(sB + s * BN * BK + rank * (BN / 2) * BK, &tmB, &full[s], kt * BK,
                                          n0 + rank * (BN / 2), (1 << CLUSTER) - 1);
                    if (++s == QSIZE) { s = 0; phase ^= 1; }
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int row = (wg - 1) * 64;
        int s = 0, prev = 0;
        u32 phase = 0;
        float d[BN / 2];
        for (int tile = cluster_id; tile < num_tiles; tile += num_clusters) {
            const int m0 = ((tile / tiles_n) * CLUSTER + rank) * BM, n0 = (tile % tiles_n) * BN;
            for (int kt = 0; kt < k_iters; ++kt) {
                mbar_wait_parity(&full[s], phase);
                wgmma_fence();
                wgmma_k64<BN>(d, sA + s * BM * BK + row * BK, sB + s * BN * BK, kt == 0);
                wgmma_commit();
                if (kt > 0) {
                    wgmma_wait<1>();
                    if (t < CLUSTER) mbar_arrive_cluster(&empty[prev], t);  // thread c releases CTA c's stage
                }
                prev = s;
                if (++s == QSIZE) { s = 0; phase ^= 1; }
            }
            wgmma_wait<0>();
            if (t < CLUSTER) mbar_arrive_cluster(&empty[prev], t);
            store_fragment_bf16<BN>(d, C, N, m0 + row, n0, t);
        }
    }
    cluster_sync();  // no CTA leaves while its peer may still multicast into it or arrive on its barriers
}
