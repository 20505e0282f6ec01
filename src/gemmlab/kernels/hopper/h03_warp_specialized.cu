// hopper.h03_warp_specialized: a producer warpgroup and a consumer warpgroup around a QSIZE-stage ring.
// One thread of the producer only issues TMA loads; the consumer only issues wgmma. Each stage has a
// "full" barrier (data landed) and an "empty" barrier (consumer done reading), so loads for k-steps
// ahead are in flight while the tensor cores work on the current one.
//
// Barriers are used token style, the way a library barrier object is: every thread that waits has
// arrived first, so "full" counts 1 producer + 128 consumer arrivals and "empty" 128 + 1.
//
// TN layout, tile 128 x BN (the consumer issues two m64 wgmmas per k16), M % 128, N % BN, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int BN, int QSIZE>
__global__ void __launch_bounds__(256)
hopper_h03(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
           int M, int N, int K) {
    constexpr int BM = 128, BK = 64;
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(__nv_bfloat16);
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + QSIZE * BM * BK;
    __shared__ u64 full[QSIZE], empty[QSIZE];

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_iters = K / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < QSIZE; ++s) {
            mbar_init(&full[s], 128 + 1);
            mbar_init(&empty[s], 128 + 1);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) {  // producer
        if (t == 0) {
            for (int kt = 0; kt < k_iters; ++kt) {
                const int s = kt % QSIZE;
                mbar_wait_token(&empty[s], mbar_arrive(&empty[s]));
                mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                tma_load_2d(sA + s * BM * BK, &tmA, &full[s], kt * BK, m0);
                tma_load_2d(sB + s * BN * BK, &tmB, &full[s], kt * BK, n0);
            }
        }
    } else {  // consumer
        for (int s = 0; s < QSIZE; ++s) mbar_arrive(&empty[s]);  // every stage starts free
        float d0[BN / 2], d1[BN / 2];
        for (int kt = 0; kt < k_iters; ++kt) {
            const int s = kt % QSIZE;
            mbar_wait_token(&full[s], mbar_arrive(&full[s]));
            const __nv_bfloat16* a = sA + s * BM * BK;
            const __nv_bfloat16* b = sB + s * BN * BK;
            wgmma_fence();
            wgmma_k64<BN>(d0, a, b, kt == 0);
            wgmma_k64<BN>(d1, a + 64 * BK, b, kt == 0);
            wgmma_commit();
            wgmma_wait<0>();
            mbar_arrive(&empty[s]);
        }
        store_fragment_bf16<BN>(d0, C, N, m0, n0, t);
        store_fragment_bf16<BN>(d1, C, N, m0 + 64, n0, t);
    }
}
