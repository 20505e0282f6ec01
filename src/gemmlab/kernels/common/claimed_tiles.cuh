// Data-parallel tiles in claim order: a tile scheduler part beside tile_scheduler.cuh's (same WorkUnit,
// same next(u) walk), for the kernels that take it (gemm_grouped.cu's CLAIM). Device-only (atomics,
// mbarriers), so kept out of tile_scheduler.cuh, which the host emulation compiles.
#pragma once
#include "mbarrier.cuh"
#include "tile_scheduler.cuh"

// Data-parallel tiles in claim order (ClaimedTiles): CTA b's first tile is b, every later one it claims from a
// global counter (atomicAdd), so the tiles in flight at any moment are a window of consecutive indices
// however unevenly the CTAs run. With the static stride (b, b + grid, ...) a CTA whose tiles cost more
// (the grouped kernel's blocks that cross a group's end are stored by the threads) drifts away from the
// CTAs it shares operands with, and the weight's k-slices leave L2 between their readers.
// The producer thread claims each tile and publishes it in a two-slot queue in shared memory (TileQueue);
// every consumer thread reads it from there, so producer and consumers walk the same units. The counter
// is two ints of a zeroed global buffer, (claims, CTAs done): the CTA that finishes last (every other one
// has made its last claim) sets both back to 0, so the next launch on the stream finds them zeroed (a
// kernel that begins with griddepcontrol.wait sees them only after this grid completed).
// Which tile a CTA runs changes from run to run, what a tile computes does not: results stay bitwise
// deterministic.

struct TileQueue {
    u64 full[2];
    u64 empty[2];
    int tile[2];

    // One thread; `readers`: the consumer threads that read every claimed tile.
    __device__ __forceinline__ void init(u32 readers) {
        for (int s = 0; s < 2; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], readers);
        }
        fence_mbarrier_init();
    }
};

struct ClaimedTiles {
    TileQueue* q;
    int* counter;  // counter[0]: tiles claimed past the first wave, counter[1]: CTAs done
    int num_tiles, k_iters, i;
    bool producer;

    __device__ __forceinline__ ClaimedTiles(TileQueue* q_, int* counter_, int tiles, int k_iters_, bool producer_)
        : q(q_), counter(counter_), num_tiles(tiles), k_iters(k_iters_), i(0), producer(producer_) {}

    __device__ __forceinline__ bool next(WorkUnit& u) {
        const int s = i & 1;
        const u32 phase = (u32)(i >> 1) & 1;  // this use of slot s
        int tile;
        if (producer) {
            mbar_wait_parity(&q->empty[s], phase ^ 1);  // the consumers read the slot's previous tile
            tile = i == 0 ? (int)blockIdx.x : (int)gridDim.x + atomicAdd(counter, 1);
            if (tile >= num_tiles) tile = -1;  // the end, for everyone
            q->tile[s] = tile;
            mbar_arrive_notoken(&q->full[s]);  // release: the id is visible to the threads that wait on it
            if (tile < 0) done();
        } else {
            mbar_wait_parity(&q->full[s], phase);
            tile = q->tile[s];
            mbar_arrive_notoken(&q->empty[s]);
        }
        ++i;
        if (tile < 0) return false;
        u.tile = tile;
        u.k_begin = 0;
        u.k_end = k_iters;
        u.kind = UNIT_WHOLE;
        u.split = 0;
        return true;
    }

    // After this CTA's last claim: the last CTA of the grid to get here zeroes the counter.
    __device__ __forceinline__ void done() {
        __threadfence();  // this CTA's claims are ordered before its "done"
        if (atomicAdd(counter + 1, 1) == (int)gridDim.x - 1) {
            atomicExch(counter, 0);
            atomicExch(counter + 1, 0);
        }
    }
};
