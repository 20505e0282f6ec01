// sgemm.k09_warptiling: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k08: a level of tiling between the block and the thread. The block tile
// (BM x BN) is split into warp tiles (WM x WN), one per warp, and each warp tile is swept by the
// warp in sub-tiles of 16 x 32: the 32 lanes sit as 4 rows x 8 columns, each lane owning a 4 x 4
// piece of every sub-tile. A lane thus computes (WM/16) x (WN/32) pieces of 4 x 4.
// - Each warp reads a compact WM x WN footprint of the shared tiles: per k, WM + WN floats for
//   WM*WN FMAs (k08's thread layout spread a warp's reads over the whole block tile). Per lane
//   and k: WM/16 + WN/32 LDS.128, each a single conflict-free wavefront (4 or 8 neighbouring float4s).
// - Warps never share an output element and the sub-tile loops have compile-time trip counts, so
//   all accumulators stay in registers and the k-loop unrolls into one straight run of FFMAs.
// The staging of the tiles (float4 global loads, transposed and XOR-swizzled A tile) is k08's.
#include "vec_io.cuh"

template <int BM, int BN, int BK, int WM, int WN, int MIN_BLOCKS>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, MIN_BLOCKS)
sgemm_warptiling(int M, int N, int K, float alpha, const float* __restrict__ A,
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

    __shared__ __align__(16) float a_tile[BK * BM];  // transposed and swizzled: [k][row ^ mask(k)]
    __shared__ __align__(16) float b_tile[BK * BN];  // [k][col]

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
    float4 a_regs[SplitA::PASSES], b_regs[SplitB::PASSES];

    // acc[4*im + i][4*in + j]: row warp_row0 + im*SUB_M + lane_row*4 + i,
    //                          col warp_col0 + in*SUB_N + lane_col*4 + j of the block tile.
    float acc[ITER_M * 4][ITER_N * 4] = {};
    float a_frag[ITER_M * 4], b_frag[ITER_N * 4];
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
            for (int im = 0; im < ITER_M; ++im) {
                const int row = (warp_row0 + im * SUB_M + lane_row * 4) ^ mask;
                const float4 v = *reinterpret_cast<const float4*>(&a_tile[k * BM + row]);
                a_frag[4 * im + 0] = v.x; a_frag[4 * im + 1] = v.y; a_frag[4 * im + 2] = v.z; a_frag[4 * im + 3] = v.w;
            }
#pragma unroll
            for (int in = 0; in < ITER_N; ++in) {
                const int col = warp_col0 + in * SUB_N + lane_col * 4;
                const float4 v = *reinterpret_cast<const float4*>(&b_tile[k * BN + col]);
                b_frag[4 * in + 0] = v.x; b_frag[4 * in + 1] = v.y; b_frag[4 * in + 2] = v.z; b_frag[4 * in + 3] = v.w;
            }
#pragma unroll
            for (int m = 0; m < ITER_M * 4; ++m)
#pragma unroll
                for (int n = 0; n < ITER_N * 4; ++n) acc[m][n] += a_frag[m] * b_frag[n];
        }
        __syncthreads();  // the next iteration overwrites the tiles
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
