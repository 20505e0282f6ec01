// Promotion of the FP8 wgmma's partial sums into fp32 registers, and the block scales applied on the way.
// Hopper's FP8 tensor-core path adds its products into the accumulator with fewer than fp32's mantissa
// bits (DeepSeek-V3 report, "Increasing Accumulation Precision"; DeepGEMM promotes every 128 of K), so
// a sum over a deep K drifts. The kernel keeps two sets of registers: `part`, which the wgmma writes
// (restarted with scale-d = 0 after each promotion), and `acc`, plain fp32 FADDs of the promoted parts.
#pragma once
#include "fp8_traits.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

// Block scales ride the ring: per stage a slot of the tile's BM row scales of A for that k-step, then (at
// a 128-byte boundary) eight column-block scales of B from the tile's first block rounded down to a
// multiple of 4 (a TMA box's innermost coordinate must fall on 16 bytes: the H200 raised an illegal
// instruction for a box of 4 at the tile's own block), which cover the tile's SB_BLOCKS <= 4 blocks. A consumer must not load
// from global memory in its k-loop (a load in flight stalls the warpgroup at its next wgmma fence), so the
// producer thread loads the slots with two more TMA boxes per k-step on the stage's full barrier, as
// DeepGEMM does; the consumers read the slot with ld.shared. Both scale tensors are read through
// (K / 128, rows) views: MN-major, 16-byte aligned rows (the host re-lays other layouts out once per
// call); boxes past the end are zero-filled. Measured on the H200, 128 x 128 block tiles (worklog): the
// same scales copied by a producer warp's per-thread cp.async cost ~25% (A's 128) and ~10% (B's 1-3).
template <class Tr>
struct BlockScaleLoads {
    static constexpr u32 bytes = (Tr::BM + 8) * 4;
    float* slots;  // stage s: slots + s * Tr::SCALE_SLOT
    const CUtensorMap* tmSA;
    const CUtensorMap* tmSB;
    int m0, nb0;  // the tile's first row and first column block
    __device__ __forceinline__ void operator()(u64* bar, int stage, int kt) const {
        float* slot = slots + stage * Tr::SCALE_SLOT;
        tma_load_2d(slot, tmSA, bar, m0, kt);
        tma_load_2d(slot + Tr::SB_AT, tmSB, bar, nb0 & ~3, kt);
    }
};

// "ld.shared" (the slot is reached through a pointer the compiler cannot tell is shared).
__device__ __forceinline__ float ld_shared_f32(const float* p) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem_u32(p)) : "memory");
    return v;
}

// The scales one consumer thread needs for one k-block: its two fragment rows (frag_row, + 8) of each of
// its m64 blocks (`first_row`: its first row in the tile) and the tile's B blocks, from the stage's slot.
template <class Tr>
struct BlockScaleRegs {
    float top[Tr::MI], bot[Tr::MI], col[Tr::SB_BLOCKS];

    // `nb`: the tile's first column block (its scales sit at SB_AT + nb % 4 in the slot).
    __device__ __forceinline__ void read(const float* slot, int first_row, int nb, int t) {
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi) {
            top[mi] = ld_shared_f32(slot + first_row + mi * 64 + frag_row(t));
            bot[mi] = ld_shared_f32(slot + first_row + mi * 64 + frag_row(t) + 8);
        }
#pragma unroll
        for (int c = 0; c < Tr::SB_BLOCKS; ++c) col[c] = ld_shared_f32(slot + Tr::SB_AT + nb % 4 + c);
    }
};

// acc[columns C0 ..] += part (per-tensor scales: applied once, in the epilogue's alpha). `part` holds R / 2
// columns' fragments; C0 = 0 without split promotion (then the two arrays have the same size).
template <int C0 = 0, int A, int R>
__device__ __forceinline__ void promote(float (&acc)[A], const float (&part)[R]) {
    static_assert(C0 / 2 + R <= A, "the part lies inside the tile");
#pragma unroll
    for (int i = 0; i < R; ++i) acc[C0 / 2 + i] += part[i];
}

// acc[columns C0 .. C0 + PART_N) += part x sa[row] x sb[column block]. Fragment value 4j + h of the part
// sits in row frag_row (h < 2) or + 8, tile column C0 + 8j + ...: its B block is (OFF + C0 + 8j) / 128 of
// the tile's blocks, OFF being the tile's first column inside its first block (n0 % 128). OFF and C0 are
// template arguments (the caller runs one copy of its k-loop per phase: consume_block_phase), so every
// unrolled j's block is known at compile time: no compares, no selects, and `col` indexed by constants
// (a run-time index would put it in local memory).
template <class Tr, int OFF, int C0 = 0>
__device__ __forceinline__ void promote_at(float (&acc)[Tr::BN / 2], const float (&part)[Tr::PART_N / 2], float top,
                                           float bot, const float (&col)[Tr::SB_BLOCKS]) {
    static_assert(C0 % Tr::PART_N == 0 && C0 < Tr::BN, "a column part of the tile");
#pragma unroll
    for (int j = 0; j < Tr::PART_N / 8; ++j) {
        const float sb = col[(OFF + C0 + 8 * j) / 128];
        const float st = top * sb, sbot = bot * sb;
        constexpr int c = C0 / 2;
        acc[c + 4 * j + 0] = fmaf(part[4 * j + 0], st, acc[c + 4 * j + 0]);
        acc[c + 4 * j + 1] = fmaf(part[4 * j + 1], st, acc[c + 4 * j + 1]);
        acc[c + 4 * j + 2] = fmaf(part[4 * j + 2], sbot, acc[c + 4 * j + 2]);
        acc[c + 4 * j + 3] = fmaf(part[4 * j + 3], sbot, acc[c + 4 * j + 3]);
    }
}
