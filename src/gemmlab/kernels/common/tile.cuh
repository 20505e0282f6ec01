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

#include "stmatrix.cuh"

// Byte offset of element (row, col) of a 64-row slab stored as 64-column boxes in the TMA 128-byte
// swizzle: each box is 64 rows x 128 B; the 16-byte chunk c of row r sits at chunk c ^ (r % 8).
__device__ __forceinline__ u32 sw128_offset(int row, int col) {
    const int box = col / 64, chunk = (col % 64) / 8;
    return box * (64 * 128) + row * 128 + ((chunk ^ (row % 8)) * 16) + (col % 8) * 2;
}

// A 64 x N fp32 accumulator fragment -> bf16 in a swizzled shared-memory slab (for a TMA store), with
// stmatrix: one instruction per 16 x 16 piece. The swizzle sends the 8 rows of each 8x8 matrix to 8
// different 16-byte chunks, so the stores are free of bank conflicts.
// COLS columns starting at fragment column COL0 (default: all N) go to a slab COLS wide.
template <int N, int COLS = N, int COL0 = 0>
__device__ __forceinline__ void store_fragment_smem_sw128(const float (&d)[N / 2], __nv_bfloat16* slab, int t) {
    static_assert(COL0 % 16 == 0 && COLS % 64 == 0 && COL0 + COLS <= N, "whole 16-column pieces, whole boxes");
    const int warp = t / 32, lane = t % 32, m = lane / 8;
    const int row = warp * 16 + (m & 1) * 8 + lane % 8;
    const u32 base = smem_u32(slab);
#pragma unroll
    for (int j = COL0 / 8; j < (COL0 + COLS) / 8; j += 2) {
        const u32 addr = base + sw128_offset(row, 8 * (j + (m >> 1)) - COL0);
        stmatrix_x4(addr, pack_bf16x2(d[4 * j + 0], d[4 * j + 1]), pack_bf16x2(d[4 * j + 2], d[4 * j + 3]),
                    pack_bf16x2(d[4 * j + 4], d[4 * j + 5]), pack_bf16x2(d[4 * j + 6], d[4 * j + 7]));
    }
}
