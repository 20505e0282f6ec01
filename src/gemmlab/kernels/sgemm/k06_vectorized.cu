// sgemm.k06_vectorized: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k05: every memory access moves 128 bits.
// - Global: A, B and C are read and written as float4 (LDG.E.128 / STG.E.128): a quarter of the
//   load instructions and full 16-byte accesses. Ragged edges and shapes whose rows are not 16-byte
//   aligned fall back to guarded scalar accesses (vec_io.cuh), chosen once per launch.
// - Shared: the A tile is stored transposed, a_tile[k][row]. The TM values of A a thread needs at
//   one k are then contiguous, like the TN values of B, and both are read with LDS.128: TM/4 + TN/4
//   shared loads per TM*TN FFMAs (4 per 64 for 8x8, against 16 per 64 in k05).
// The transposing store scatters each float4 of A into four rows of a_tile (4 scalar STS): paid once
// per tile, against BK*(TM+TN)/4 LDS.128 per thread in the inner loop.
#include "vec_io.cuh"

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
sgemm_vectorized(int M, int N, int K, float alpha, const float* __restrict__ A,
                 const float* __restrict__ B, float beta, float* __restrict__ C) {
    using namespace sgemm_vec_io;
    constexpr int THREADS = (BM / TM) * (BN / TN);
    static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "float4 granules");
    static_assert(BM % TM == 0 && BN % TN == 0, "thread tiles must tile the block tile");
    static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0,
                  "every thread loads the same number of float4s");

    __shared__ __align__(16) float a_tile[BK * BM];  // transposed: [k][row]
    __shared__ __align__(16) float b_tile[BK * BN];  // [k][col]

    const int tid = threadIdx.x;
    const int thread_col = tid % (BN / TN);  // owns columns thread_col*TN .. +TN-1 of the block tile
    const int thread_row = tid / (BN / TN);  // owns rows thread_row*TM .. +TM-1
    const int block_row = blockIdx.y * BM;
    const int block_col = blockIdx.x * BN;
    const bool a_vec = is_vec4_friendly(A, K);
    const bool b_vec = is_vec4_friendly(B, N);
    const bool c_vec = is_vec4_friendly(C, N);

    using SplitA = TileSplit<BM, BK, THREADS>;  // A tile: BK/4 neighbouring threads per row (coalesced)
    using SplitB = TileSplit<BK, BN, THREADS>;  // B tile: neighbouring threads, neighbouring float4s
    float4 a_regs[SplitA::PASSES], b_regs[SplitB::PASSES];

    float acc[TM][TN] = {};
    float a_frag[TM], b_frag[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        // Every global load of the tile first, then every shared store: the loads are in flight
        // together instead of each waiting for the one before.
        load_tile<BM, BK, THREADS>(a_regs, A, M, K, block_row, k0, a_vec, tid);
        load_tile<BK, BN, THREADS>(b_regs, B, K, N, k0, block_col, b_vec, tid);
        // A goes in transposed: each thread scatters its 4 k-values down a column of a_tile.
#pragma unroll
        for (int p = 0; p < SplitA::PASSES; ++p) {
            const int r = SplitA::row(p, tid), k = SplitA::col(p, tid);
            a_tile[(k + 0) * BM + r] = a_regs[p].x;
            a_tile[(k + 1) * BM + r] = a_regs[p].y;
            a_tile[(k + 2) * BM + r] = a_regs[p].z;
            a_tile[(k + 3) * BM + r] = a_regs[p].w;
        }
#pragma unroll
        for (int p = 0; p < SplitB::PASSES; ++p) {
            *reinterpret_cast<float4*>(&b_tile[SplitB::row(p, tid) * BN + SplitB::col(p, tid)]) = b_regs[p];
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int m = 0; m < TM; m += 4) {
                const float4 v = *reinterpret_cast<const float4*>(&a_tile[k * BM + thread_row * TM + m]);
                a_frag[m + 0] = v.x; a_frag[m + 1] = v.y; a_frag[m + 2] = v.z; a_frag[m + 3] = v.w;
            }
#pragma unroll
            for (int n = 0; n < TN; n += 4) {
                const float4 v = *reinterpret_cast<const float4*>(&b_tile[k * BN + thread_col * TN + n]);
                b_frag[n + 0] = v.x; b_frag[n + 1] = v.y; b_frag[n + 2] = v.z; b_frag[n + 3] = v.w;
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
        const int row = block_row + thread_row * TM + m;
#pragma unroll
        for (int n = 0; n < TN; n += 4) {
            const int col = block_col + thread_col * TN + n;
            store4_epilogue(C, M, N, row, col, make_float4(acc[m][n], acc[m][n + 1], acc[m][n + 2], acc[m][n + 3]),
                            alpha, beta, c_vec);
        }
    }
}
