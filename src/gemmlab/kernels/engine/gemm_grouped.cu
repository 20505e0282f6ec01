// engine.gemm_grouped: grouped GEMM for mixture-of-experts layers, from the engine's named parts
// (kernels/common/): for each group g, out_g (rows_g x N) = A_g (rows_g x K) @ B[g]^T, B[g] (N x K)
// K-major (nn.Linear's weight layout), in one persistent launch. bf16 / fp16 operands (GemmTraits), or
// e4m3 (Fp8GemmTraits, the FP8 main loop in place of the bf16 one) with
//   per-tensor scales (SCALE_TENSOR): out_g = scale_a x scale_b[g] x A_g @ B[g]^T, scale_b one scale
//     (sb_step = 0) or one per group (sb_step = 1), applied in the epilogue;
//   block scales (SCALE_BLOCK, DeepSeek-V3's): A one scale per row and 128 of K, B[g] one per 128 x 128
//     block, applied as each 128-deep partial sum is promoted (fp8_promote.cuh). The producer thread loads
//     a k-step's scales with its operands by two more TMA boxes on the stage's barrier
//     (GroupedScaleLoads), from (K / 128, rows) views: tmSA over all of A's rows (T, or G x capacity);
//     tmSB over every expert's column blocks in a row (expert g's block j at g x ceil(N / 128) + j), a box
//     of 8 from that index rounded down to a multiple of 4, as the dense kernel loads it. A TMA box's
//     innermost coordinate must fall on 16 bytes (4 floats; the H200 raises an illegal instruction
//     otherwise), and a group starts at any row: the row box starts at the tile's first row rounded down
//     to a multiple of 4 and holds BM + 4 rows (GroupedScales: a wider slot), the consumers read from
//     row (first row % 4). The rows the box holds past the group's end are the next group's (or TMA zero
//     fill), exactly the rows A's box loads: multiplied into rows that are never stored. A tile at the
//     expert's right edge likewise reads the next expert's column scales into its columns >= N.
//   gemm_traits.cuh      the compile-time choices (GemmTraits: K-major operands, data-parallel)
//   fp8_traits.cuh       e4m3: Fp8GemmTraits (per-tensor scales, promotion into fp32 every 128 of K)
//   group_scheduler.cuh  the groups' row ranges read on the device into a tile table (GroupTable) and
//                        the tile order inside a group (m fastest, in panels of `panel` m-tiles)
//   tile_scheduler.cuh   data-parallel persistent tiles over all groups' tiles (or hybrid stream-K)
//   claimed_tiles.cuh    (CLAIM) the same tiles in claim order from a global counter
//   reduction.cuh        stream-K: the partial sums through the global workspace
//   mainloop.cuh         the producer's TMA loads and the consumers' wgmmas, unchanged
//   mainloop_fp8.cuh     e4m3: the consumers' k32 wgmmas into a partial sum, promoted every k-step
//   epilogue_store.cuh   TMA stores of the 64-row blocks inside the group, DIRECT rows for the rest
// Layouts (LAYOUT): GROUPS_CONTIGUOUS: A (total, K), tokens sorted by group, rows from offsets; out
// (total, N). GROUPS_MASKED: A (G, capacity, K) seen as (G * capacity, K), counts say how many rows of
// each slab are valid; out (G, capacity, N), rows past a count untouched.
// One 2-D tensor map for all of A and one for B seen as (G * N, K). A tile at the end of a group loads
// BM rows, or where the group has BM / 2 or fewer rows left, the shortest of four short boxes of A (BM / 16
// .. BM / 2 rows, tmA1 .. tmA4) that holds them; either box may run into the next group's rows (or TMA
// zero fill past the tensor), and the slot's rows past a short box keep stale data: each output row
// depends on its own A row only, and the epilogue stores only the group's rows. Likewise a tile at the
// right edge loads B rows of the next group's weight into columns >= N, which are never stored.
// MN-major B (Tr::B_MN, bf16 / fp16): b[g] given as its transpose, stored (K, N) with N contiguous (a weight
// kept as torch._grouped_mm's (G, K, N), or the backward's dy @ w[g]); one 2-D map over all groups' (G * K, N)
// rows, group g's k-step kt at row g K + kt BK. K is then a multiple of BK (the host's rule): no k-step
// reads into the next group's rows.
// Stores: a consumer's 64-row block that lies wholly inside its group goes out as the dense engine's
// TMA store (one map over all of out, tmC; the map clips columns >= N), its last BN % PIECE columns (128 x
// 160 / 176: 32 / 48) through the tail piece's map tmCt (tmC again where the tile has none). The block that
// crosses the group's last row cannot (its box would write the next group's rows): the threads store its rows
// (store_piece_rows, bounded by the group's rows and N). With Tr::DIRECT (out's rows not 16-byte
// aligned: no TMA map over out) every block is stored that way.
// MAX_G: the group table's capacity (128 or 512); the smaller table leaves room for one more stage at
// 128 x 128 and 128 x 256 (gemmlab.grouped.table_groups).
// Schedules (Tr::SCHEDULE): DATA_PARALLEL, or (bf16 / fp16) STREAM_K, the dense engine's hybrid decided on
// the device: the tiles there are (the table's total) are only known here, so each CTA derives the same
// split from them: full waves of whole tiles, and where a partial wave is left over (total > grid, total
// % grid = r > 0, r x k-steps >= grid), the k-steps of the last r tiles spread evenly over all CTAs
// (tile_scheduler.cuh), their partial sums reduced through the workspace in CTA order (reduction.cuh:
// deterministic, flags left at 0), or (bf16 / fp16, 64- or 128-row tiles) PINGPONG: the dense engine's
// ping-pong consumers, each with whole tiles of its own in turn (one's epilogue under the other's k-loop).
#include "common/fp8_traits.cuh"
#include "common/gemm_traits.cuh"
#include "common/group_scheduler.cuh"
#include "common/claimed_tiles.cuh"
// Each group's last tile leaves its second consumer's rows past the group about half the time: that
// consumer multiplies nothing there (mainloop.cuh's row skip; 1.004-1.037x on four MoE shapes, session 19).
#ifndef NO_ROW_SKIP
#define NO_ROW_SKIP 0
#endif
#include "common/mainloop.cuh"
#include "common/mainloop_fp8.cuh"
#include "common/epilogue_store.cuh"
#include "common/fp8_promote.cuh"
#include "common/reduction.cuh"

// Block scales: each stage's slot holds BM + 4 row scales from the tile's first row rounded down to a
// multiple of 4, then (at the next 128 bytes) B's box of 8 column-block scales.
template <class Tr>
struct GroupedScales : Tr {
    static constexpr int SA_BOX = Tr::BM + 4;
    static constexpr int SB_AT = Tr::BM + 32;
    static constexpr int SCALE_SLOT = Tr::BM + 64;  // floats: whole 128 bytes (TMA destinations)
    static constexpr u32 SCALE_BYTES = Tr::STAGES * SCALE_SLOT * 4;
};

// The producer's extra loads per k-step (produce_unit's `extra`): the two scale boxes of GroupedScales.
template <class Tg>
struct GroupedScaleLoads {
    static constexpr u32 bytes = (Tg::SA_BOX + 8) * 4;
    float* slots;
    const CUtensorMap* tmSA;
    const CUtensorMap* tmSB;
    int m0, nb0;  // the tile's first row (of A) and first column block (of tmSB's rows)
    __device__ __forceinline__ void operator()(u64* bar, int stage, int kt) const {
        float* slot = slots + stage * Tg::SCALE_SLOT;
        tma_load_2d(slot, tmSA, bar, m0 & ~3, kt);
        tma_load_2d(slot + Tg::SB_AT, tmSB, bar, nb0 & ~3, kt);
    }
};

// The scale mode (Fp8GemmTraits::SCALE; bf16 / fp16 traits have none) and the block scales' slots.
template <class Tr>
__host__ __device__ constexpr int scale_mode() {
    if constexpr (sizeof(typename Tr::T) == 1) return Tr::SCALE;
    else return SCALE_TENSOR;
}
template <class Tr>
__host__ __device__ constexpr unsigned scale_bytes() {
    if constexpr (sizeof(typename Tr::T) == 1) return Tr::SCALE == SCALE_BLOCK ? GroupedScales<Tr>::SCALE_BYTES : 0;
    else return 0;
}

// A's short boxes (tmA1 .. tmA4): i = 0 .. 3 holds BM / 16, BM / 8, BM / 4, BM / 2 rows, at least 8 (one
// 128-byte swizzle atom); gemmlab.grouped.short_a_rows builds the same. A tile over a group's last rows
// loads the fewest of them that hold the group's rows (the kernel's a_box): 2-row groups of a 128-row tile
// move 8 rows of A a k-step, not 128.
// GROUPED_SHORT_A 0 (a probe's setting): every A box whole, the form before session 23.
#ifndef GROUPED_SHORT_A
#define GROUPED_SHORT_A 1
#endif
template <int BM>
__host__ __device__ constexpr int short_a_rows(int i) {
    return (BM >> (4 - i)) > 8 ? (BM >> (4 - i)) : 8;
}
struct ShortA {
    const CUtensorMap* map;
    int M;     // produce_unit's M: the group's end (a short box), or INT_MAX (a whole BM-row box)
    int rows;  // the box's rows
};

// The same traits with every store DIRECT: the block that crosses its group's last row.
template <class Tr>
struct DirectStores : Tr {
    static constexpr bool DIRECT = true;
};

// CLAIM: data-parallel / ping-pong tiles in claim order (ClaimedTiles, claimed_tiles.cuh; `flags` holds
// its counter), else the static stride of TileScheduler.
template <class Tr, int LAYOUT, int MAX_G, bool CLAIM = false>
__global__ void __launch_bounds__(Tr::THREADS, 1)
engine_gemm_grouped(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                    const __grid_constant__ CUtensorMap tmC, const __grid_constant__ CUtensorMap tmSA,
                    const __grid_constant__ CUtensorMap tmSB, const int* __restrict__ ranges, int lead, int G,
                    int limit, int N, int K, int panel, const float* __restrict__ scale_a,
                    const float* __restrict__ scale_b, int sb_step, typename Tr::TO* __restrict__ Out,
                    long long ldo, float* workspace, int* flags, const __grid_constant__ CUtensorMap tmA1,
                    const __grid_constant__ CUtensorMap tmA2, const __grid_constant__ CUtensorMap tmA3,
                    const __grid_constant__ CUtensorMap tmA4, const __grid_constant__ CUtensorMap tmCt) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    constexpr bool FP8 = sizeof(T) == 1;  // Fp8GemmTraits: e4m3 bytes, 128-deep k-steps
    constexpr bool BLOCK = scale_mode<Tr>() == SCALE_BLOCK;
    constexpr bool SK = Tr::SCHEDULE == STREAM_K, PP = Tr::PING_PONG;
    static_assert((Tr::SCHEDULE == DATA_PARALLEL || ((SK || PP) && !FP8)) && !Tr::A_MN && !Tr::HAS_C &&
                      !Tr::HAS_BIAS && Tr::ACT == 0 && (!Tr::B_MN || !FP8),
                  "grouped: K-major A (B too for e4m3), data-parallel (or bf16 / fp16 stream-K, ping-pong), no "
                  "epilogue terms");
    static_assert(!CLAIM || Tr::SCHEDULE == DATA_PARALLEL || PP, "tiles in claim order: whole tiles only");
    if constexpr (FP8) static_assert(Tr::PRODUCER_REGS == 40, "the producer gives the consumers 232 registers");
    static_assert(1024 + Tr::STAGES * Tr::STAGE_BYTES + Tr::SLABS_BYTES + scale_bytes<Tr>() +
                          sizeof(GroupTable<MAX_G>) <= 227 * 1024 - 256,
                  "shared memory (with the group table)");
    extern __shared__ unsigned char smem_raw[];
    T* sA = reinterpret_cast<T*>(align_1024(smem_raw));
    T* sB = sA + Tr::STAGES * BM * BK;
    unsigned char* sC = reinterpret_cast<unsigned char*>(sB + Tr::STAGES * BN * BK);
    // Block scales: one slot per stage after the output slabs (128-byte aligned), as in gemm_fp8.cu.
    float* s_scales = reinterpret_cast<float*>(sC + Tr::SLABS_BYTES);
    __shared__ Ring<Tr::STAGES> ring;
    __shared__ GroupTable<MAX_G> groups;
    __shared__ Turns turns;  // PINGPONG only
    __shared__ TileQueue queue;  // CLAIM only

    const int wg = Tr::UNIFORM_WG ? warpgroup_index() : static_cast<int>(threadIdx.x / 128), t = threadIdx.x % 128;
    const int tiles_n = (N + BN - 1) / BN, k_iters = (K + BK - 1) / BK;
    const int n_blocks = (N + 127) / 128;  // block scales: each expert's column blocks in tmSB's rows
    pdl_wait();  // programmatic dependent launch: the ranges below may be the previous kernel's output
    pdl_trigger_early();
    if (threadIdx.x < 32) groups.template build<LAYOUT, BM>(ranges, lead, G, limit, tiles_n, threadIdx.x);
    if (threadIdx.x == 0) {
        ring.init(Tr::SLOT_READERS);
        if constexpr (PP) turns.init();
        if constexpr (CLAIM) queue.init(Tr::CONSUMERS * 128);
    }
    __syncthreads();

    // Stream-K where a partial wave is left and its k-steps give every CTA at least one (a CTA with an empty
    // range would leave its owner waiting for a partial it never writes); else every tile data-parallel.
    const int total = groups.total(G), rem = total % (int)gridDim.x;
    const bool streamed = SK && total > (int)gridDim.x && rem > 0 && (long long)rem * k_iters >= gridDim.x;
    auto sched = [&] {
        if constexpr (CLAIM) return ClaimedTiles(&queue, flags, total, k_iters, wg == 0);
        else return TileScheduler<Tr::SCHEDULE>(total, k_iters, ScheduleArgs{1, streamed ? rem : 0, streamed ? (int)gridDim.x : 0});
    }();
    WorkUnit u;
    // A's box for the tile `gt`: BM rows where more than half of them are its group's, else the shortest of
    // A's short boxes (tmA1 .. tmA4: short_a_rows) that holds the group's rows from the tile's first; the
    // slot's other rows keep stale data, which make only rows past the group (never stored). ShortA's M
    // (the group's end) tells produce_unit the box is short; INT_MAX: whole.
    auto a_box = [&](const GroupTile& gt, int m0) {
        const int left = gt.rows - gt.m * BM;
        ShortA s{&tmA, 0x7fffffff, BM};
        if (!GROUPED_SHORT_A) return s;
        if (left <= short_a_rows<BM>(3)) s = ShortA{&tmA4, m0 + left, short_a_rows<BM>(3)};
        if (left <= short_a_rows<BM>(2)) s = ShortA{&tmA3, m0 + left, short_a_rows<BM>(2)};
        if (left <= short_a_rows<BM>(1)) s = ShortA{&tmA2, m0 + left, short_a_rows<BM>(1)};
        if (left <= short_a_rows<BM>(0)) s = ShortA{&tmA1, m0 + left, short_a_rows<BM>(0)};
        return s;
    };
    if (wg == 0) {
        if constexpr (Tr::CONSUMERS > 1) setmaxnreg_dec<40>();
        if (t == 0) {
            RingCursor pcur;
            while (sched.next(u)) {
                const GroupTile gt = groups.template locate<BM>(u.tile, G, tiles_n, panel);
                const int m0 = gt.row0 + gt.m * BM, n0 = gt.n * BN;
                const ShortA sa = a_box(gt, m0);
                // K-major B: rows g N + n0 .. of the (G N, K) map; MN-major B: columns n0 .., group g's K rows
                // from g K.
                const int b_row = Tr::B_MN ? n0 : gt.g * N + n0, b_k0 = Tr::B_MN ? gt.g * K : 0;
                if constexpr (BLOCK)  // the k-step's scale boxes ride with its operands
                    produce_unit<Tr>(ring, pcur, sA, sB, &tmA, sa.map, &tmB, m0, b_row, u.k_begin, u.k_end, sa.M,
                                     sa.rows, GroupedScaleLoads<GroupedScales<Tr>>{s_scales, &tmSA, &tmSB, m0,
                                                                                    gt.g * n_blocks + n0 / 128});
                else
                    produce_unit<Tr>(ring, pcur, sA, sB, &tmA, sa.map, &tmB, m0, b_row, u.k_begin, u.k_end, sa.M,
                                     sa.rows, NoExtraLoads{}, BEdge{}, b_k0);
            }
        }
        return;
    }

    if constexpr (Tr::CONSUMERS > 1) setmaxnreg_inc<Tr::CONSUMER_REGS>();
    const int consumer = wg - 1;
    const float sa = FP8 && !BLOCK ? __ldg(scale_a) : 1.0f;
    unsigned char* slabs = sC + consumer * 2 * Tr::SLAB_BYTES;
    RingCursor cur;
    int pieces = 0;
    float acc[Tr::MI][Tr::CN / 2];
    float part[Tr::MI][Tr::CN / 2];  // e4m3: the wgmmas' partial sums (bf16 uses none: no registers)
    int unit = 0;  // PINGPONG: this CTA's tiles go to consumer 0, 1, 0, 1, ...
    u32 turn_parity = 0;
    while (sched.next(u)) {
        if constexpr (PP) {
            if ((unit & 1) != consumer) {  // the other consumer's tile: step over its k-steps in the ring
                ++unit;
                cur.template skip<Tr::STAGES>(u.k_end - u.k_begin);
                continue;
            }
            if (unit++ > 0) turns.wait(consumer, turn_parity);
        }
        const GroupTile gt = groups.template locate<BM>(u.tile, G, tiles_n, panel);
        if constexpr (BLOCK)
            consume_unit_fp8<GroupedScales<Tr>>(ring, cur, sA, sB, consumer, t, acc, part, u.k_begin, u.k_end,
                                                s_scales, gt.n * BN, gt.g * n_blocks + gt.n * BN / 128,
                                                (gt.row0 + gt.m * BM) & 3);
        else if constexpr (FP8)
            consume_unit_fp8<Tr>(ring, cur, sA, sB, consumer, t, acc, part, u.k_begin, u.k_end, nullptr, gt.n * BN);
        else  // a consumer whose blocks lie past the group's rows multiplies nothing (mainloop.cuh)
            consume_unit<Tr>(ring, cur, sA, sB, consumer, t, acc, u.k_begin, u.k_end,
                             SK || gt.m * BM + Tr::first_block(consumer) * 64 < gt.rows);  // (as gemm.cu)
        if constexpr (PP) {
            if (t == 0) turns.pass(consumer);
        }
        if constexpr (SK) {  // a streamed tile: blocks past the group's rows hold no partial (reduction.cuh)
            if (u.kind == UNIT_CONTRIBUTOR) {
                sk_store_partial<Tr>(acc, workspace, flags, blockIdx.x, consumer, t, gt.m * BM, gt.rows);
                continue;
            }
            if (u.kind == UNIT_OWNER)
                sk_add_partials<Tr>(acc, workspace, flags, sched, blockIdx.x + 1, sched.streamed_end(u.tile), consumer,
                                    t, gt.m * BM, gt.rows);
        }
        // e4m3, per-tensor: the scales, read after the k-loop (no load in flight at a wgmma fence). Block
        // scales were applied at each promotion.
        const float alpha = FP8 && !BLOCK ? sa * __ldg(scale_b + sb_step * gt.g) : 1.0f;
        // DIRECT: the group's rows as the epilogue's M (rows >= gt.rows are not stored), out offset to
        // the group's first row. TMA: rows of out itself (the map's), the block lies inside the group.
        const EpilogueArgs<DirectStores<Tr>> dep{alpha, 0.0f, nullptr, 0, 0, nullptr, Out + (long long)gt.row0 * ldo,
                                                 ldo, gt.rows, N};
        const EpilogueArgs<Tr> tep{alpha, 0.0f, nullptr, 0, 0, nullptr, Out, ldo, limit, N};
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi) {
            const int r = gt.m * BM + (Tr::first_block(consumer) + mi) * 64;  // the block's first row in the group
            if (!NO_ROW_SKIP && r >= gt.rows) continue;  // past the group's rows: nothing to store
            if (Tr::DIRECT || r + 64 > gt.rows) {
                // The slab this piece writes may still be read by a TMA store two pieces back.
                if (!Tr::DIRECT && t == 0) tma_store_wait_read<0>();
                store_block<DirectStores<Tr>>(acc[mi], r, gt.n * BN, dep, slabs, pieces, nullptr, nullptr, t,
                                              consumer);
            } else {
                store_block<Tr>(acc[mi], gt.row0 + r, gt.n * BN, tep, slabs, pieces, &tmC, &tmCt, t, consumer);
            }
        }
    }
    pdl_trigger_late();  // this CTA's last tile is stored or on its way: the next kernel may be scheduled
    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();  // the slabs stay valid until the stores read them
}
