// sgemm.k10_double_buffered: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k09: the next tiles are fetched while the current ones are multiplied.
// In k09 every k-tile runs load -> wait -> store to shared memory -> barrier -> FFMAs -> barrier,
// so a block's FFMA units idle for a full global-memory latency per tile unless another block on
// the SM happens to be in its FFMA phase. Here shared memory holds two stages of the A and B tiles:
// at the top of iteration t the global loads of tile t+1 are issued into registers, the FFMAs of
// tile t run from stage t%2 while those loads are in flight, and then the registers are written to
// the other stage. One barrier per tile suffices: the stage written in iteration t was last read in
// iteration t-1, which every thread finished before the barrier that closed it.
// Cost: twice the shared memory and the registers that hold one tile in flight (k09 held them
// only briefly, outside the FFMA phase).
#include "vec_io.cuh"

template <int BM, int BN, int BK, int WM, int WN, int MIN_BLOCKS>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MIN_BLOCKS)
sgemm_double_buffered(int M, int N, int K, float alpha, const float* __restrict__ A,
                      const float* __restrict__ B, float beta, float* __restrict__ C) {
    using namespace sgemm_vec_io;
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int LANES_N = 8;                           // lanes across a sub-tile's columns
    constexpr int SUB_M = 4 * (32 / LANES_N);            // 16 rows per sub-tile
    constexpr int SUB_N = 4 * LANES_N;                   // 32 columns per sub-tile
    constexpr int ITER_M = WM / SUB_M, ITER_N = WN / SUB_N;  // sub-tiles per warp tile
    constexpr int SWIZZLE_STEP = 32 / (BK / 4);          // see k07
    static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must tile the block tile");
    static_assert(WM % SUB_M == 0 && WN % SUB_N == 0, "sub-tiles must tile the warp tile");
    static_assert(BK == 8 || BK == 16 || BK == 32, "the swizzle mask must be a multiple of 4 below 32");
    static_assert(BM % 32 == 0, "the swizzle permutes rows within blocks of 32");

    __shared__ __align__(16) float a_tile[2][BK * BM];  // per stage: transposed and swizzled, [k][row ^ mask(k)]
    __shared__ __align__(16) float b_tile[2][BK * BN];  // per stage: [k][col]

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int warp_row0 = (warp / WARPS_N) * WM;  // the warp tile's corner in the block tile
    const int warp_col0 = (warp % WARPS_N) * WN;
    const int lane_row = lane / LANES_N, lane_col = lane % LANES_N;
    const int block_row = blockIdx.y * BM;
    const int block_col = blockIdx.x * BN;
    const bool a_vec = is_vec4_friendly(A, K);
    const bool b_vec = is_vec4_friendly(B, N);
    const bool c_vec = is_vec4_friendly(C, N);

    using SplitA = TileSplit<BM, BK, THREADS>;
    using SplitB = TileSplit<BK, BN, THREADS>;
    float4 a_regs[SplitA::PASSES], b_regs[SplitB::PASSES];  // the tiles in flight

    auto fetch = [&](int k0) {
        load_tile<BM, BK, THREADS>(a_regs, A, M, K, block_row, k0, a_vec, tid);
        load_tile<BK, BN, THREADS>(b_regs, B, K, N, k0, block_col, b_vec, tid);
    };
    auto stage = [&](int buf) {
#pragma unroll
        for (int p = 0; p < SplitA::PASSES; ++p) {
            if (!SplitA::owns(p, tid)) continue;
            const int r = SplitA::row(p, tid), k = SplitA::col(p, tid);
            const int swizzled_row = r ^ ((k / 4) * SWIZZLE_STEP);
            a_tile[buf][(k + 0) * BM + swizzled_row] = a_regs[p].x;
            a_tile[buf][(k + 1) * BM + swizzled_row] = a_regs[p].y;
            a_tile[buf][(k + 2) * BM + swizzled_row] = a_regs[p].z;
            a_tile[buf][(k + 3) * BM + swizzled_row] = a_regs[p].w;
        }
#pragma unroll
        for (int p = 0; p < SplitB::PASSES; ++p) {
            if (!SplitB::owns(p, tid)) continue;
            *reinterpret_cast<float4*>(&b_tile[buf][SplitB::row(p, tid) * BN + SplitB::col(p, tid)]) = b_regs[p];
        }
    };

    // acc[4*im + i][4*in + j]: row warp_row0 + im*SUB_M + lane_row*4 + i,
    //                          col warp_col0 + in*SUB_N + lane_col*4 + j of the block tile.
    float acc[ITER_M * 4][ITER_N * 4] = {};
    float a_frag[ITER_M * 4], b_frag[ITER_N * 4];
    const int num_tiles = (K + BK - 1) / BK;
    fetch(0);
    stage(0);
    __syncthreads();
    for (int t = 0; t < num_tiles; ++t) {
        const int cur = t & 1;
        const bool has_next = t + 1 < num_tiles;
        if (has_next) fetch((t + 1) * BK);  // lands in registers while the FFMAs below run

        const float* a_cur = a_tile[cur];
        const float* b_cur = b_tile[cur];
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            const int mask = (k / 4) * SWIZZLE_STEP;
#pragma unroll
            for (int im = 0; im < ITER_M; ++im) {
                const int row = (warp_row0 + im * SUB_M + lane_row * 4) ^ mask;
                const float4 v = *reinterpret_cast<const float4*>(&a_cur[k * BM + row]);
                a_frag[4 * im + 0] = v.x; a_frag[4 * im + 1] = v.y; a_frag[4 * im + 2] = v.z; a_frag[4 * im + 3] = v.w;
            }
#pragma unroll
            for (int in = 0; in < ITER_N; ++in) {
                const int col = warp_col0 + in * SUB_N + lane_col * 4;
                const float4 v = *reinterpret_cast<const float4*>(&b_cur[k * BN + col]);
                b_frag[4 * in + 0] = v.x; b_frag[4 * in + 1] = v.y; b_frag[4 * in + 2] = v.z; b_frag[4 * in + 3] = v.w;
            }
#pragma unroll
            for (int m = 0; m < ITER_M * 4; ++m)
#pragma unroll
                for (int n = 0; n < ITER_N * 4; ++n) acc[m][n] += a_frag[m] * b_frag[n];
        }

        if (has_next) stage(cur ^ 1);  // that stage was last read in iteration t-1
        __syncthreads();  // stage cur^1 is complete for everyone; stage cur may be overwritten next
    }

#pragma unroll
    for (int m = 0; m < ITER_M * 4; ++m) {
        const int row = block_row + warp_row0 + (m / 4) * SUB_M + lane_row * 4 + m % 4;
#pragma unroll
        for (int n = 0; n < ITER_N * 4; n += 4) {
            const int col = block_col + warp_col0 + (n / 4) * SUB_N + lane_col * 4;
            store4_epilogue(C, M, N, row, col, make_float4(acc[m][n], acc[m][n + 1], acc[m][n + 2], acc[m][n + 3]),
                            alpha, beta, c_vec);
        }
    }
}
