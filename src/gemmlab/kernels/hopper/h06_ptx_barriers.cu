// hopper.h06_ptx_barriers: h05 with the barriers used the way the hardware allows, not the way a
// barrier object does. Waiters no longer arrive: they wait on a phase's parity
// (mbarrier.try_wait.parity). So "full" counts only the producer's arrive.expect_tx (the TMA bytes do
// the rest), and "empty" counts one elected thread per consumer warpgroup instead of 256 threads.
// That removes 256 shared-memory atomics per stage per barrier and the 64-bit tokens.
//
// A consumer also keeps one wgmma group in flight: it issues k-step i, then waits for k-step i-1 only
// (wgmma.wait_group 1) and releases that stage, so the tensor cores never drain between k-steps.
//
// TN layout, M % 128 == 0, N % 256 == 0, K % 64 == 0.
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int QSIZE>
__global__ void __launch_bounds__(384, 1)
hopper_h06(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
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
                const int m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
                for (int kt = 0; kt < k_iters; ++kt) {
                    // Parity phase^1 of a fresh barrier counts as complete: the first lap never waits.
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
        const int row = (wg - 1) * 64;
        int s = 0, prev = 0;
        u32 phase = 0;
        float d[BN / 2];
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
            const int m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
            for (int kt = 0; kt < k_iters; ++kt) {
                mbar_wait_parity(&full[s], phase);
                wgmma_fence();
                wgmma_k64<BN>(d, sA + s * BM * BK + row * BK, sB + s * BN * BK, kt == 0);
                wgmma_commit();
                if (kt > 0) {
                    wgmma_wait<1>();  // k-step kt-1 has finished reading its stage
                    if (t == 0) mbar_arrive_notoken(&empty[prev]);
                }
                prev = s;
                if (++s == QSIZE) { s = 0; phase ^= 1; }
            }
            wgmma_wait<0>();
            if (t == 0) mbar_arrive_notoken(&empty[prev]);
            store_fragment_bf16<BN>(d, C, N, m0 + row, n0, t);
        }
    }
}
