// stmatrix (PTX ISA "Data Movement: stmatrix"): a warp stores four 8x8 b16 matrices to shared memory.
// Lane l gives the address of row l % 8 of matrix l / 8; register i of every lane holds that lane's
// two elements of matrix i, exactly the layout of a wgmma accumulator fragment after packing to bf16.
#pragma once
#include "ptx.cuh"

__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

// .trans: each 8x8 matrix is stored transposed, so lane l's address names row l % 8 of the stored
// (transposed) matrix, i.e. column l % 8 of the fragment's matrix l / 8.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
