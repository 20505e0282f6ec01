// The consumers' side of the FP8 k-loop (the producer is mainloop.cuh's produce_unit: the same TMA loads,
// 128-byte rows of 128 e4m3 values). Per k-step of 128: four k32 wgmmas per m64 block into `part`; at a
// promotion point (every PROMOTE k-steps, and the unit's last) the consumer waits for its wgmmas, frees
// the slots and adds `part` (block mode: scaled by this k-block's scales) into `acc`. Between promotion
// points one wgmma group stays in flight as in the bf16 loop (wgmma.wait_group 1).
// Block scales are loaded two k-steps ahead of their promotion: a scale read from L2 takes longer than a
// k-step (~600+ cycles against ~300-500), and ptxas places the first use of the scales (the row x column
// scale products) among the k-step's wgmma issues, so a scale not yet loaded stalls the warpgroup before
// its last wgmma. Measured on the H200 at 4096^3: loaded in their own k-step 0.59x of per-tensor
// throughput, one k-step ahead 0.57-0.63x (128 x 128 and 128 x 208 alike).
#pragma once
#include "fp8_promote.cuh"
#include "pipeline.cuh"
#include "wgmma.cuh"
#include "wgmma_fp8_ops.cuh"

template <class Tr>
__device__ __forceinline__ void consume_unit_fp8(Ring<Tr::STAGES>& ring, RingCursor& cur, const unsigned char* sA,
                                                 const unsigned char* sB, int consumer, int t,
                                                 float (&acc)[Tr::MI][Tr::BN / 2],
                                                 float (&part)[Tr::MI][Tr::BN / 2], int k_begin, int k_end,
                                                 const Fp8Scales& scales, int row0, int n0) {
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[mi][i] = 0.0f;
    int prev = -1;  // the slot of the group still in flight (between promotion points)
    int since = 0;  // k-steps in `part` since the last promotion
    BlockScaleRegs<Tr> sc, sc_next;  // block mode: the scales of k-steps kt and kt + 1
    if constexpr (Tr::SCALE == SCALE_BLOCK) {
        sc.load(scales, row0, n0, k_begin, t);
        if (k_begin + 1 < k_end) sc_next.load(scales, row0, n0, k_begin + 1, t);
    }
    for (int kt = k_begin; kt < k_end; ++kt) {
        ring.wait_full(cur);
        const unsigned char* a = sA + cur.stage * BM * BK + consumer * Tr::MI * 64 * BK;
        const unsigned char* b = sB + cur.stage * BN * BK;
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // k32 steps: 32 bytes along the swizzled row
            const u64 db = desc_sw128(b + 32 * k);
#pragma unroll
            for (int mi = 0; mi < Tr::MI; ++mi)
                WgmmaFp8<BN>::mma(part[mi], desc_sw128(a + mi * 64 * BK + 32 * k), db, (since == 0 && k == 0) ? 0 : 1);
        }
        wgmma_commit();
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
            for (int mi = 0; mi < Tr::MI; ++mi) {
                if constexpr (Tr::SCALE == SCALE_BLOCK) {
                    promote_scaled<Tr>(acc[mi], part[mi], sc.top[mi], sc.bot[mi], sc.col, n0);
                } else {
                    promote(acc[mi], part[mi]);
                }
            }
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
