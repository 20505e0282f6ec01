// The consumers' side of the FP8 k-loop (the producer is mainloop.cuh's produce_unit: the same TMA loads,
// 128-byte rows of 128 e4m3 values). Per k-step of 128: four k32 wgmmas per m64 block into a partial
// sum; at a promotion point the consumer waits for its wgmmas, frees the slots and adds the partial into
// `acc`: per-tensor scales every PROMOTE k-steps (and at the unit's last), with one wgmma group in flight
// in between as in the bf16 loop (wgmma.wait_group 1); block scales every k-step, scaled by that
// k-block's scales.
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

// Block scales, one k-step: wgmmas, wait, free the slot, acc += part x this k-block's scales (`sc`),
// then refill `sc` with the scales of k-step kt + 2, this set's next use.
template <class Tr>
__device__ __forceinline__ void block_kstep_fp8(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                const unsigned char* sB, int consumer, int t,
                                                float (&acc)[Tr::MI][Tr::BN / 2], float (&part)[Tr::MI][Tr::BN / 2],
                                                int kt, int k_end, BlockScaleRegs<Tr>& sc, const Fp8Scales& scales,
                                                int row0, int n0) {
    ring.wait_full(cur);
    issue_kstep_fp8<Tr>(sA, sB, cur.stage, consumer, part, true);
    wgmma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) fence_regs(part[mi]);  // no read of part before the wait
    if (t == 0) ring.release(cur.stage);
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) promote_scaled<Tr>(acc[mi], part[mi], sc.top[mi], sc.bot[mi], sc.col, n0);
    if (kt + 2 < k_end) sc.load(scales, row0, n0, kt + 2, t);
    cur.template advance<Tr::STAGES>();
}

template <class Tr>
__device__ __forceinline__ void consume_unit_fp8(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                 const unsigned char* sB, int consumer, int t,
                                                 float (&acc)[Tr::MI][Tr::BN / 2],
                                                 float (&part)[Tr::MI][Tr::BN / 2], int k_begin, int k_end,
                                                 const Fp8Scales& scales, int row0, int n0) {
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi)
#pragma unroll
        for (int i = 0; i < Tr::BN / 2; ++i) acc[mi][i] = 0.0f;
    if constexpr (Tr::SCALE == SCALE_BLOCK) {
        // Two sets of scale registers, used by alternate k-steps (the loop unrolled by two keeps them
        // apart by name): a set is refilled right after its promotion, two k-steps before its next use.
        // A single set copied from a look-ahead set (sc = sc_next) made ptxas read the look-ahead's
        // registers, whose loads had just been issued, among the next k-step's wgmma issues (SASS at
        // c6c4bc7; 0.56x of per-tensor throughput; this form 0.585x). What still costs: a load in flight
        // stalls the warpgroup at its next wgmma fence however early it was issued (with the same
        // promotion on loop-invariant scales the kernel runs within 3% of per-tensor: worklog).
        BlockScaleRegs<Tr> sc0, sc1;
        sc0.load(scales, row0, n0, k_begin, t);
        if (k_begin + 1 < k_end) sc1.load(scales, row0, n0, k_begin + 1, t);
        for (int kt = k_begin; kt < k_end; kt += 2) {
            block_kstep_fp8<Tr>(ring, cur, sA, sB, consumer, t, acc, part, kt, k_end, sc0, scales, row0, n0);
            if (kt + 1 == k_end) break;
            block_kstep_fp8<Tr>(ring, cur, sA, sB, consumer, t, acc, part, kt + 1, k_end, sc1, scales, row0, n0);
        }
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
