// sgemm.k04_blocktile_1d: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k03: each thread computes TM results stacked in one column of C instead of one.
// Per k it reads one value of B from shared memory, keeps it in a register and reuses it for TM
// FFMAs against TM values of A (those are warp-wide broadcasts, see below). Shared loads per FFMA
// drop from 2 to (1 + TM) / TM, and the block tile becomes BM x BN with BM*BN/TM threads, so the
// tiles are no longer square thread grids: BK (the k-depth of a tile) is chosen on its own.

template <int BM, int BN, int BK, int TM>
__global__ void __launch_bounds__((BM / TM) * BN)
sgemm_blocktile_1d(int M, int N, int K, float alpha, const float* __restrict__ A,
                   const float* __restrict__ B, float beta, float* __restrict__ C) {
    constexpr int THREADS = (BM / TM) * BN;
    static_assert(BM % TM == 0, "TM must divide BM");
    static_assert((BM * BK) % THREADS == 0 && (BK * BN) % THREADS == 0,
                  "every thread loads the same number of tile elements");
    static_assert(BN % 32 == 0, "a warp must share one thread-row (A reads are then broadcasts)");

    __shared__ float a_tile[BM * BK];  // [row][k]
    __shared__ float b_tile[BK * BN];  // [k][col]

    const int tid = threadIdx.x;
    const int thread_col = tid % BN;  // the column of C this thread owns
    const int thread_row = tid / BN;  // it owns rows thread_row*TM .. +TM-1 of the block tile
    const int block_row = blockIdx.y * BM;
    const int block_col = blockIdx.x * BN;

    float acc[TM] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        // Consecutive threads take consecutive elements: along k for A (BK*4 contiguous bytes per
        // row), along columns for B. Zero fill past M, N and K.
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
            const float b = b_tile[k * BN + thread_col];
            // All 32 threads of a warp share thread_row (BN >= 32), so this is a broadcast.
#pragma unroll
            for (int m = 0; m < TM; ++m) {
                acc[m] += a_tile[(thread_row * TM + m) * BK + k] * b;
            }
        }
        __syncthreads();  // the next iteration overwrites the tiles
    }

    const int col = block_col + thread_col;
    if (col >= N) return;
#pragma unroll
    for (int m = 0; m < TM; ++m) {
        const int row = block_row + thread_row * TM + m;
        if (row < M) {
            const size_t idx = (size_t)row * N + col;
            // beta == 0 must not read C (it may hold NaN).
            C[idx] = beta == 0.0f ? alpha * acc[m] : alpha * acc[m] + beta * C[idx];
        }
    }
}
