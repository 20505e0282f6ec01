// Everything that is fixed when the engine kernel is instantiated, by name. gemmlab.planner.Plan writes the
// template arguments (Plan.template_args); the derived constants below are what the parts use.
#pragma once
#include "ptx.cuh"
#include "tile_scheduler.cuh"

#ifndef SPLIT_PUSH_ON
#define SPLIT_PUSH_ON 1
#endif
#ifndef GSK_BULK_ON
#define GSK_BULK_ON 1
#endif

template <typename TIn, typename TOut, typename TBias,  // operand, output and bias element types
          int kBM, int kBN, int kStages,                // tile (rows x columns) and ring depth
          bool kAmn, bool kBmn,                         // operand stored MN-major (else K-major)
          bool kBias, bool kC, int kAct,                // epilogue: + bias[n], + beta * C, activation
          bool kDirect,                                 // output rows not 16-byte aligned: threads store
          int kSchedule,                                // Schedule: data-parallel, split-K, stream-K, ping-pong,
                                                        // global split-K
          bool kTransOut = false,                       // swap AB: the tile is a block of out^T (see below)
          int kMcast = 1,                               // CTAs per cluster sharing B's tile by TMA multicast
          int kPrefetch = 0,                            // L2 prefetch distance in k-steps (0: none)
          bool kColSplit = false,                       // 64-row tiles: two consumers, half the columns each
          bool kEvictWeight = false>                    // the weight's loads ask the L2 to evict them first
struct GemmTraits {
    using T = TIn;
    using TO = TOut;
    using TBIAS = TBias;
    static constexpr int BM = kBM, BN = kBN, BK = 64, STAGES = kStages;
    static constexpr bool A_MN = kAmn, B_MN = kBmn;
    static constexpr bool HAS_BIAS = kBias, HAS_C = kC, DIRECT = kDirect;
    static constexpr int ACT = kAct, SCHEDULE = kSchedule;
    // TRANS_OUT (swap AB, gemmlab.planner.Plan.swap_ab): the kernel computes out^T = W @ A^T, W (N x K) as its
    // A operand and the tokens A (M x K) as its B, so tile element (r, c) is out[c][r]: stored transposed
    // (epilogue_store.cuh), bias per tile row, beta * C through swapped strides. At few tokens the weight
    // then fills the wgmma's 64 rows and the tokens its narrow n.
    static constexpr bool TRANS_OUT = kTransOut;
    // MCAST = 2 (data-parallel, K-major B): clusters of two CTAs on vertically adjacent tiles (rows m and
    // m + BM, the same columns) with the same B tile. Each CTA loads half of B's rows and multicasts
    // them to both (PTX ISA "cp.async.bulk.tensor ... .multicast::cluster"), so the L2 supplies B once
    // a pair: (BM + BN / 2) rows a k-step a CTA instead of BM + BN. A slot is then written by both
    // CTAs' loads, so it is free only when the consumers of both have released it (each consumer
    // arrives on its own CTA's and the peer's "empty" barrier). The tile rows are padded to whole pairs;
    // a pair's second tile past M computes on zero-filled rows and stores nothing.
    static constexpr int MCAST = kMcast;
    // PREFETCH = d > 0 (K-major operands, no multicast): with the loads of k-step kt the producer asks the
    // L2 for both boxes of k-step kt + d (cp.async.bulk.prefetch.tensor), so a weight streaming from HBM
    // has d more k-steps of requests in flight than the ring's shared memory holds.
    static constexpr int PREFETCH = kPrefetch;
    // EVICT_WEIGHT (gemmlab.planner.Plan.evict_weight: plans whose tokens are one tile, so every weight box
    // is read by one CTA and never again): the weight's TMA loads carry an L2 evict-first policy
    // (tma.cuh L2Hints), so the stream of weight lines passing through the L2 does not push out the
    // tokens, which every CTA along the weight re-reads. The weight is B, or A with TRANS_OUT.
    static constexpr bool EVICT_WEIGHT = kEvictWeight;

    // 64-row tiles: one consumer warpgroup. 128: two, 64 rows each. 256: two, 128 rows each, every k16
    // step issuing two m64 wgmmas against the same B slab. PINGPONG (64 or 128 rows): two consumers, each
    // with whole tiles of its own, in turn (one's epilogue runs under the other's k-loop).
    // COL_SPLIT (64-row data-parallel tiles, K-major B, BN a multiple of 32, no multicast): two consumers
    // share the tile's 64 rows, each with the wgmmas and the epilogue of half its columns (64 x BN / 2 from
    // B's rows consumer x BN / 2 ..): two chains of dependent wgmmas in flight instead of one. cuBLAS's
    // 64-row tiles run three warpgroups, one tile a CTA (64 x 96 at 1024x768x3072: 384 threads at 168
    // registers, grid = tiles; Nsight Compute, probe_ncu.py), where ours left the tensor pipe idler (40.9%
    // against 47.0% active). Measured 0.97x the one-consumer tile's speed (col_split_probe.jsonl): a probe's
    // knob, not offered (gemmlab.planner.COL_SPLIT_OFFERED).
    static constexpr bool PING_PONG = kSchedule == PINGPONG;
    static constexpr bool COL_SPLIT = kColSplit;
    static constexpr int CONSUMERS = BM == 64 && !PING_PONG && !COL_SPLIT ? 1 : 2;
    static constexpr int MI = PING_PONG || COL_SPLIT ? BM / 64 : BM / (64 * CONSUMERS);  // m64 blocks per consumer
    static constexpr int CN = COL_SPLIT ? BN / 2 : BN;  // a consumer's columns
    // Arrivals that free a ring slot: every consumer reads every slot, except in ping-pong (its owner).
    static constexpr int SLOT_READERS = PING_PONG ? 1 : CONSUMERS;
    // The first of a consumer's m64 blocks in its tile, and its first column.
    __device__ static constexpr int first_block(int consumer) { return PING_PONG || COL_SPLIT ? 0 : consumer * MI; }
    __device__ static constexpr int first_col(int consumer) { return COL_SPLIT ? consumer * CN : 0; }
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    static constexpr int CONSUMER_REGS = 232;  // two consumers: setmaxnreg, 128 x (40 + 2 x 232) <= 64 K
    // The warpgroup index read warp-uniformly (ptx.cuh warpgroup_index: the k-loop's wgmma descriptors in
    // uniform registers) where the epilogue is plain (16-bit output, TMA-stored, no bias, C or activation)
    // and the schedule not streamed. Elsewhere it spilled or bought nothing (compile sweeps, session 20):
    // the streamed schedules keep the loop's descriptors in vector registers anyway (their divergent partial
    // stores) and 128 x 256 stream-K spilled 24 bytes; a bias spilled 4-720 bytes from 120 accumulators a
    // thread up (128 x 240, 256 x 160, ping-pong 128 x 144), an activation there 4-8, fp32 output with
    // bias and beta * C 56 at 128 x 128. Plain epilogues spilled nowhere.
    static constexpr bool UNIFORM_WG = SCHEDULE != STREAM_K && SCHEDULE != SPLIT_K_GLOBAL && !kBias && !kC &&
                                       kAct == 0 && !kDirect && sizeof(TOut) == 2;

    static constexpr u32 A_STAGE = BM * BK * sizeof(T), B_STAGE = BN * BK * sizeof(T);
    static constexpr u32 STAGE_BYTES = A_STAGE + B_STAGE;

    // Output pieces: 64 rows x PIECE columns (one 128-byte swizzle row) through two slabs per consumer;
    // the last TAIL = BN % PIECE columns go through an unswizzled piece of their own width.
    static constexpr int PIECE = sizeof(TO) == 4 ? 32 : 64;
    static constexpr int FULL_PIECES = CN / PIECE, TAIL = CN % PIECE;  // per consumer
    static constexpr u32 SLAB_BYTES = 64 * 128;
    static constexpr u32 SLABS_BYTES = SCHEDULE == SPLIT_K ? 0 : CONSUMERS * 2 * SLAB_BYTES;

    // SPLIT_K: each CTA's BM x BN fp32 partial, row stride LDP floats, over its drained stages.
    static constexpr int LDP = BN + 8;
    // SPLIT_PUSH: the ranks copy each other their row slices (reduction.cuh) where the partial and the
    // receive slots (at most (splits - 1) x ceil(BM / splits) <= BM + 7 rows) fit the drained stages.
    static constexpr bool SPLIT_PUSH = SPLIT_PUSH_ON && SCHEDULE == SPLIT_K &&
                                       (2 * BM + 7) * LDP * 4 <= STAGES * (BM + BN) * BK * (int)sizeof(T);
    // GSK_BULK: global split-K's ranks exchange the same row slices through the global workspace by bulk
    // copies (reduction.cuh gsk_bulk_exchange) where the partial and the receive slots fit likewise;
    // else each thread stores and loads its fragments (gsk_reduce_store).
    static constexpr bool GSK_BULK = GSK_BULK_ON && SCHEDULE == SPLIT_K_GLOBAL &&
                                     (2 * BM + 7) * LDP * 4 <= STAGES * (BM + BN) * BK * (int)sizeof(T);

    static_assert(BM == 64 || BM == 128 || BM == 256, "tile heights 64, 128, 256");
    static_assert(!PING_PONG || BM <= 128, "ping-pong consumers hold whole tiles: 64 or 128 rows");
    static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "tile widths: wgmma n in steps of 16 up to 256");
    static_assert(!B_MN || BN % 64 == 0, "MN-major B is loaded in 64-column boxes");
    static_assert(TAIL % 16 == 0, "tail pieces are whole 16-column stmatrix blocks");
    static_assert(MCAST == 1 || (MCAST == 2 && SCHEDULE == DATA_PARALLEL && !B_MN && BN % (8 * MCAST) == 0),
                  "B multicast: pairs of data-parallel CTAs, K-major B, each half whole 8-row swizzle atoms");
    static_assert(PREFETCH == 0 || (PREFETCH > 0 && MCAST == 1 && !A_MN && !B_MN),
                  "L2 prefetch: K-major operands (one box each), no multicast");
    static_assert(!EVICT_WEIGHT || MCAST == 1, "evict-first weight loads: not the multicast loads");
    static_assert(!COL_SPLIT || (BM == 64 && SCHEDULE == DATA_PARALLEL && !B_MN && BN % 32 == 0 && MCAST == 1),
                  "column split: 64-row data-parallel tiles, K-major B, halves of whole 16-column wgmmas");
    static_assert(!TRANS_OUT || sizeof(TO) == 2, "transposed stores: 16-bit output (a 128-byte slab row = 64 rows)");
    static_assert(SCHEDULE != SPLIT_K || BM * LDP * 4 <= STAGES * STAGE_BYTES, "split-K partial must fit the stages");
    static_assert(1024 + STAGES * STAGE_BYTES + SLABS_BYTES <= 227 * 1024 - 256, "shared memory");
};
