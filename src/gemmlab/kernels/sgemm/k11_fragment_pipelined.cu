// sgemm.k11_fragment_pipelined: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k10: the register fragments are double-buffered too, and the k loop may be rolled.
// 1. Fragments. In k10 the A and B fragments of step k are read from shared memory in step k, so
//    ptxas can only hoist those LDS a few dozen instructions above their FFMAs (it has no registers
//    left for more), and across the tile boundary not at all: after the barrier every warp of the
//    block starts the next tile with six LDS.128 and waits for them. Here step k multiplies fragment
//    buffer k%2 while the LDS of step k+1 fill the other one, and the tile boundary moves into the
//    last k step (CUTLASS's order): stage the prefetched tile, barrier, load step 0's fragments of
//    the new stage, and only then run the last step's FFMAs, which cover that load's latency.
//    Still one barrier per tile: a stage is written at the end of the tile after the one that last
//    read it, and every read of a tile's stage (its steps 1..BK-1 are loaded during that tile)
//    happens before the barrier that ends it.
// 2. K_UNROLL. k10 unrolls all BK steps: 128 FFMA per step and warp, so 1024 (BK=8) or 2048 (BK=16)
//    FFMAs, 16-32 KB of code, walked once per tile. If the per-scheduler instruction cache is of the
//    order of Volta's 12 KB L0 (Jia et al. 2018, arXiv:1804.06826; Hopper's is not published), each
//    tile refetches its whole body. K_UNROLL < BK keeps a body of K_UNROLL steps that loops
//    BK / K_UNROLL times per tile; the fragment double buffer carries the loads across its back edge,
//    which ptxas could not do by itself.
// Cost: 24 more fragment registers live through the FFMAs (k10 reloaded in place).
#include "vec_io.cuh"

template <int BM, int BN, int BK, int WM, int WN, int MIN_BLOCKS, int K_UNROLL>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MIN_BLOCKS)
sgemm_fragment_pipelined(int M, int N, int K, float alpha, const float* __restrict__ A,
                         const float* __restrict__ B, float beta, float* __restrict__ C) {
    using namespace sgemm_vec_io;
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int LANES_N = 8;                           // lanes across a sub-tile's columns
    constexpr int SUB_M = 4 * (32 / LANES_N);            // 16 rows per sub-tile
    constexpr int SUB_N = 4 * LANES_N;                   // 32 columns per sub-tile
    constexpr int ITER_M = WM / SUB_M, ITER_N = WN / SUB_N;  // sub-tiles per warp tile
    constexpr int FRAG_M = ITER_M * 4, FRAG_N = ITER_N * 4;  // a thread's fragment lengths
    constexpr int SWIZZLE_STEP = 32 / (BK / 4);          // see k07
    static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must tile the block tile");
    static_assert(WM % SUB_M == 0 && WN % SUB_N == 0, "sub-tiles must tile the warp tile");
    static_assert(BK == 8 || BK == 16 || BK == 32, "the swizzle mask must be a multiple of 4 below 32");
    static_assert(BM % 32 == 0, "the swizzle permutes rows within blocks of 32");
    static_assert(K_UNROLL % 4 == 0 && BK % K_UNROLL == 0,
                  "a rolled trip holds whole swizzle groups of 4 steps (and an even count: buffer = step % 2)");

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
    float acc[FRAG_M][FRAG_N] = {};
    float a_frag[2][FRAG_M], b_frag[2][FRAG_N];  // [step % 2]: one multiplied, one being loaded
    // Step k0 + dk's fragments from stage s into buffer f. The A tile's swizzle mask changes every 4
    // steps; k0 is a multiple of 4 and dk a compile-time constant, so in a rolled loop the mask costs
    // one XOR per row and trip, and dk * BM, dk * BN fold into the LDS offsets.
    auto load_frags = [&](int f, int s, int k0, int dk) {
        const int k = k0 + dk;
        const int mask = (k0 / 4 + dk / 4) * SWIZZLE_STEP;
#pragma unroll
        for (int im = 0; im < ITER_M; ++im) {
            const int row = (warp_row0 + im * SUB_M + lane_row * 4) ^ mask;
            const float4 v = *reinterpret_cast<const float4*>(&a_tile[s][k * BM + row]);
            a_frag[f][4 * im + 0] = v.x; a_frag[f][4 * im + 1] = v.y; a_frag[f][4 * im + 2] = v.z; a_frag[f][4 * im + 3] = v.w;
        }
#pragma unroll
        for (int in = 0; in < ITER_N; ++in) {
            const int col = warp_col0 + in * SUB_N + lane_col * 4;
            const float4 v = *reinterpret_cast<const float4*>(&b_tile[s][k * BN + col]);
            b_frag[f][4 * in + 0] = v.x; b_frag[f][4 * in + 1] = v.y; b_frag[f][4 * in + 2] = v.z; b_frag[f][4 * in + 3] = v.w;
        }
    };

    const int num_tiles = (K + BK - 1) / BK;
    fetch(0);
    stage(0);
    __syncthreads();
    load_frags(0, 0, 0, 0);
    for (int t = 0; t < num_tiles; ++t) {
        const int cur = t & 1;
        const bool has_next = t + 1 < num_tiles;
        if (has_next) fetch((t + 1) * BK);  // lands in registers while the FFMAs below run

        // BK / K_UNROLL trips (one when K_UNROLL == BK); steps inside a trip are unrolled, so the
        // fragment buffer u % 2 is known at compile time.
#pragma unroll 1
        for (int k0 = 0; k0 < BK; k0 += K_UNROLL) {
#pragma unroll
            for (int u = 0; u < K_UNROLL; ++u) {
                const int f = u % 2;
                if (u == K_UNROLL - 1 && k0 == BK - K_UNROLL) {
                    // the tile's last step: its fragments are in registers, so the stage it read is free
                    if (has_next) stage(cur ^ 1);  // that stage was last read in tile t-1
                    __syncthreads();  // stage cur^1 is complete for everyone; stage cur may be overwritten next
                    if (has_next) load_frags(f ^ 1, cur ^ 1, 0, 0);
                } else {
                    load_frags(f ^ 1, cur, k0, u + 1);
                }
#pragma unroll
                for (int m = 0; m < FRAG_M; ++m)
#pragma unroll
                    for (int n = 0; n < FRAG_N; ++n) acc[m][n] += a_frag[f][m] * b_frag[f][n];
            }
        }
    }

#pragma unroll
    for (int m = 0; m < FRAG_M; ++m) {
        const int row = block_row + warp_row0 + (m / 4) * SUB_M + lane_row * 4 + m % 4;
#pragma unroll
        for (int n = 0; n < FRAG_N; n += 4) {
            const int col = block_col + warp_col0 + (n / 4) * SUB_N + lane_col * 4;
            store4_epilogue(C, M, N, row, col, make_float4(acc[m][n], acc[m][n + 1], acc[m][n + 2], acc[m][n + 3]),
                            alpha, beta, c_vec);
        }
    }
}
