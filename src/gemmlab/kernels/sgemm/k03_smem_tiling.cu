// sgemm.k03_smem_tiling: C = alpha * A @ B + beta * C, fp32 row-major (A MxK, B KxN, C MxN), any M, N, K.
//
// What changes over k02: the block stages a TILE x TILE tile of A and one of B in shared memory
// and every thread reads its operands from there. In k02 each element of A and B is fetched from
// global memory (L1/L2 at best) once per thread that uses it, i.e. TILE times per block; here it is
// fetched once per block and then read TILE times from shared memory. Still one result per thread,
// so each FFMA needs two shared loads: shared-memory bandwidth is the next limit (k04 fixes that).

template <int TILE>
__global__ void __launch_bounds__(TILE * TILE)
sgemm_smem_tiling(int M, int N, int K, float alpha, const float* __restrict__ A,
                  const float* __restrict__ B, float beta, float* __restrict__ C) {
    __shared__ float a_tile[TILE][TILE];  // [row of C][k]
    __shared__ float b_tile[TILE][TILE];  // [k][col of C]

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;

    // Threads outside C keep going: they still load their share of the tiles and reach every barrier.
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // Zero fill past the edges, so the partial last tile adds nothing. Both loads are coalesced:
        // tx walks k for A and columns for B.
        const int ka = k0 + tx, kb = k0 + ty;
        a_tile[ty][tx] = (row < M && ka < K) ? A[(size_t)row * K + ka] : 0.0f;
        b_tile[ty][tx] = (kb < K && col < N) ? B[(size_t)kb * N + col] : 0.0f;
        __syncthreads();
        // a_tile[ty][k] is one address per warp (a broadcast); b_tile[k][tx] is 32 consecutive banks.
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            acc += a_tile[ty][k] * b_tile[k][tx];
        }
        __syncthreads();  // the next iteration overwrites the tiles
    }
    if (row < M && col < N) {
        const size_t idx = (size_t)row * N + col;
        // beta == 0 must not read C (it may hold NaN).
        C[idx] = beta == 0.0f ? alpha * acc : alpha * acc + beta * C[idx];
    }
}
