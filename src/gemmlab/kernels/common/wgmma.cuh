// wgmma support: shared-memory matrix descriptors and the fence / commit / wait that bracket
// asynchronous warpgroup MMAs (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate").
#pragma once
#include "ptx.cuh"
#include "wgmma_ops.cuh"

// Matrix descriptor for a K-major tile written by TMA with 128-byte swizzle
// (PTX ISA "Matrix Descriptor Format"): rows of 64 bf16 = 128 B, swizzled in 8-row atoms of 1024 B.
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4 (not used by swizzled K-major layouts; 1 by convention)
//   bits 32-45  stride-dimension byte offset >> 4: 1024 B from one 8-row atom to the next
//   bits 62-63  swizzle mode, 1 = 128 B
// The tile must start 1024-byte aligned (base-offset field 0). Stepping k by 16 elements inside the
// 128-byte row moves the start address by 32 B: the hardware applies the swizzle to the final address.
__device__ __forceinline__ u64 desc_sw128(const void* smem) {
    const u64 addr = smem_u32(smem);
    return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// "wgmma.fence": order register/shared accesses before the first wgmma of a group.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// "wgmma.commit_group": close the group of wgmmas issued so far.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

// "wgmma.wait_group N": wait until at most N groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keep the compiler from moving accumulator reads/writes across the asynchronous MMA.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One BK = 64 slab (four k16 steps) of a 64 x N x 64 MMA: A rows from `a`, B rows (N of them) from `b`,
// both 128B-swizzled K-major tiles. `first` zeroes the accumulators on the first k16 step.
template <int N>
__device__ __forceinline__ void wgmma_k64(float (&d)[N / 2], const __nv_bfloat16* a, const __nv_bfloat16* b,
                                          bool first) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        Wgmma<N, __nv_bfloat16>::mma(d, desc_sw128(a + 16 * k), desc_sw128(b + 16 * k), (first && k == 0) ? 0 : 1);
    }
}

// Accumulator fragment layout of m64nNk16 (fp32): thread t of the warpgroup holds, for each 8-column
// block j, d[4j+0..1] at (row, 8j + c .. +1) and d[4j+2..3] at (row + 8, same columns), where
// row = 16 * (t / 32) + (t % 32) / 4 and c = 2 * (t % 4).
__device__ __forceinline__ int frag_row(int t) { return 16 * (t / 32) + (t % 32) / 4; }
__device__ __forceinline__ int frag_col(int t) { return 2 * (t % 4); }
