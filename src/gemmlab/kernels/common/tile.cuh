// Pieces of the Hopper steps that are not PTX wrappers: smem alignment, the plain register epilogue.
#pragma once
#include "ptx.cuh"
#include "wgmma.cuh"

// Dynamic shared memory is only 16-byte aligned; 128B-swizzled TMA tiles need 1024.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(p) + 1023) & ~size_t(1023));
}

// Write a 64 x N fp32 accumulator fragment (one warpgroup, thread t = threadIdx.x % 128) to C as bf16,
// straight from registers: each thread stores 4-byte pairs, 4 threads cover 16 contiguous bytes.
template <int N>
__device__ __forceinline__ void store_fragment_bf16(const float (&d)[N / 2], __nv_bfloat16* C, int ldc, int row0,
                                                    int col0, int t) {
    const int r = row0 + frag_row(t);
    const int c = col0 + frag_col(t);
    u32* top = reinterpret_cast<u32*>(C + (size_t)r * ldc + c);
    u32* bot = reinterpret_cast<u32*>(C + (size_t)(r + 8) * ldc + c);
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        top[4 * j] = pack_bf16x2(d[4 * j + 0], d[4 * j + 1]);
        bot[4 * j] = pack_bf16x2(d[4 * j + 2], d[4 * j + 3]);
    }
}
