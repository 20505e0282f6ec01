// sgemm.k05_blocktile_2d: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k04: each thread computes a TM x TN sub-tile of C. Per k it loads TM values of A
// and TN values of B from shared memory into registers and forms their outer product: TM*TN FFMAs
// for TM+TN shared loads (8x8: 64 FFMA per 16 loads, against 8 per 9 in k04). The matrix product
// is the sum over k of these rank-1 updates. The accumulators live in registers (TM*TN of them),
// which is what the unrolled loops make possible: every index into acc[][] is a compile-time constant.

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
sgemm_blocktile_2d(int M, int N, int K, float alpha, const float* __restrict__ A,
                   const float* __restrict__ B, float beta, float* __restrict__ C) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    static_assert(BM % TM == 0 && BN % TN == 0, "thread tiles must tile the block tile");
    static_assert((BM * BK) % THREADS == 0 && (BK * BN) % THREADS == 0,
                  "every thread loads the same number of tile elements");

    __shared__ float a_tile[BM * BK];  // [row][k]
    __shared__ float b_tile[BK * BN];  // [k][col]

    const int tid = threadIdx.x;
    const int thread_col = tid % (BN / TN);  // owns columns thread_col*TN .. +TN-1 of the block tile
    const int thread_row = tid / (BN / TN);  // owns rows thread_row*TM .. +TM-1
    const int block_row = blockIdx.y * BM;
    const int block_col = blockIdx.x * BN;

    float acc[TM][TN] = {};
    float a_frag[TM], b_frag[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        // Same coalesced, zero-filled loads as k04.
#pragma unroll
        for (int pass = 0; pass < BM * BK / THREADS; ++pass) {
            const int i = pass * THREADS + tid;
            const int r = i / BK, k = i % BK;
            const int gr = block_row + r, gk = k0 + k;
            a_tile[i] = (gr < M && gk < K) ? A[(size_t)gr * K + gk] : 0.0f;
        }
#pragma unroll
        for (int pass = 0; pass < BK * BN / THREADS; ++pass) {
            const int i = pass * THREADS + tid;
            const int k = i / BN, c = i % BN;
            const int gk = k0 + k, gc = block_col + c;
            b_tile[i] = (gk < K && gc < N) ? B[(size_t)gk * N + gc] : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int m = 0; m < TM; ++m) a_frag[m] = a_tile[(thread_row * TM + m) * BK + k];
#pragma unroll
            for (int n = 0; n < TN; ++n) b_frag[n] = b_tile[k * BN + thread_col * TN + n];
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
        for (int n = 0; n < TN; ++n) {
            const int col = block_col + thread_col * TN + n;
            if (row < M && col < N) {
                const size_t idx = (size_t)row * N + col;
                // beta == 0 must not read C (it may hold NaN).
                C[idx] = beta == 0.0f ? alpha * acc[m][n] : alpha * acc[m][n] + beta * C[idx];
            }
        }
    }
}
