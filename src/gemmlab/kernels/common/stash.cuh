// The overlapped epilogue (h12, h11): a consumer packs its finished 64 x BN tile to 16-bit pairs in
// registers and stores it, one 64-column piece at a time, during the first k-steps of its next tile,
// each piece right after that k-step's wgmma is issued: stmatrix, the named barriers and the TMA store
// then run while the tensor cores work. The pieces go through two 8 KB slabs per consumer in turn.
#pragma once
#include "ptx.cuh"
#include "stmatrix.cuh"
#include "tile.cuh"
#include "tma.cuh"

// A finished tile waiting to be stored: pairs of 16-bit values in the accumulator fragment's order
// (st[k] holds fragment values 2k and 2k + 1), and where the tile goes.
template <int BN>
struct Stash {
    u32 st[BN / 4];
    int m0, n0;    // the consumer's 64-row block of C: row m0, column n0
    bool pending;  // st holds a tile not stored yet
    int piece;     // pieces stored so far: their parity picks the slab
};

// Packed columns [COL0, COL0 + 64) into a swizzled 64 x 64 slab, one stmatrix per 16 x 16 piece (the
// same addressing as store_fragment_smem_sw128).
template <int BN, int COL0>
__device__ __forceinline__ void stash_to_slab(const u32 (&st)[BN / 4], void* slab, int t) {
    const int warp = t / 32, lane = t % 32, m = lane / 8;
    const int row = warp * 16 + (m & 1) * 8 + lane % 8;
    const u32 base = smem_u32(slab);
#pragma unroll
    for (int j = COL0 / 8; j < (COL0 + 64) / 8; j += 2) {
        const u32 addr = base + sw128_offset(row, 8 * (j + (m >> 1)) - COL0);
        stmatrix_x4(addr, st[2 * j], st[2 * j + 1], st[2 * j + 2], st[2 * j + 3]);
    }
}

// Piece P through the slab the piece counter's parity picks. That slab was last read by the store two
// pieces back, so one newer store may still be in flight (wait_group.read 1).
template <int BN, int P>
__device__ __forceinline__ void store_piece(Stash<BN>& c, unsigned char* slabs, const CUtensorMap* tmC, int t,
                                            int consumer) {
    unsigned char* slab = slabs + (c.piece & 1) * 64 * 128;
    if (t == 0) tma_store_wait_read<1>();
    named_barrier_sync(1 + consumer, 128);
    stash_to_slab<BN, P * 64>(c.st, slab, t);
    fence_proxy_async_smem();  // stmatrix writes -> visible to the TMA (async proxy)
    named_barrier_sync(1 + consumer, 128);
    if (t == 0) {
        tma_store_2d(tmC, slab, c.n0 + P * 64, c.m0);
        tma_store_commit();
    }
    ++c.piece;
}

// Pieces P.. of a pending tile, each after k-step P of the new tile (kstep(P) when the tile has that many
// k-steps; the piece is stored either way).
template <int BN, int P, typename KStep>
__device__ __forceinline__ void ksteps_with_pieces(Stash<BN>& c, int k_iters, KStep&& kstep, unsigned char* slabs,
                                                   const CUtensorMap* tmC, int t, int consumer) {
    if constexpr (P < BN / 64) {
        if (P < k_iters) kstep(P);
        if (c.pending) store_piece<BN, P>(c, slabs, tmC, t, consumer);
        ksteps_with_pieces<BN, P + 1>(c, k_iters, kstep, slabs, tmC, t, consumer);
    }
}

// The last tile: nothing left to overlap with.
template <int BN, int P = 0>
__device__ __forceinline__ void flush_pieces(Stash<BN>& c, unsigned char* slabs, const CUtensorMap* tmC, int t,
                                             int consumer) {
    if constexpr (P < BN / 64) {
        store_piece<BN, P>(c, slabs, tmC, t, consumer);
        flush_pieces<BN, P + 1>(c, slabs, tmC, t, consumer);
    }
}
