// hopper.h05_persistent: h04 made persistent. The grid is one CTA per SM (the SM count comes from the
// device at launch, never from the source); each CTA walks tiles blockIdx.x, blockIdx.x + gridDim.x, ...
// The ring's stage counter runs on across tiles, so the producer starts loading the next tile while
// the consumers are still storing the previous one, and no CTA launch or prologue is paid per tile.
//
// Tile order is plain row-major over the (M/128) x (N/256) grid of tiles (h09 changes it).
// TN layout, M % 128 == 0, N % 256 == 0, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int QSIZE>
__global__ void __launch_bounds__(384, 1)
hopper_h05(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
           int M, int N, int K) {
    constexpr int BM = 128, BN = 256, BK = 64, CONSUMERS = 2;
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(__nv_bfloat16);
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + QSIZE * BM * BK;
    __shared__ u64 full[QSIZE], empty[QSIZE];

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int tiles_n = N / BN, num_tiles = (M / BM) * tiles_n;
    const int k_iters = K / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < QSIZE; ++s) {
            mbar_init(&full[s], 128 * CONSUMERS + 1);
            mbar_init(&empty[s], 128 * CONSUMERS + 1);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            int s = 0;
            for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
                const int m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
                for (int kt = 0; kt < k_iters; ++kt) {
                    mbar_wait_token(&empty[s], mbar_arrive(&empty[s]));
                    mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                    tma_load_2d(sA + s * BM * BK, &tmA, &full[s], kt * BK, m0);
                    tma_load_2d(sB + s * BN * BK, &tmB, &full[s], kt * BK, n0);
                    s = (s + 1 == QSIZE) ? 0 : s + 1;
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int row = (wg - 1) * 64;
        for (int s = 0; s < QSIZE; ++s) mbar_arrive(&empty[s]);
        int s = 0;
        float d[BN / 2];
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
            const int m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
            for (int kt = 0; kt < k_iters; ++kt) {
                mbar_wait_token(&full[s], mbar_arrive(&full[s]));
                wgmma_fence();
                wgmma_k64<BN>(d, sA + s * BM * BK + row * BK, sB + s * BN * BK, kt == 0);
                wgmma_commit();
                wgmma_wait<0>();
                mbar_arrive(&empty[s]);
                s = (s + 1 == QSIZE) ? 0 : s + 1;
            }
            store_fragment_bf16<BN>(d, C, N, m0 + row, n0, t);
        }
    }
}
