// hopper.h04_two_consumers: a 128 x 256 tile shared by two consumer warpgroups (64 x 256 each, one
// wgmma m64n256k16 per k16 step, 128 fp32 accumulators per thread), fed by one producer warpgroup.
// The wider tile halves the A traffic per FLOP again, and n256 is the largest (most efficient) wgmma.
// With 384 threads the compiler may give each at most 168 registers; `setmaxnreg` moves registers from
// the producer (which needs almost none) to the consumers, which hold the accumulators.
//
// Barriers are still token style: "full" and "empty" count 1 + 256 arrivals.
// TN layout, M % 128 == 0, N % 256 == 0, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int QSIZE>
__global__ void __launch_bounds__(384, 1)
hopper_h04(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
           int M, int N, int K) {
    constexpr int BM = 128, BN = 256, BK = 64, CONSUMERS = 2;
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
            mbar_init(&full[s], 128 * CONSUMERS + 1);
            mbar_init(&empty[s], 128 * CONSUMERS + 1);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) {  // producer: 40 registers are plenty for address math
        setmaxnreg_dec<40>();
        if (t == 0) {
            for (int kt = 0; kt < k_iters; ++kt) {
                const int s = kt % QSIZE;
                mbar_wait_token(&empty[s], mbar_arrive(&empty[s]));
                mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                tma_load_2d(sA + s * BM * BK, &tmA, &full[s], kt * BK, m0);
                tma_load_2d(sB + s * BN * BK, &tmB, &full[s], kt * BK, n0);
            }
        }
    } else {  // consumers: 232 registers each (2 x 128 x 232 + 128 x 40 <= 64K)
        setmaxnreg_inc<232>();
        const int row = (wg - 1) * 64;  // this consumer's 64 rows of the tile
        for (int s = 0; s < QSIZE; ++s) mbar_arrive(&empty[s]);
        float d[BN / 2];
        for (int kt = 0; kt < k_iters; ++kt) {
            const int s = kt % QSIZE;
            mbar_wait_token(&full[s], mbar_arrive(&full[s]));
            wgmma_fence();
            wgmma_k64<BN>(d, sA + s * BM * BK + row * BK, sB + s * BN * BK, kt == 0);
            wgmma_commit();
            wgmma_wait<0>();
            mbar_arrive(&empty[s]);
        }
        store_fragment_bf16<BN>(d, C, N, m0 + row, n0, t);
    }
}
