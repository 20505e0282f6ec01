// sgemm.k01_naive: one thread computes one element of C = alpha * A @ B + beta * C.
// A is MxK, B is KxN, C is MxN, all fp32 row-major. Any M, N, K.
//
// threadIdx.x walks the rows of C, so the 32 threads of a warp read 32 different rows of A
// (32 separate 128-byte lines per load) and write C with a stride of N floats: uncoalesced on
// purpose, which is what k02 fixes.

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK * BLOCK)
sgemm_naive(int M, int N, int K, float alpha, const float* __restrict__ A,
            const float* __restrict__ B, float beta, float* __restrict__ C) {
    const int row = blockIdx.x * BLOCK + threadIdx.x;
    const int col = blockIdx.y * BLOCK + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
    }
    const size_t idx = (size_t)row * N + col;
    // beta == 0 must not read C: C may hold NaN (it is poisoned in the tests) and 0 * NaN is NaN.
    C[idx] = beta == 0.0f ? alpha * acc : alpha * acc + beta * C[idx];
}
