// hopper.h01_tma_wgmma: the smallest Hopper GEMM. One warpgroup (128 threads) per 64 x BN tile of C.
// Each k-step thread 0 asks the TMA unit for a 64x64 slab of A and a BNx64 slab of B, landing in
// 128B-swizzled shared memory and completing on an mbarrier; then the warpgroup issues four
// wgmma m64nBNk16 reading both operands straight from shared memory.
//
// TN layout: A (M,K) row-major, B (N,K) row-major (an nn.Linear weight), C = A @ B^T (M,N) bf16.
// M % 64 == 0, N % BN == 0, K % 64 == 0. One stage: load, then compute, then load again (no overlap).
#include "common/mbarrier.cuh"
#include "common/tile.cuh"
#include "common/tma.cuh"

template <int BN>
__global__ void __launch_bounds__(128)
hopper_h01(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, __nv_bfloat16* C,
           int M, int N, int K) {
    constexpr int BM = 64, BK = 64;
    extern __shared__ unsigned char smem_raw[];
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(align_1024(smem_raw));
    __nv_bfloat16* sB = sA + BM * BK;
    __shared__ u64 full;

    const int t = threadIdx.x;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    if (t == 0) {
        // Token style: all 128 threads arrive each phase (thread 0's arrival carries the tx count).
        mbar_init(&full, 128);
        fence_mbarrier_init();
    }
    __syncthreads();

    float d[BN / 2];
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
        wgmma_k64<BN>(d, sA, sB, kt == 0);
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();  // every wgmma has read sA/sB before thread 0 overwrites them
    }
    store_fragment_bf16<BN>(d, C, N, m0, n0, t);
}
