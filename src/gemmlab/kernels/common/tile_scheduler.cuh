// Which (tile, k-range) units a persistent CTA works on, for the three schedules of the engine kernel.
// The producer warp and the consumer warpgroups each walk their own copy of the scheduler through the
// same sequence, so they agree on every unit without talking to each other.
//
//  * DATA_PARALLEL (and PINGPONG): CTA b takes whole tiles b, b + grid, b + 2 grid, ...
//  * SPLIT_K: one unit per CTA; the `splits` CTAs of a tile form one thread-block cluster (CTA u is
//    tile u / splits, k-range u % splits of ceil(k_iters / splits) k-steps) and reduce through DSMEM.
//  * STREAM_K (hybrid): the first dp_tiles = tiles - sk_tiles tiles go data-parallel (whole waves, the
//    plan makes dp_tiles a multiple of the grid); the k-steps of the last sk_tiles tiles, laid end to
//    end (tile-major), are cut into sk_ctas contiguous, equal (+-1) ranges, one per CTA b < sk_ctas, and
//    each CTA runs its stream-K range after its data-parallel tiles (every CTA has as many: whole waves,
//    so the waves start in step; with the ranges first, deep-K plans ran up to 2x slower on an H100).
//    A range that starts inside a tile (k_begin > 0) makes that CTA a *contributor*: it leaves its
//    partial sum in the workspace (slot b).
//    The CTA whose range holds the tile's k = 0 is its *owner*: it adds the contributors' partials in
//    CTA order (b + 1, b + 2, ...) to its own and stores the tile. The ranges depend only on the plan,
//    so every run adds the same numbers in the same order: bitwise deterministic. A contributor's
//    partial is always the first unit of its range (later units start at k = 0), so a CTA writes at
//    most one partial and the owner, whose k = 0 part is the last unit of its range, rarely waits (its
//    contributors reach their ranges as their data-parallel waves end, as it does).
//  * SPLIT_K_GLOBAL: stream-K's hybrid with sk_ctas = splits x sk_tiles, so the ranges are aligned to
//    the tiles: CTA b < sk_ctas runs k-steps [r k / splits, (r + 1) k / splits) (r = b % splits) of
//    streamed tile b / splits: one unit, no CTA straddles two tiles. Its `splits` CTAs reduce the tile together
//    through the global workspace (reduction.cuh, gsk_reduce_store): no cluster, so no co-residency limit.
//    A CTA runs its split unit after its data-parallel tiles, as stream-K does, so the unit is its last
//    and its reduction may use the drained ring (GSK_BULK) while no load is in flight.
#pragma once

// GSK_PAIRED (a probe's switch, 0 = off): SPLIT_K_GLOBAL CTAs 2i and 2i + 1 run the same k-range of two
// neighbouring streamed tiles (sharing a panel of A or B) instead of two k-ranges of one tile. A plain
// launch puts CTAs 2i and 2i + 1 on the two SMs of one TPC.
#ifndef GSK_PAIRED
#define GSK_PAIRED 0
#endif

// PINGPONG: data-parallel tiles, whole tiles handed to the two consumer warpgroups in turn (gemm.cu).
enum Schedule { DATA_PARALLEL = 0, SPLIT_K = 1, STREAM_K = 2, PINGPONG = 3, SPLIT_K_GLOBAL = 4 };
enum UnitKind { UNIT_WHOLE = 0, UNIT_CONTRIBUTOR = 1, UNIT_OWNER = 2, UNIT_SPLIT = 3 };

struct WorkUnit {
    int tile;     // index into the tile order table
    int k_begin;  // first and one-past-last 64-deep k-step
    int k_end;
    int kind;     // UnitKind
    int split;    // SPLIT_K: this CTA's rank in the tile's cluster
};

// Launch-time facts of the schedule (kernel arguments; the plan computes them on the host).
struct ScheduleArgs {
    int splits;   // SPLIT_K: CTAs per tile (== cluster size); SPLIT_K_GLOBAL: CTAs per streamed tile
    int sk_tiles; // STREAM_K, SPLIT_K_GLOBAL: tiles whose k-steps are streamed
    int sk_ctas;  // STREAM_K, SPLIT_K_GLOBAL: CTAs that share them (<= grid; SPLIT_K_GLOBAL: splits x sk_tiles)
};

template <int SCHED>
struct TileScheduler {
    static constexpr bool STREAMED = SCHED == STREAM_K || SCHED == SPLIT_K_GLOBAL;
    int num_tiles, k_iters;
    ScheduleArgs args;
    int next_dp;           // next data-parallel tile of this CTA
    long long sk_it, sk_end;  // STREAM_K: this CTA's remaining range of streamed k-steps

    __device__ __forceinline__ TileScheduler(int tiles, int k_iters_, ScheduleArgs a)
        : num_tiles(tiles), k_iters(k_iters_), args(a), next_dp(blockIdx.x), sk_it(0), sk_end(0) {
        if constexpr (STREAMED) {
            if ((int)blockIdx.x < a.sk_ctas) {
                sk_it = sk_begin(unit_cta());
                sk_end = sk_begin(unit_cta() + 1);
            }
        }
    }

    // The CTA index the streamed ranges are cut by: blockIdx.x, or with GSK_PAIRED its pair-interleaved
    // image (a bijection on each group of 2 x splits CTAs; a last odd tile keeps its CTAs).
    __device__ __forceinline__ int unit_cta() const {
        const int b = (int)blockIdx.x;
        if constexpr (SCHED == SPLIT_K_GLOBAL && GSK_PAIRED) {
            const int S = args.splits, g = b / (2 * S), w = b % (2 * S);
            if (b < args.sk_ctas && 2 * g + 1 < args.sk_tiles) return (2 * g + (w & 1)) * S + (w >> 1);
        }
        return b;
    }

    // First streamed k-step of CTA j's range (j = sk_ctas: the end of all of them).
    __device__ __forceinline__ long long sk_begin(int j) const {
        return (long long)j * args.sk_tiles * k_iters / args.sk_ctas;
    }

    __device__ __forceinline__ int dp_tiles() const { return num_tiles - (STREAMED ? args.sk_tiles : 0); }

    // STREAM_K: one past the last streamed k-step of `tile`. The owner adds the partials of CTAs
    // b + 1, b + 2, ... while sk_begin(j) < streamed_end(tile): exactly the CTAs whose first unit lies in it.
    __device__ __forceinline__ long long streamed_end(int tile) const {
        return (long long)(tile - dp_tiles() + 1) * k_iters;
    }

    // The next unit of this CTA; false when it has none left.
    __device__ __forceinline__ bool next(WorkUnit& u) {
        if constexpr (SCHED == SPLIT_K) {
            if (next_dp < 0) return false;
            const int unit = blockIdx.x;
            u.tile = unit / args.splits;
            u.split = unit % args.splits;
            const int per = (k_iters + args.splits - 1) / args.splits;
            u.k_begin = u.split * per;
            u.k_end = min(k_iters, u.k_begin + per);
            u.kind = UNIT_SPLIT;
            next_dp = -1;  // exactly one unit per CTA
            return u.tile < num_tiles;
        } else {
            if constexpr (STREAMED) {  // the data-parallel tiles first, then the streamed range
                if (next_dp < dp_tiles()) return whole_tile(u);
                if (sk_it < sk_end) {
                    const int s = (int)(sk_it / k_iters);  // streamed tile index
                    u.tile = dp_tiles() + s;
                    u.k_begin = (int)(sk_it - (long long)s * k_iters);
                    u.k_end = (int)min((long long)k_iters, u.k_begin + (sk_end - sk_it));
                    u.split = 0;
                    u.kind = u.k_begin > 0 ? UNIT_CONTRIBUTOR : (u.k_end < k_iters ? UNIT_OWNER : UNIT_WHOLE);
                    if constexpr (SCHED == SPLIT_K_GLOBAL) {  // aligned ranges: one unit, rank b % splits
                        u.kind = UNIT_SPLIT;
                        u.split = unit_cta() % args.splits;
                    }
                    sk_it += u.k_end - u.k_begin;
                    return true;
                }
            }
            if (next_dp >= dp_tiles()) return false;
            return whole_tile(u);
        }
    }

    __device__ __forceinline__ bool whole_tile(WorkUnit& u) {
        u.tile = next_dp;
        u.k_begin = 0;
        u.k_end = k_iters;
        u.kind = UNIT_WHOLE;
        u.split = 0;
        next_dp += gridDim.x;
        return true;
    }
};
