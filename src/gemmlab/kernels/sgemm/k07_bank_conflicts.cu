// sgemm.k07_bank_conflicts: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k06: no shared-memory bank conflicts. Shared memory has 32 banks of 4 bytes; a
// warp's access takes as many passes ("wavefronts") as the most distinct addresses that fall in one
// bank. k06 had two conflicts (numbers for its 128x128x8 tile, 8x8 per thread, 256 threads):
//
// 1. The transposing store of A. BK/4 neighbouring lanes load one row of the tile (one k-quad
//    each), so a warp covers 128/BK rows r and all BK/4 quads q, and stores a_tile[q*4 + j][r].
//    BM is a multiple of 32, so the bank is r % 32 whatever q is: the BK/4 lanes of a row hit one
//    bank (2-way for BK=8, 4-way for BK=16).
//    Fix: an XOR swizzle of the row index, a_tile[k][r ^ ((k/4) * 128/BK)]. Each quad moves its
//    rows to its own 128/BK-bank group, so the store is conflict-free. The mask is a multiple of 4
//    below 32: float4 groups stay whole and aligned (LDS.128 still works) and rows stay in their
//    32-row block. Why not padding: a_tile rows of BM+4 floats separate two quads (BK=8) but not four
//    (quad q lands on bank offset 16q mod 32), and a pad that does separate four (BM+2) breaks the
//    16-byte alignment of the rows that LDS.128 needs. The swizzle costs no memory and no
//    alignment; its price is one XOR per shared address, folded into constants by the unrolled loop.
//
// 2. The LDS.128 reads of B. A thread read its TN = 8 columns as two float4 at 32-byte stride, so
//    lanes t and t+4 of a quarter-warp hit the same 4 banks: 2-way.
//    Fix: a thread's TN columns are TN/4 groups of 4, one in each of TN/4 column slabs of width
//    4*(BN/TN). Neighbouring lanes now read neighbouring float4s: the minimum number of wavefronts.
//    Rows use the same slab layout, which keeps the A reads (a broadcast of a few addresses) free
//    of conflicts also for narrow thread layouts, and the C stores of a warp become 16 lanes x 16 B
//    contiguous per row instead of 32-byte pieces.
// Padding does not help 2: the conflict is between columns of one row of b_tile, not between rows.
#include "vec_io.cuh"

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
sgemm_bank_conflicts(int M, int N, int K, float alpha, const float* __restrict__ A,
                     const float* __restrict__ B, float beta, float* __restrict__ C) {
    using namespace sgemm_vec_io;
    constexpr int THREADS_M = BM / TM, THREADS_N = BN / TN;
    constexpr int THREADS = THREADS_M * THREADS_N;
    constexpr int SLAB_M = 4 * THREADS_M;  // rows between a thread's float4 row groups
    constexpr int SLAB_N = 4 * THREADS_N;  // columns between its float4 column groups
    // A warp's A-tile store covers 32 / (BK/4) rows; quad q of the k-slab is XORed onto bank group q.
    constexpr int SWIZZLE_STEP = 32 / (BK / 4);
    static_assert(TM % 4 == 0 && TN % 4 == 0, "float4 granules");
    static_assert(BK == 8 || BK == 16 || BK == 32, "the swizzle mask must be a multiple of 4 below 32");
    static_assert(BM % 32 == 0, "the swizzle permutes rows within blocks of 32");
    static_assert(THREADS % 32 == 0, "the swizzle argument counts whole warps");
    static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0,
                  "every thread loads the same number of float4s");

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
            const int r = SplitA::row(p, tid), k = SplitA::col(p, tid);
            const int swizzled_row = r ^ ((k / 4) * SWIZZLE_STEP);
            a_tile[(k + 0) * BM + swizzled_row] = a_regs[p].x;
            a_tile[(k + 1) * BM + swizzled_row] = a_regs[p].y;
            a_tile[(k + 2) * BM + swizzled_row] = a_regs[p].z;
            a_tile[(k + 3) * BM + swizzled_row] = a_regs[p].w;
        }
#pragma unroll
        for (int p = 0; p < SplitB::PASSES; ++p) {
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

    // acc[m][n] belongs to row slab m/4, row m%4 in it, and column slab n/4, column n%4 in it.
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
