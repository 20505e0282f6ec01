// hopper.h10_deep_pipeline: h09 with a deeper ring and a choice of tile width. h08/h09 gave 64 KB to
// the C slabs and so ran three stages; here each consumer stores its 64 x BN tile as 64-column pieces
// through two 8 KB slabs used in turn (a piece waits only until the TMA has read the piece before the
// previous one), which leaves room for four stages (4 x 48 KB + 32 KB = 224 KB at BN = 256).
// BN = 192 or 128 trades a little per-tile efficiency for better wave quantization (3072^3: 288 tiles
// of 128 x 256 fill 2.2 waves of 132 SMs; 384 tiles of 128 x 192 fill 2.9).
// CLUSTER = 1 drops the multicast (every CTA loads its whole B slab and no stage couples two SMs);
// CLUSTER = 2 keeps it, so both can be measured on the same code.
//
// TN layout, M % (128 * CLUSTER) == 0, N % BN == 0, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"


// Store the fragment's columns [COL0, BN) as 64-column pieces through two 8 KB slabs used in turn: a
// piece only waits for the TMA to have read the piece before the previous one (wait_group.read 1).
template <int COL0, int BN>
__device__ __forceinline__ void store_pieces_impl(const float (&d)[BN / 2], __nv_bfloat16* slabs,
                                                  const CUtensorMap* tmC, int n0, int m0, int t, int consumer) {
    if constexpr (COL0 < BN) {
        __nv_bfloat16* slab = slabs + ((COL0 / 64) % 2) * 64 * 64;
        // The slab was last read by the store two pieces back; at a tile's first piece with an odd
        // number of pieces (BN = 192) that is the newest store of the previous tile: wait for all.
        if (t == 0) {
            if constexpr (COL0 == 0) tma_store_wait_read<0>(); else tma_store_wait_read<1>();
        }
        named_barrier_sync(1 + consumer, 128);
        store_fragment_smem_sw128<BN, 64, COL0>(d, slab, t);
        fence_proxy_async_smem();  // stmatrix writes -> visible to the TMA (async proxy)
        named_barrier_sync(1 + consumer, 128);
        if (t == 0) {
            tma_store_2d(tmC, slab, n0 + COL0, m0);
            tma_store_commit();
        }
        store_pieces_impl<COL0 + 64, BN>(d, slabs, tmC, n0, m0, t, consumer);
    }
}

template <int QSIZE, int CLUSTER, int BN>
__global__ void __launch_bounds__(384, 1)
hopper_h10(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
           const __grid_constant__ CUtensorMap tmC, const int* __restrict__ order, int M, int N, int K) {
    constexpr int BM = 128, BK = 64, CONSUMERS = 2, PIECE = 64, SLABS = 2;
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(__nv_bfloat16);
    static_assert(CLUSTER == 1 || CLUSTER == 2, "pairs of CTAs at most");
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + QSIZE * BM * BK;
    __nv_bfloat16* sC = sB + QSIZE * BN * BK;  // CONSUMERS x SLABS slabs of 64 x PIECE
    __shared__ u64 full[QSIZE], empty[QSIZE];

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const u32 rank = CLUSTER > 1 ? cluster_ctarank() : 0;
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
    if constexpr (CLUSTER > 1) cluster_sync(); else __syncthreads();

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
                    if constexpr (CLUSTER > 1) {
                        tma_load_2d_multicast(sB + s * BN * BK + rank * (BN / 2) * BK, &tmB, &full[s], kt * BK,
                                              n0 + rank * (BN / 2), (1 << CLUSTER) - 1);
                    } else {
                        tma_load_2d(sB + s * BN * BK, &tmB, &full[s], kt * BK, n0);
                    }
                    if (++s == QSIZE) { s = 0; phase ^= 1; }
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int consumer = wg - 1, row = consumer * 64;
        __nv_bfloat16* slab = sC + consumer * SLABS * 64 * PIECE;
        int s = 0, prev = 0;
        u32 phase = 0;
        float d[BN / 2];
        auto release = [&](int stage) {
            if constexpr (CLUSTER > 1) {
                if (t < CLUSTER) mbar_arrive_cluster(&empty[stage], t);
            } else {
                if (t == 0) mbar_arrive_notoken(&empty[stage]);
            }
        };
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
                    release(prev);
                }
                prev = s;
                if (++s == QSIZE) { s = 0; phase ^= 1; }
            }
            wgmma_wait<0>();
            release(prev);

            // Piece by piece through one slab: wait for the TMA to have read it, fill it, fence, store.
            store_pieces_impl<0, BN>(d, slab, &tmC, n0, m0 + row, t, consumer);
        }
        if (t == 0) tma_store_wait_all<0>();
    }
    if constexpr (CLUSTER > 1) cluster_sync();
}
