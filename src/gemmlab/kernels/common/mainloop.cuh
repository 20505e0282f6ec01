// The k-loop of the engine kernel, both sides of the ring: the producer's TMA loads of one unit's
// k-steps and the consumers' wgmmas on them. h11's loop, with the tile height (BM = 64 / 128 / 256) and
// width (BN = 16 .. 256) as parameters.
#pragma once
#include "pipeline.cuh"
#include "tile_scheduler.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

// MN-major matrix descriptor for a 64-deep K slab stored as 64 x 64 boxes (PTX ISA "Matrix Descriptor
// Format": leading byte offset = 8 KB between 64-element MN blocks, stride byte offset = 1 KB between
// 8-deep K groups, 128-byte swizzle).
__device__ __forceinline__ u64 desc_sw128_mn(const void* smem) {
    const u64 addr = smem_u32(smem);
    return ((addr & 0x3FFFF) >> 4) | ((u64)(8192 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// Producer: the loads of k-steps [k_begin, k_end) of the tile at (m0, n0).
// A tile whose rows run past M loads only the rows it has: K-major A through `tmA_short`, a box of
// a_rows = the last tile row's rows rounded up to 8 (the host builds it); MN-major A in as many 64-row
// boxes as hold rows. Zero-filled bytes cost the TMA what read ones do (h11, worklog "Short A boxes").
// The slot's other rows keep stale data: each output row depends on its own A row only, so they make
// output rows past M, which nothing stores and no reduction reads into a stored row.
// The same for B's last column of tiles when `bedge` says so (BEdge: N > 0): K-major B through its short
// box of b_rows rows (the columns left, rounded up to 8), MN-major B in as many 64-column boxes as hold
// columns. Zero fill past the tensor's rows costs the TMA more than reading: a swapped tile whose token box
// hung 56 of its 128 rows past M took 26.3 us where the same tile with every row real took 17.3 (H200,
// probe_swap_cols.py). Stale rows of B make only output columns past N, which nothing stores.
// `extra`: more loads into each stage, on the same barrier (FP8 block scales): extra.bytes more
// transaction bytes, extra(bar, stage, kt) issues them. `b_k0` (MN-major B): B's first row of the unit's
// k = 0 (the grouped kernel's B holds every group's K rows one after the other: group g's start at g K).
struct NoExtraLoads {
    static constexpr u32 bytes = 0;
    __device__ __forceinline__ void operator()(u64*, int, int) const {}
};

// B's edge (produce_unit): N = 0 loads whole B boxes everywhere (multicast, and kernels that pass none).
struct BEdge {
    const CUtensorMap* short_map = nullptr;  // K-major B: a box of b_rows rows
    int N = 0, b_rows = 0;
};

// Whether a kernel's traits make A the weight (TRANS_OUT: the tile is a block of out^T); false for traits
// without the flag (the FP8 kernel's).
template <class...>
using void_t = void;
template <class Tr, class = void>
struct WeightIsA {
    static constexpr bool value = false;
};
template <class Tr>
struct WeightIsA<Tr, void_t<decltype(Tr::TRANS_OUT)>> {
    static constexpr bool value = Tr::TRANS_OUT;
};
// Whether a kernel's traits ask for evict-first weight loads (GemmTraits::EVICT_WEIGHT); false without the flag.
template <class Tr, class = void>
struct EvictWeight {
    static constexpr bool value = false;
};
template <class Tr>
struct EvictWeight<Tr, void_t<decltype(Tr::EVICT_WEIGHT)>> {
    static constexpr bool value = Tr::EVICT_WEIGHT;
};

template <class Tr, class Extra = NoExtraLoads>
__device__ __forceinline__ void produce_unit(Ring<Tr::STAGES>& ring, RingCursor& cur, typename Tr::T* sA,
                                             typename Tr::T* sB, const CUtensorMap* tmA,
                                             const CUtensorMap* tmA_short, const CUtensorMap* tmB, int m0, int n0,
                                             int k_begin, int k_end, int M, int a_rows, Extra extra = {},
                                             BEdge bedge = {}, int b_k0 = 0) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    const int left = M - m0;
    const bool whole = left >= BM;
    const int a_boxes = Tr::A_MN ? (whole ? BM / 64 : (left + 63) / 64) : 1;
    const u32 a_bytes = Tr::A_MN ? u32(a_boxes) * 64 * BK * sizeof(T)
                                 : u32(whole ? BM : a_rows) * BK * sizeof(T);
    const int b_left = bedge.N - n0;
    const bool b_whole = Tr::MCAST > 1 || bedge.N == 0 || b_left >= BN;
    const int b_boxes = Tr::B_MN ? (b_whole ? BN / 64 : (b_left + 63) / 64) : 1;
    const u32 b_bytes = Tr::B_MN ? u32(b_boxes) * 64 * BK * sizeof(T)
                                 : (b_whole ? Tr::B_STAGE : u32(bedge.b_rows) * BK * sizeof(T));
    const CUtensorMap* b_map = b_whole ? tmB : bedge.short_map;
    using H = L2Hints<WeightIsA<Tr>::value, EvictWeight<Tr>::value>;
    const u64 pa = l2_policy<H::A>(), pb = l2_policy<H::B>();
    for (int kt = k_begin; kt < k_end; ++kt) {
        // Every box's full bytes arrive, also where it hangs over the tensor's edge (zero fill).
        u64* bar = ring.acquire(cur, a_bytes + b_bytes + Extra::bytes);
        T* a = sA + cur.stage * BM * BK;
        T* b = sB + cur.stage * BN * BK;
        if constexpr (Tr::A_MN) {  // A stored (K, M): 64 x 64 boxes at (m, k)
            for (int i = 0; i < a_boxes; ++i) tma_load_2d<H::A>(a + i * 64 * BK, tmA, bar, m0 + 64 * i, kt * BK, pa);
        } else {  // A stored (M, K)
            tma_load_2d<H::A>(a, whole ? tmA : tmA_short, bar, kt * BK, m0, pa);
        }
        if constexpr (Tr::B_MN) {  // B stored (K, N): BN / 64 boxes, those that hold columns
            for (int i = 0; i < b_boxes; ++i)
                tma_load_2d<H::B>(b + i * 64 * BK, tmB, bar, n0 + 64 * i, b_k0 + kt * BK, pb);
        } else if constexpr (Tr::MCAST > 1) {  // this CTA's share of B's rows, to every CTA of the pair
            constexpr int SHARE = BN / Tr::MCAST;
            const int r = (int)cluster_ctarank();
            tma_load_2d_multicast(b + r * SHARE * BK, tmB, bar, kt * BK, n0 + r * SHARE, (1u << Tr::MCAST) - 1);
        } else {
            tma_load_2d<H::B>(b, b_map, bar, kt * BK, n0, pb);
        }
        extra(bar, cur.stage, kt);
        if constexpr (Tr::PREFETCH > 0) {  // the boxes of a k-step further on, into the L2 only
            if (kt + Tr::PREFETCH < k_end) {
                tma_prefetch_2d(tmA, (kt + Tr::PREFETCH) * BK, m0);
                tma_prefetch_2d(tmB, (kt + Tr::PREFETCH) * BK, n0);
            }
        }
        cur.template advance<Tr::STAGES>();
    }
}

// Before pdl_wait (the kernel before may still be running): ask the L2 for the first k-steps (as many as
// the ring holds) of this CTA's first unit, so the ring's first loads after the wait find them there
// instead of waiting out HBM. Only the weight's boxes by default (B, or A where the tile is a block of
// out^T): the kernel before, in a chain of layers, usually writes the activations, not the weight.
// EARLY_L2 = 0: none; 1: the weight; 2: both operands (a probe's setting). A prefetch is a hint into the
// L2, which every SM's writes go through, so a box the kernel before still writes is never read stale:
// what the ring loads after pdl_wait comes from the L2 as it then is. K-major operands, one box each.
// Off: measured 7% slower on the broad set's small shapes (docs/worklog.md, session 22; the prefetches
// seem to hold the SM's TMA unit ahead of the ring's first loads); probe_variants.py times it.
#ifndef EARLY_L2
#define EARLY_L2 0
#endif
template <class Tr>
__device__ __forceinline__ void prewarm_l2(const CUtensorMap* tmA, const CUtensorMap* tmB, int m0, int n0, int k_begin,
                                           int k_end) {
    constexpr bool WARM_A = EARLY_L2 == 2 || (EARLY_L2 == 1 && Tr::TRANS_OUT);
    constexpr bool WARM_B = EARLY_L2 == 2 || (EARLY_L2 == 1 && !Tr::TRANS_OUT);
    const int last = min(k_end, k_begin + Tr::STAGES);
    for (int kt = k_begin; kt < last; ++kt) {
        if constexpr (WARM_A && !Tr::A_MN) tma_prefetch_2d(tmA, kt * Tr::BK, m0);
        if constexpr (WARM_B && !Tr::B_MN) tma_prefetch_2d(tmB, kt * Tr::BK, n0);
    }
}

// The producer warpgroup of a persistent kernel: it hands its registers to the consumers (setmaxnreg, PTX
// ISA: 128 x (40 + 2 x 232) <= 64 K with two consumers; one consumer has 240+ at entry already), then its
// first thread loads every work unit the scheduler gives this CTA. where(tile) -> int2: the tile's first
// row of A (x) and of B (y); M and a_rows as produce_unit takes them.
template <class Tr, class Sched, class Where>
__device__ __forceinline__ void produce_all(Ring<Tr::STAGES>& ring, Sched& sched, typename Tr::T* sA,
                                            typename Tr::T* sB, const CUtensorMap* tmA,
                                            const CUtensorMap* tmA_short, const CUtensorMap* tmB, int M, int a_rows,
                                            Where where) {
    if constexpr (Tr::CONSUMERS > 1) setmaxnreg_dec<40>();
    if (threadIdx.x % 128 == 0) {
        RingCursor cur;
        WorkUnit u;
        while (sched.next(u)) {
            const int2 at = where(u.tile);
            produce_unit<Tr>(ring, cur, sA, sB, tmA, tmA_short, tmB, at.x, at.y, u.k_begin, u.k_end, M, a_rows);
        }
    }
}

// Consumer warpgroup `consumer`: k-steps [k_begin, k_end) into acc (its MI blocks of 64 rows x CN).
// One wgmma group stays in flight: a slot is released once the group after it was issued and the
// group reading it has completed (wgmma.wait_group 1), as in h06 on. The first k16 step of the unit
// overwrites the accumulators (scale-d = 0). k_end > k_begin always (the schedulers make no empty unit).
// active = false: every row of this consumer's blocks lies past the tile's rows (the last row of tiles,
// a group's last tile, a multicast pair's padding tile): it issues no wgmma and leaves acc as it was (the
// callers store and reduce no block past the rows), but still waits for each slot's loads before
// releasing it, so its arrivals on "empty" stay in the ring's order; the other consumer's wgmmas then
// have the tensor cores to themselves. On in the grouped kernel (1.004-1.037x on MoE shapes); off
// (NO_ROW_SKIP 1: multiply them anyway) in the dense engine, where it measured 0.93-1.03x on six plans
// whose last row of tiles is half empty: no gain to pay for the branch (docs/worklog.md, session 19).
#ifndef NO_ROW_SKIP
#define NO_ROW_SKIP 1
#endif
template <class Tr>
__device__ __forceinline__ void consume_unit(Ring<Tr::STAGES>& ring, RingCursor& cur, const typename Tr::T* sA,
                                             const typename Tr::T* sB, int consumer, int t,
                                             float (&acc)[Tr::MI][Tr::CN / 2], int k_begin, int k_end,
                                             bool active = true) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    if (!active && !NO_ROW_SKIP) {
        for (int kt = k_begin; kt < k_end; ++kt) {
            ring.wait_full(cur);
            if (t == 0) ring.template release<Tr::MCAST>(cur.stage);
            cur.template advance<Tr::STAGES>();
        }
        return;
    }
    int prev = 0;
    for (int kt = k_begin; kt < k_end; ++kt) {
        ring.wait_full(cur);
        // This consumer's rows: blocks consumer * MI .. of 64 rows (one 64 x 64 box each if MN-major).
        const T* a = sA + cur.stage * BM * BK + Tr::first_block(consumer) * 64 * BK;
        const T* b = sB + cur.stage * BN * BK + Tr::first_col(consumer) * BK;  // COL_SPLIT: its rows of B
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u64 db = Tr::B_MN ? desc_sw128_mn(b + 16 * 64 * k) : desc_sw128(b + 16 * k);
#pragma unroll
            for (int mi = 0; mi < Tr::MI; ++mi) {
                const T* am = a + mi * 64 * BK;
                const u64 da = Tr::A_MN ? desc_sw128_mn(am + 16 * 64 * k) : desc_sw128(am + 16 * k);
                Wgmma<Tr::CN, T>::template mma_t<Tr::A_MN, Tr::B_MN>(acc[mi], da, db, (kt == k_begin && k == 0) ? 0 : 1);
            }
        }
        wgmma_commit();
        if (kt > k_begin) {
            wgmma_wait<1>();
            if (t == 0) ring.template release<Tr::MCAST>(prev);
        }
        prev = cur.stage;
        cur.template advance<Tr::STAGES>();
    }
    wgmma_wait<0>();
    if (t == 0) ring.template release<Tr::MCAST>(prev);
}
