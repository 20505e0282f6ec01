// Promotion of the FP8 wgmma's partial sums into fp32 registers, and the block scales applied on the way.
// Hopper's FP8 tensor-core path adds its products into the accumulator with fewer than fp32's mantissa
// bits (DeepSeek-V3 report, "Increasing Accumulation Precision"; DeepGEMM promotes every 128 of K), so
// a sum over a deep K drifts. The kernel keeps two sets of registers: `part`, which the wgmma writes
// (restarted with scale-d = 0 after each promotion), and `acc`, plain fp32 FADDs of the promoted parts.
#pragma once
#include "fp8_traits.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

// Block scales ride the ring: per stage a slot of the tile's BM row scales of A for that k-step, then its
// SB_BLOCKS column-block scales of B. A consumer must not load from global memory in its k-loop (a load
// in flight stalls the warpgroup at its next wgmma fence), so the producer warpgroup's second warp fills
// the slots and the stage's full barrier waits for them; the consumers read the slot with ld.shared.
// Measured on the H200, 128 x 128 block tiles (worklog): A's 128 row scales copied with per-thread
// cp.async cost ~25% of the kernel's throughput (contiguous addresses as much as strided ones); one TMA
// load of the same 512 bytes is what DeepGEMM does. So A's scales come by TMA, from a (K / 128, M) fp32
// view (MN-major: a k-block's scales of consecutive rows are adjacent, 16-byte aligned rows; the host
// re-lays other layouts out once per call), rows past M zero-filled. B's (at most three per k-step) come
// by cp.async, one per lane, each lane's arrival deferred until its copy landed.
struct Fp8ScalesB {
    const float* b;  // B's scale of column block nb, k-block kb: b[nb * b_row + kb * b_col]
    long long b_row, b_col;
    int n_blocks;  // ceil(N / 128)
};

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

// Scale warp, lane `lane` < SB_BLOCKS, once the slot is free: k-block kb's scales of the tile at (m0, n0)
// into `slot`, completing on `full` (whose count has one arrival per such lane plus lane 0's expect_tx).
template <class Tr>
__device__ __forceinline__ void fetch_block_scales(float* slot, u64* full, const CUtensorMap* tmSA,
                                                   const Fp8ScalesB& s, int m0, int n0, int kb, int lane) {
    if (lane == 0) {
        mbar_expect_tx(full, Tr::BM * 4);
        tma_load_2d(slot, tmSA, full, m0, kb);
    }
    cp_async4(slot + Tr::BM + lane, s.b + min(n0 / 128 + lane, s.n_blocks - 1) * s.b_row + kb * s.b_col);
    mbar_arrive_after_cp_async(full);
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
