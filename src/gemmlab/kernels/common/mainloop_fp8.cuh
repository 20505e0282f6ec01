// The consumers' side of the FP8 k-loop (the producer is mainloop.cuh's produce_unit: the same TMA loads,
// 128-byte rows of 128 e4m3 values). Per k-step of 128: four k32 wgmmas per m64 block into a partial
// sum; at a promotion point (every PROMOTE k-steps, and the unit's last) the consumer waits for its
// wgmmas, frees the slots and adds the partial (block mode: scaled by this k-block's scales) into `acc`.
// Between promotion points one wgmma group stays in flight as in the bf16 loop (wgmma.wait_group 1).
// Block scales are loaded two k-steps ahead of their promotion: a scale read from L2 takes longer than a
// k-step (~600+ cycles against ~300-500), and ptxas places the first use of the scales (the row x column
// scale products) among the k-step's wgmma issues.
// Measured on the H200 (4096^3, 128 x 128 tiles, OVERLAP_NONE): block scales at 0.59x of per-tensor
// throughput when loaded in their own k-step, 0.57-0.63x one ahead, 0.64x two ahead; so the loads are
// not what costs. Both consumers wake on the same full barrier and promote together while the tensor
// core idles: the Fp8Overlap modes (fp8_traits.cuh) take that on.
#pragma once
#include "fp8_promote.cuh"
#include "pipeline.cuh"
#include "wgmma.cuh"
#include "wgmma_fp8_ops.cuh"

// One k-step's wgmmas from ring slot `stage`: four k32 steps per m64 block of this consumer into `part`
// (`restart`: the first overwrites it, scale-d = 0).
template <class Tr>
__device__ __forceinline__ void issue_kstep_fp8(const unsigned char* sA, const unsigned char* sB, int stage,
                                                int consumer, float (&part)[Tr::MI][Tr::BN / 2], bool restart) {
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    const unsigned char* a = sA + stage * BM * BK + consumer * Tr::MI * 64 * BK;
    const unsigned char* b = sB + stage * BN * BK;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // k32 steps: 32 bytes along the swizzled row
        const u64 db = desc_sw128(b + 32 * k);
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi)
            WgmmaFp8<BN>::mma(part[mi], desc_sw128(a + mi * 64 * BK + 32 * k), db, (restart && k == 0) ? 0 : 1);
    }
    wgmma_commit();
}

// acc += part, scaled by the k-block's scales in block mode.
template <class Tr>
__device__ __forceinline__ void promote_all(float (&acc)[Tr::MI][Tr::BN / 2], const float (&part)[Tr::MI][Tr::BN / 2],
                                            const BlockScaleRegs<Tr>& sc, int n0) {
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) {
        if constexpr (Tr::SCALE == SCALE_BLOCK) {
            promote_scaled<Tr>(acc[mi], part[mi], sc.top[mi], sc.bot[mi], sc.col, n0);
        } else {
            promote(acc[mi], part[mi]);
        }
    }
}

// OVERLAP_NONE and OVERLAP_STAGGER. `issued` (STAGGER): one barrier per ring slot, completed by consumer
// 0's thread 0 once it issued the slot's wgmmas; consumer 1 waits on it (same parity as the slot's full
// barrier: one arrival per use of the slot) before issuing its own.
template <class Tr>
__device__ __forceinline__ void consume_unit_fp8(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                 const unsigned char* sB, int consumer, int t,
                                                 float (&acc)[Tr::MI][Tr::BN / 2],
                                                 float (&part)[Tr::MI][Tr::BN / 2], int k_begin, int k_end,
                                                 const Fp8Scales& scales, int row0, int n0, u64* issued) {
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi)
#pragma unroll
        for (int i = 0; i < Tr::BN / 2; ++i) acc[mi][i] = 0.0f;
    int prev = -1;  // the slot of the group still in flight (between promotion points)
    int since = 0;  // k-steps in `part` since the last promotion
    BlockScaleRegs<Tr> sc, sc_next;  // block mode: the scales of k-steps kt and kt + 1
    if constexpr (Tr::SCALE == SCALE_BLOCK) {
        sc.load(scales, row0, n0, k_begin, t);
        if (k_begin + 1 < k_end) sc_next.load(scales, row0, n0, k_begin + 1, t);
    }
    for (int kt = k_begin; kt < k_end; ++kt) {
        ring.wait_full(cur);
        if constexpr (Tr::OVERLAP == OVERLAP_STAGGER) {
            if (consumer == 1) mbar_wait_parity(&issued[cur.stage], cur.phase);
        }
        issue_kstep_fp8<Tr>(sA, sB, cur.stage, consumer, part, since == 0);
        if constexpr (Tr::OVERLAP == OVERLAP_STAGGER) {
            if (consumer == 0 && t == 0) mbar_arrive_notoken(&issued[cur.stage]);
        }
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
            promote_all<Tr>(acc, part, sc, n0);
            // PROMOTE == 1 in block mode: the next promotion is k-step kt + 1's
            if constexpr (Tr::SCALE == SCALE_BLOCK) {
                sc = sc_next;
                if (kt + 2 < k_end) sc_next.load(scales, row0, n0, kt + 2, t);
            }
            since = 0;
        } else {
            wgmma_wait<1>();
            if (t == 0 && prev >= 0) ring.release(prev);
            prev = cur.stage;
        }
        cur.template advance<Tr::STAGES>();
    }
}
