// Promotion of the FP8 wgmma's partial sums into fp32 registers, and the block scales applied on the way.
// Hopper's FP8 tensor-core path adds its products into the accumulator with fewer than fp32's mantissa
// bits (DeepSeek-V3 report, "Increasing Accumulation Precision"; DeepGEMM promotes every 128 of K), so
// a sum over a deep K drifts. The kernel keeps two sets of registers: `part`, which the wgmma writes
// (restarted with scale-d = 0 after each promotion), and `acc`, plain fp32 FADDs of the promoted parts.
#pragma once
#include "fp8_traits.cuh"
#include "wgmma.cuh"

// Where the scales live. Per-tensor: a[0] and b[0]. Block: A's scale of row m, k-block kb at
// a[m * a_row + kb * a_col] (torch's (M, K / 128) row-major: a_row = K / 128, a_col = 1; DeepGEMM's
// MN-major (K / 128, M) also works), B's of column block nb at b[nb * b_row + kb * b_col].
struct Fp8Scales {
    const float* a;
    long long a_row, a_col;
    const float* b;
    long long b_row, b_col;
    int M, n_blocks;  // rows of A, ceil(N / 128)
};

// Block scales ride the ring. A consumer must not have a global load in flight at its next wgmma fence:
// the fence waits for it (measured on the H200: 128 x 128 block at ~750 TFLOP/s with the scales loaded
// into registers two k-steps ahead, ~480 with the consumers' own cp.async into shared memory, ~1130 with
// the same promotion on constant scales). So a producer warp (the producer warpgroup's second) copies
// each k-step's scales into that stage's slot with cp.async, and the stage's full barrier also waits for
// its 32 lanes' copies (cp.async.mbarrier.arrive.noinc); the consumers read the slot with ld.shared.
// Slot: the tile's BM row scales (rows past M: row M - 1, never stored), then its SB_BLOCKS B scales.

// "cp.async" (PTX ISA, non-bulk): 4 bytes from global into shared memory.
__device__ __forceinline__ void cp_async4(float* smem, const float* g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(smem)), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// "ld.shared" (the slot is reached through a pointer the compiler cannot tell is shared).
__device__ __forceinline__ float ld_shared_f32(const float* p) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem_u32(p)) : "memory");
    return v;
}

// Scale warp, lane `lane`: start the copies of k-block kb's scales of the tile at (m0, n0) into `slot`.
template <class Tr>
__device__ __forceinline__ void fetch_block_scales(float* slot, const Fp8Scales& s, int m0, int n0, int kb, int lane) {
#pragma unroll 1  // the producer warpgroup runs on 40 registers (setmaxnreg)
    for (int r = lane; r < Tr::BM; r += 32) cp_async4(slot + r, s.a + min(m0 + r, s.M - 1) * s.a_row + kb * s.a_col);
    if (lane < Tr::SB_BLOCKS)
        cp_async4(slot + Tr::BM + lane, s.b + min(n0 / 128 + lane, s.n_blocks - 1) * s.b_row + kb * s.b_col);
}

// The scales one consumer thread needs for one k-block: its two fragment rows (frag_row, + 8) of each of
// its m64 blocks (`first_row`: its first row in the tile) and the tile's B blocks, from the stage's slot.
template <class Tr>
struct BlockScaleRegs {
    float top[Tr::MI], bot[Tr::MI], col[Tr::SB_BLOCKS];

    __device__ __forceinline__ void read(const float* slot, int first_row, int t) {
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi) {
            top[mi] = ld_shared_f32(slot + first_row + mi * 64 + frag_row(t));
            bot[mi] = ld_shared_f32(slot + first_row + mi * 64 + frag_row(t) + 8);
        }
#pragma unroll
        for (int c = 0; c < Tr::SB_BLOCKS; ++c) col[c] = ld_shared_f32(slot + Tr::BM + c);
    }
};

// acc += part (per-tensor scales: applied once, in the epilogue's alpha).
template <int R>
__device__ __forceinline__ void promote(float (&acc)[R], const float (&part)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] += part[i];
}

// acc += part x sa[row] x sb[column block]. Fragment value 4j + h sits in row frag_row (h < 2) or + 8,
// column n0 + 8j + ...: its B block is the tile's first (n0 / 128) plus (n0 % 128 + 8j) / 128, picked by
// compares against the unrolled j (a register array indexed at run time would go to local memory).
template <class Tr>
__device__ __forceinline__ void promote_scaled(float (&acc)[Tr::BN / 2], const float (&part)[Tr::BN / 2],
                                               float top, float bot, const float (&col)[Tr::SB_BLOCKS], int n0) {
    const int off = Tr::SB_ALIGNED ? 0 : n0 % 128;
#pragma unroll
    for (int j = 0; j < Tr::BN / 8; ++j) {
        float sb = col[0];
        if constexpr (Tr::SB_ALIGNED) {
            sb = col[j / 16];
        } else {
#pragma unroll
            for (int c = 1; c < Tr::SB_BLOCKS; ++c) sb = off + 8 * j >= 128 * c ? col[c] : sb;
        }
        const float st = top * sb, sbot = bot * sb;
        acc[4 * j + 0] = fmaf(part[4 * j + 0], st, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], st, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], sbot, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], sbot, acc[4 * j + 3]);
    }
}
