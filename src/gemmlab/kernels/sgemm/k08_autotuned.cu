// sgemm.k08_autotuned: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k07: nothing in the algorithm; the kernel is opened up for a search. Its shape
// (BM x BN x BK block tile, TM x TN thread tile) and MIN_BLOCKS, the number of blocks per SM that
// __launch_bounds__ asks ptxas to fit (it caps registers at 65536 / (MIN_BLOCKS * threads)), are
// template parameters; the registry lists their values and the rules that tie them together. So
// that more shapes are legal, a thread count need not divide the tile loads any more: the last
// load pass is guarded (the guard folds away when it does divide).
//
// Trade-offs the search weighs (H200: 132 SMs, 64K registers, 228 KB shared memory per SM):
// - Larger BM x BN raises arithmetic intensity (2*BM*BN*BK FLOP per (BM+BN)*BK*4 bytes staged) but
//   makes fewer blocks: 4096^2 in 128x128 tiles is 1024 blocks, 3.9 waves of 2 blocks per SM.
// - Larger TM x TN raises FFMA per shared load (TM*TN per (TM+TN)/4 LDS.128) and registers.
// - BK trades barriers per FLOP (one pair per tile) against shared memory and registers.
// - MIN_BLOCKS = 2 overlaps one block's loads and barriers with another block's FFMAs, if the
//   thread tile still fits in the capped registers without spilling.
#include "vec_io.cuh"

template <int BM, int BN, int BK, int TM, int TN, int MIN_BLOCKS>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), MIN_BLOCKS)
sgemm_autotuned(int M, int N, int K, float alpha, const float* __restrict__ A,
                const float* __restrict__ B, float beta, float* __restrict__ C) {
    using namespace sgemm_vec_io;
    constexpr int THREADS_M = BM / TM, THREADS_N = BN / TN;
    constexpr int THREADS = THREADS_M * THREADS_N;
    constexpr int SLAB_M = 4 * THREADS_M;  // rows between a thread's float4 row groups
    constexpr int SLAB_N = 4 * THREADS_N;  // columns between its float4 column groups
    constexpr int SWIZZLE_STEP = 32 / (BK / 4);  // see k07
    static_assert(TM % 4 == 0 && TN % 4 == 0, "float4 granules");
    static_assert(BK == 8 || BK == 16 || BK == 32, "the swizzle mask must be a multiple of 4 below 32");
    static_assert(BM % 32 == 0, "the swizzle permutes rows within blocks of 32");
    static_assert(THREADS % 32 == 0, "the swizzle argument counts whole warps");

    __shared__ __align__(16) float a_tile[BK * BM];  // transposed and swizzled: [k][row ^ mask(k)]
    __shared__ __align__(16) float b_tile[BK * BN];  // [k][col]

    const int tid = threadIdx.x;
    const int thread_col = tid % THREADS_N;
    const int thread_row = tid / THREADS_N;
    const int block_row = blockIdx.y * BM;
    const int block_col = blockIdx.x * BN;
    const bool a_vec = is_vec4_friendly(A, K);
    const bool b_vec = is_vec4_friendly(B, N);
    const bool c_vec = is_vec4_friendly(C, N);

    using SplitA = TileSplit<BM, BK, THREADS>;
    using SplitB = TileSplit<BK, BN, THREADS>;
    float4 a_regs[SplitA::PASSES], b_regs[SplitB::PASSES];

    float acc[TM][TN] = {};
    float a_frag[TM], b_frag[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        load_tile<BM, BK, THREADS>(a_regs, A, M, K, block_row, k0, a_vec, tid);
        load_tile<BK, BN, THREADS>(b_regs, B, K, N, k0, block_col, b_vec, tid);
#pragma unroll
        for (int p = 0; p < SplitA::PASSES; ++p) {
            if (!SplitA::owns(p, tid)) continue;
            const int r = SplitA::row(p, tid), k = SplitA::col(p, tid);
            const int swizzled_row = r ^ ((k / 4) * SWIZZLE_STEP);
            a_tile[(k + 0) * BM + swizzled_row] = a_regs[p].x;
            a_tile[(k + 1) * BM + swizzled_row] = a_regs[p].y;
            a_tile[(k + 2) * BM + swizzled_row] = a_regs[p].z;
            a_tile[(k + 3) * BM + swizzled_row] = a_regs[p].w;
        }
#pragma unroll
        for (int p = 0; p < SplitB::PASSES; ++p) {
            if (!SplitB::owns(p, tid)) continue;
            *reinterpret_cast<float4*>(&b_tile[SplitB::row(p, tid) * BN + SplitB::col(p, tid)]) = b_regs[p];
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
            const int mask = (k / 4) * SWIZZLE_STEP;
#pragma unroll
            for (int s = 0; s < TM / 4; ++s) {
                const int row = (s * SLAB_M + thread_row * 4) ^ mask;
                const float4 v = *reinterpret_cast<const float4*>(&a_tile[k * BM + row]);
                a_frag[4 * s + 0] = v.x; a_frag[4 * s + 1] = v.y; a_frag[4 * s + 2] = v.z; a_frag[4 * s + 3] = v.w;
            }
#pragma unroll
            for (int s = 0; s < TN / 4; ++s) {
                const float4 v = *reinterpret_cast<const float4*>(&b_tile[k * BN + s * SLAB_N + thread_col * 4]);
                b_frag[4 * s + 0] = v.x; b_frag[4 * s + 1] = v.y; b_frag[4 * s + 2] = v.z; b_frag[4 * s + 3] = v.w;
            }
#pragma unroll
            for (int m = 0; m < TM; ++m)
#pragma unroll
                for (int n = 0; n < TN; ++n) acc[m][n] += a_frag[m] * b_frag[n];
        }
        __syncthreads();  // the next iteration overwrites the tiles
    }

#pragma unroll
    for (int m = 0; m < TM; ++m) {
        const int row = block_row + (m / 4) * SLAB_M + thread_row * 4 + m % 4;
#pragma unroll
        for (int n = 0; n < TN; n += 4) {
            const int col = block_col + (n / 4) * SLAB_N + thread_col * 4;
            store4_epilogue(C, M, N, row, col, make_float4(acc[m][n], acc[m][n + 1], acc[m][n + 2], acc[m][n + 3]),
                            alpha, beta, c_vec);
        }
    }
}
