// Edge-safe 128-bit global access for the vectorized sgemm steps (k06 on).
//
// A float4 access needs its 16 bytes in bounds and 16-byte aligned. For a row-major matrix with
// `cols` columns whose base pointer is 16-byte aligned, every access at a column that is a multiple
// of 4 is aligned exactly when `cols % 4 == 0`; the kernels compute that once per launch
// (`vec_ok`, the same for every thread, so the branch never diverges) and fall back to guarded
// scalar accesses at ragged edges or on unaligned shapes.
#pragma once

namespace sgemm_vec_io {

__device__ __forceinline__ bool is_vec4_friendly(const void* base, int cols) {
    return (cols & 3) == 0 && (reinterpret_cast<size_t>(base) & 15) == 0;
}

// mat[row][col .. col+3] of a rows x cols row-major matrix, with zeros where it lies outside.
__device__ __forceinline__ float4 load4_or_zero(const float* __restrict__ mat, int rows, int cols, int row,
                                                int col, bool vec_ok) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row >= rows) return v;
    const float* p = mat + (size_t)row * cols + col;
    if (vec_ok && col + 3 < cols) return *reinterpret_cast<const float4*>(p);
    if (col + 0 < cols) v.x = p[0];
    if (col + 1 < cols) v.y = p[1];
    if (col + 2 < cols) v.z = p[2];
    if (col + 3 < cols) v.w = p[3];
    return v;
}

// C[row][col .. col+3] = alpha * acc + beta * C for the elements inside the M x N matrix.
// With beta == 0 C is never read: it may hold NaN, and 0 * NaN is NaN.
__device__ __forceinline__ void store4_epilogue(float* __restrict__ C, int M, int N, int row, int col,
                                                float4 acc, float alpha, float beta, bool vec_ok) {
    if (row >= M) return;
    float* p = C + (size_t)row * N + col;
    if (vec_ok && col + 3 < N) {
        float4 out = make_float4(alpha * acc.x, alpha * acc.y, alpha * acc.z, alpha * acc.w);
        if (beta != 0.0f) {
            const float4 old = *reinterpret_cast<const float4*>(p);
            out.x += beta * old.x;
            out.y += beta * old.y;
            out.z += beta * old.z;
            out.w += beta * old.w;
        }
        *reinterpret_cast<float4*>(p) = out;
        return;
    }
    const float v[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (col + j < N) p[j] = beta == 0.0f ? alpha * v[j] : alpha * v[j] + beta * p[j];
    }
}

// The float4s of a ROWS x COLS tile, numbered row-major (COLS/4 per row), are dealt to THREADS
// threads round-robin: float4 i goes to thread i % THREADS as its pass i / THREADS. These give
// the tile coordinates of a thread's pass and the number of passes.
template <int ROWS, int COLS, int THREADS>
struct TileSplit {
    // An enum, not static constexpr members: NVRTC would emit those as (unused) global variables.
    enum : int { VECS = ROWS * COLS / 4, PASSES = (VECS + THREADS - 1) / THREADS };
    static_assert(COLS % 4 == 0, "tile rows are whole float4s");
    // False only for the idle threads of a last, partial pass (folds to true when THREADS | VECS).
    __device__ static bool owns(int pass, int tid) { return VECS % THREADS == 0 || pass * THREADS + tid < VECS; }
    __device__ static int row(int pass, int tid) { return (pass * THREADS + tid) / (COLS / 4); }
    __device__ static int col(int pass, int tid) { return (pass * THREADS + tid) % (COLS / 4) * 4; }
};

// Load this thread's float4s of the tile at (row0, col0) of a rows x cols row-major matrix into
// registers, zeros outside the matrix. All loads are issued before any is used, so they are in
// flight together. A tile wholly inside an aligned matrix (the common case) takes the unguarded
// branch: plain LDG.128, no per-element tests; the branch is the same for the whole block.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile(float4 (&regs)[TileSplit<ROWS, COLS, THREADS>::PASSES],
                                          const float* __restrict__ mat, int rows, int cols, int row0,
                                          int col0, bool vec_ok, int tid) {
    using S = TileSplit<ROWS, COLS, THREADS>;
    if (vec_ok && row0 + ROWS <= rows && col0 + COLS <= cols) {
#pragma unroll
        for (int p = 0; p < S::PASSES; ++p) {
            if (S::owns(p, tid)) {
                regs[p] = *reinterpret_cast<const float4*>(mat + (size_t)(row0 + S::row(p, tid)) * cols + col0 +
                                                           S::col(p, tid));
            }
        }
    } else {
#pragma unroll
        for (int p = 0; p < S::PASSES; ++p) {
            if (S::owns(p, tid)) {
                regs[p] = load4_or_zero(mat, rows, cols, row0 + S::row(p, tid), col0 + S::col(p, tid), vec_ok);
            }
        }
    }
}

}  // namespace sgemm_vec_io
