// The consumers' side of the FP8 k-loop (the producer is mainloop.cuh's produce_unit: the same TMA loads,
// 128-byte rows of 128 e4m3 values). Per k-step of 128: four k32 wgmmas per m64 block into a partial
// sum; at a promotion point the consumer waits for its wgmmas, frees the slots and adds the partial into
// `acc`: per-tensor scales every PROMOTE k-steps (and at the unit's last), with one wgmma group in flight
// in between as in the bf16 loop (wgmma.wait_group 1); block scales every k-step, scaled by that
// k-block's scales, in one copy of the k-loop per column phase (consume_block_phase). With
// split promotion (Tr::PART_SPLIT = 2) the partial sum covers half the tile's columns: per k-step the
// wgmmas of columns [0, BN / 2), wait, promote them, then those of [BN / 2, BN), wait, promote.
#pragma once
#include "fp8_promote.cuh"
#include "pipeline.cuh"
#include "wgmma.cuh"
#include "wgmma_fp8_ops.cuh"

// One k-step's wgmmas from ring slot `stage` for column part H (tile columns H x PART_N ..): four k32 steps
// per m64 block of this consumer into `part` (`restart`: the first overwrites it, scale-d = 0). B's tile
// is BN rows of 128 bytes, 128-byte swizzled in atoms of 8 rows (1024 bytes): part H starts H x PART_N
// rows (a multiple of 8) in, so its descriptor is the same swizzle from a later start address.
template <class Tr, int H = 0>
__device__ __forceinline__ void issue_kstep_fp8(const unsigned char* sA, const unsigned char* sB, int stage,
                                                int consumer, float (&part)[Tr::MI][Tr::PART_N / 2], bool restart) {
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    static_assert(H * Tr::PART_N * BK % 1024 == 0, "a part starts on a swizzle atom");
    const unsigned char* a = sA + stage * BM * BK + consumer * Tr::MI * 64 * BK;
    const unsigned char* b = sB + stage * BN * BK + H * Tr::PART_N * BK;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // k32 steps: 32 bytes along the swizzled row
        const u64 db = desc_sw128(b + 32 * k);
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi)
            WgmmaFp8<Tr::PART_N>::mma(part[mi], desc_sw128(a + mi * 64 * BK + 32 * k), db,
                                      (restart && k == 0) ? 0 : 1);
    }
    wgmma_commit();
}

// Column part H of one block-scaled k-step from ring slot `stage`: its wgmmas, wait, acc += part x the
// k-step's scales `sc` (the slot is freed after the last part's wait). During part 0's wgmmas the next
// k-step's slot is awaited and its scales read into `next` (one k-step ahead: no shared-memory load is in
// flight at a wgmma fence; a load read just before the fence cost ~10%: worklog). Every warp reads a slot
// before its wgmmas on that slot, and the slot is freed only once those wgmmas completed, so no warp can
// still be reading it. (Template functions, not generic lambdas: NVRTC 13.0 takes a generic lambda in
// device code for a host function.)
template <class Tr, int OFF, int H>
__device__ __forceinline__ void block_scaled_part(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                  const unsigned char* sB, int consumer, int t, int stage, bool more,
                                                  float (&acc)[Tr::MI][Tr::BN / 2],
                                                  float (&part)[Tr::MI][Tr::PART_N / 2], const float* s_scales,
                                                  int first_row, int nb, const BlockScaleRegs<Tr>& sc,
                                                  BlockScaleRegs<Tr>& next) {
    issue_kstep_fp8<Tr, H>(sA, sB, stage, consumer, part, true);
    if constexpr (H == 0) {
        cur.template advance<Tr::STAGES>();
        if (more) {
            ring.wait_full(cur);
            next.read(s_scales + cur.stage * Tr::SCALE_SLOT, first_row, nb, t);
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) fence_regs(part[mi]);  // no read of part before the wait
    if (H + 1 == Tr::PART_SPLIT && t == 0) ring.release(stage);
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi)
        promote_at<Tr, OFF, H * Tr::PART_N>(acc[mi], part[mi], sc.top[mi], sc.bot[mi], sc.col);
}

// Block scales, the tile's first column at OFF inside its first B block (fp8_promote.cuh): every k-step
// each column part (one without split promotion) as above.
template <class Tr, int OFF>
__device__ __forceinline__ void consume_block_scaled(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                     const unsigned char* sB, int consumer, int t,
                                                     float (&acc)[Tr::MI][Tr::BN / 2],
                                                     float (&part)[Tr::MI][Tr::PART_N / 2], int k_begin, int k_end,
                                                     const float* s_scales, int nb, int sa_row) {
    static_assert(Tr::PART_SPLIT == 1 || Tr::PART_SPLIT == 2, "one or two column parts");
    const int first_row = sa_row + consumer * Tr::MI * 64;
    ring.wait_full(cur);
    BlockScaleRegs<Tr> sc;
    sc.read(s_scales + cur.stage * Tr::SCALE_SLOT, first_row, nb, t);
    for (int kt = k_begin; kt < k_end; ++kt) {
        const int stage = cur.stage;
        BlockScaleRegs<Tr> next = sc;
        block_scaled_part<Tr, OFF, 0>(ring, cur, sA, sB, consumer, t, stage, kt + 1 < k_end, acc, part, s_scales,
                                      first_row, nb, sc, next);
        if constexpr (Tr::PART_SPLIT == 2)
            block_scaled_part<Tr, OFF, 1>(ring, cur, sA, sB, consumer, t, stage, kt + 1 < k_end, acc, part, s_scales,
                                          first_row, nb, sc, next);
        sc = next;
    }
}

// One phase of the tile's columns against B's 128-column blocks per copy of the block-scaled k-loop:
// OFF = n0 % 128 is one of Tr::SB_PHASES multiples of SB_STEP (a tile of width BN starts at a multiple of
// gcd(BN, 128) inside its first B block: 0 / 64 for 192, 0 / 96 / 64 / 32 for 224). Widths that never
// straddle at a varying column (SB_ALIGNED) have one copy. The branch runs once per work unit, outside
// the k-loop.
template <class Tr, int P = 0>
__device__ __forceinline__ void consume_block_phase(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                    const unsigned char* sB, int consumer, int t,
                                                    float (&acc)[Tr::MI][Tr::BN / 2],
                                                    float (&part)[Tr::MI][Tr::PART_N / 2], int k_begin, int k_end,
                                                    const float* s_scales, int n0, int nb, int sa_row) {
    if constexpr (Tr::SB_ALIGNED || P + 1 == Tr::SB_PHASES) {
        consume_block_scaled<Tr, Tr::SB_ALIGNED ? 0 : P * Tr::SB_STEP>(ring, cur, sA, sB, consumer, t, acc, part,
                                                                      k_begin, k_end, s_scales, nb, sa_row);
    } else if (n0 % 128 == P * Tr::SB_STEP) {
        consume_block_scaled<Tr, P * Tr::SB_STEP>(ring, cur, sA, sB, consumer, t, acc, part, k_begin, k_end, s_scales,
                                                  nb, sa_row);
    } else {
        consume_block_phase<Tr, P + 1>(ring, cur, sA, sB, consumer, t, acc, part, k_begin, k_end, s_scales, n0, nb,
                                       sa_row);
    }
}

// Column part H of a per-tensor k-step with split promotion: its wgmmas, wait, promote (the slot freed
// after the last part's wait).
template <class Tr, int H>
__device__ __forceinline__ void split_tensor_part(Ring<Tr::STAGES>& ring, const unsigned char* sA,
                                                  const unsigned char* sB, int consumer, int t, int stage,
                                                  float (&acc)[Tr::MI][Tr::BN / 2],
                                                  float (&part)[Tr::MI][Tr::PART_N / 2]) {
    issue_kstep_fp8<Tr, H>(sA, sB, stage, consumer, part, true);
    wgmma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) fence_regs(part[mi]);  // no read of part before the wait
    if (H + 1 == Tr::PART_SPLIT && t == 0) ring.release(stage);
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) promote<H * Tr::PART_N>(acc[mi], part[mi]);
}

// Per-tensor scales with split promotion: every k-step, each column part.
template <class Tr>
__device__ __forceinline__ void consume_split_tensor(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                     const unsigned char* sB, int consumer, int t,
                                                     float (&acc)[Tr::MI][Tr::BN / 2],
                                                     float (&part)[Tr::MI][Tr::PART_N / 2], int k_begin, int k_end) {
    static_assert(Tr::PART_SPLIT == 2, "two column parts");
    for (int kt = k_begin; kt < k_end; ++kt) {
        ring.wait_full(cur);
        const int stage = cur.stage;
        split_tensor_part<Tr, 0>(ring, sA, sB, consumer, t, stage, acc, part);
        split_tensor_part<Tr, 1>(ring, sA, sB, consumer, t, stage, acc, part);
        cur.template advance<Tr::STAGES>();
    }
}

template <class Tr>
__device__ __forceinline__ void consume_unit_fp8(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                 const unsigned char* sB, int consumer, int t,
                                                 float (&acc)[Tr::MI][Tr::BN / 2],
                                                 float (&part)[Tr::MI][Tr::PART_N / 2], int k_begin, int k_end,
                                                 const float* s_scales, int n0, int sb_block = -1,
                                                 int sa_row = 0) {
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi)
#pragma unroll
        for (int i = 0; i < Tr::BN / 2; ++i) acc[mi][i] = 0.0f;
    if constexpr (Tr::SCALE == SCALE_BLOCK) {
        // One copy of the k-loop per phase of the tile's columns against B's 128-column blocks. The tile's
        // first column block in the slot's numbering: that of B's scale view (grouped: the expert's blocks
        // follow the ones before it, sb_block = g x blocks per expert + n0 / 128); its first row's place in
        // the slot (grouped: the row box starts at a multiple of 4 rows, sa_row < 4).
        const int nb = sb_block >= 0 ? sb_block : n0 / 128;
        consume_block_phase<Tr>(ring, cur, sA, sB, consumer, t, acc, part, k_begin, k_end, s_scales, n0, nb, sa_row);
        return;
    }
    if constexpr (Tr::PART_SPLIT > 1) {
        consume_split_tensor<Tr>(ring, cur, sA, sB, consumer, t, acc, part, k_begin, k_end);
        return;
    }
    int prev = -1;  // the slot of the group still in flight (between promotion points)
    int since = 0;  // k-steps in `part` since the last promotion
    for (int kt = k_begin; kt < k_end; ++kt) {
        ring.wait_full(cur);
        issue_kstep_fp8<Tr>(sA, sB, cur.stage, consumer, part, since == 0);
        ++since;
        if (kt + 1 == k_end || (Tr::PROMOTE > 0 && since == Tr::PROMOTE)) {
            wgmma_wait<0>();
#pragma unroll
            for (int mi = 0; mi < Tr::MI; ++mi) fence_regs(part[mi]);  // no read of part before the wait
            if (t == 0) {
                if (prev >= 0) ring.release(prev);
                ring.release(cur.stage);
            }
            prev = -1;
#pragma unroll
            for (int mi = 0; mi < Tr::MI; ++mi) promote(acc[mi], part[mi]);
            since = 0;
        } else {
            wgmma_wait<1>();
            if (t == 0 && prev >= 0) ring.release(prev);
            prev = cur.stage;
        }
        cur.template advance<Tr::STAGES>();
    }
}
