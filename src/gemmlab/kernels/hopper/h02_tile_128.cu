// hopper.h02_tile_128: h01 with a 128-row tile. The one warpgroup now issues two wgmma m64nBNk16 per
// k16 step (rows 0-63 and 64-127) against the same B slab, so each byte of B brought into shared
// memory feeds twice the math, and each barrier round trip covers twice the work.
//
// TN layout, M % 128 == 0, N % BN == 0, K % 64 == 0. Still one stage: no overlap of load and compute.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int BN>
__global__ void __launch_bounds__(128)
hopper_h02(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
           int M, int N, int K) {
    constexpr int BM = 128, BK = 64;
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + BM * BK;
    __shared__ u64 full;

    const int t = threadIdx.x;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    if (t == 0) {
        mbar_init(&full, 128);
        fence_mbarrier_init();
    }
    __syncthreads();

    float d0[BN / 2], d1[BN / 2];  // rows 0-63 and 64-127 of the tile
    for (int kt = 0; kt < K / BK; ++kt) {
        u64 token;
        if (t == 0) {
            token = mbar_arrive_expect_tx(&full, (BM + BN) * BK * sizeof(__nv_bfloat16));
            tma_load_2d(sA, &tmA, &full, kt * BK, m0);
            tma_load_2d(sB, &tmB, &full, kt * BK, n0);
        } else {
            token = mbar_arrive(&full);
        }
        mbar_wait_token(&full, token);
        wgmma_fence();
        wgmma_k64<BN>(d0, sA, sB, kt == 0);
        wgmma_k64<BN>(d1, sA + 64 * BK, sB, kt == 0);
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();
    }
    store_fragment_bf16<BN>(d0, C, N, m0, n0, t);
    store_fragment_bf16<BN>(d1, C, N, m0 + 64, n0, t);
}
