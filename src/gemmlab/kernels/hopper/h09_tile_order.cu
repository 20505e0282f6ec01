// hopper.h09_tile_order: h08 with the order in which clusters visit tiles chosen for L2 reuse. The
// tiles in flight at once (one cluster tile per cluster, 66 on an H200) read the A panels of their tile
// rows and the B panels of their tile columns; a compact window (grouped rows, or a Hilbert curve over
// the tile grid) touches far fewer panels than whole rows do, so more loads hit in L2.
// The order comes from Python (gemmlab.schedule) as a table of packed (m << 16 | n) cluster tiles,
// one int load per tile, so any order can be tried without recompiling.
//
// TN layout, M % 256, N % 256, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int QSIZE>
__global__ void __launch_bounds__(384, 1)
hopper_h09(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
           const __grid_constant__ CUtensorMap tmC, const int* __restrict__ order, int M, int N, int K) {
    constexpr int BM = 128, BN = 256, BK = 64, CONSUMERS = 2, CLUSTER = 2;
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(__nv_bfloat16);
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + QSIZE * BM * BK;
    __nv_bfloat16* sC = sB + QSIZE * BN * BK;  // CONSUMERS slabs of 64 x BN
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
    cluster_sync();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            int s = 0;
            u32 phase = 0;
            for (int tile = cluster_id; tile < num_tiles; tile += num_clusters) {
                const int packed = order[tile];
                const int m0 = ((packed >> 16) * CLUSTER + rank) * BM, n0 = (packed & 0xffff) * BN;
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
        const int consumer = wg - 1, row = consumer * 64;
        __nv_bfloat16* slab = sC + consumer * 64 * BN;
        int s = 0, prev = 0;
        u32 phase = 0;
        float d[BN / 2];
        for (int tile = cluster_id; tile < num_tiles; tile += num_clusters) {
            const int packed = order[tile];
            const int m0 = ((packed >> 16) * CLUSTER + rank) * BM, n0 = (packed & 0xffff) * BN;
            for (int kt = 0; kt < k_iters; ++kt) {
                mbar_wait_parity(&full[s], phase);
                wgmma_fence();
                wgmma_k64<BN>(d, sA + s * BM * BK + row * BK, sB + s * BN * BK, kt == 0);
                wgmma_commit();
                if (kt > 0) {
                    wgmma_wait<1>();
                    if (t < CLUSTER) mbar_arrive_cluster(&empty[prev], t);
                }
                prev = s;
                if (++s == QSIZE) { s = 0; phase ^= 1; }
            }
            wgmma_wait<0>();
            if (t < CLUSTER) mbar_arrive_cluster(&empty[prev], t);

            if (t == 0) tma_store_wait_read<0>();  // the previous tile's store has read the slab
            named_barrier_sync(1 + consumer, 128);
            store_fragment_smem_sw128<BN>(d, slab, t);
            fence_proxy_async_smem();  // st.shared/stmatrix writes -> visible to the TMA (async proxy)
            named_barrier_sync(1 + consumer, 128);
            if (t == 0) {
#pragma unroll
                for (int b = 0; b < BN / 64; ++b) tma_store_2d(&tmC, slab + b * 64 * 64, n0 + 64 * b, m0 + row);
                tma_store_commit();
            }
        }
        if (t == 0) tma_store_wait_all<0>();
    }
    cluster_sync();
}
