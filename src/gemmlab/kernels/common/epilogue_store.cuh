// The engine kernel's epilogue: act(alpha * acc + beta * C + bias) in fp32 on a consumer's 64-row block,
// converted to the output type and stored in pieces of 64 rows x PIECE columns (one 128-byte swizzle
// row) through two alternating slabs per consumer, then a TMA store (PTX ISA "cp.async.bulk.tensor",
// bulk_group completion). The last BN % PIECE columns (BN = 80, 96, ...) go through an unswizzled piece
// of their own width and a second tensor map, so no store ever writes past the tile. DIRECT outputs
// (rows not 16-byte aligned: no TMA) are stored from the slab by the threads, a row per warp step.
// TRANS_OUT (swap AB: the tile is a block of out^T, GemmTraits): stmatrix .trans writes each piece of 64
// tile rows x W tile columns into the slab as W output rows x 64 output columns (128 bytes of 16-bit
// values: one swizzle row), so the TMA store (a map over the real output, box 64 x W, 128-byte swizzle
// for the tail piece too) and the DIRECT row stores write whole 128-byte runs of output rows.
#pragma once
#include "epilogue.cuh"
#include "stmatrix.cuh"
#include "tile.cuh"
#include "tma.cuh"

// Tr::TRANS_OUT where the traits define it (GemmTraits), else false (the FP8 and grouped traits).
template <class Tr, class = void>
struct TransOutOf {
    static constexpr bool value = false;
};
template <class Tr>
struct TransOutOf<Tr, decltype(void(Tr::TRANS_OUT))> {
    static constexpr bool value = Tr::TRANS_OUT;
};
template <class Tr>
constexpr bool kTransOut = TransOutOf<Tr>::value;

template <class Tr>
struct EpilogueArgs {
    float alpha, beta;
    const typename Tr::TO* Cin;  // beta * C: tile element (r, c) at Cin[r * ldc_row + c * ldc_col]
    long long ldc_row, ldc_col;
    const typename Tr::TBIAS* bias;
    typename Tr::TO* Out;  // row stride ldo elements; TRANS_OUT: tile element (r, c) at Out[c * ldo + r]
    long long ldo;
    int M, N;  // the tile grid's rows and columns (TRANS_OUT: out's columns and rows)

    // The fused epilogue at tile element (r, c). The bias runs along out's columns: the tile's columns,
    // or its rows under TRANS_OUT.
    __device__ __forceinline__ float apply(float acc, int r, int c) const {
        float x = alpha * acc;
        if constexpr (Tr::HAS_C) {
            if (r < M && c < N) x += beta * to_float(Cin[r * ldc_row + c * ldc_col]);
        }
        if constexpr (Tr::HAS_BIAS) {
            if constexpr (kTransOut<Tr>) {
                if (r < M) x += to_float(bias[r]);
            } else {
                if (c < N) x += to_float(bias[c]);
            }
        }
        return activate<Tr::ACT>(x);
    }

    // Where tile element (r, c) goes.
    __device__ __forceinline__ typename Tr::TO* out_at(int r, int c) const {
        return kTransOut<Tr> ? Out + (long long)c * ldo + r : Out + (long long)r * ldo + c;
    }
};

// Byte offset of element (row, col) in a piece W columns wide: 128-byte swizzled (W x size = 128 B) or
// plain rows of W elements.
template <typename TO, int W, bool SWZ>
__device__ __forceinline__ u32 piece_offset(int row, int col) {
    if constexpr (SWZ) return row * 128 + ((((col * sizeof(TO)) / 16) ^ (row % 8)) * 16) + (col * sizeof(TO)) % 16;
    return (row * W + col) * sizeof(TO);
}

// DIRECT: a ROWS x W piece from its slab to Out, bounds-checked. Warp w stores rows w ROWS / 4 ..
// (w + 1) ROWS / 4 - 1, its lanes one row per instruction (4-byte pairs of 16-bit values where the row
// allows), so the stores coalesce.
template <typename TO, int W, bool SWZ, int ROWS = 64>
__device__ __forceinline__ void store_piece_rows(const unsigned char* slab, TO* __restrict__ Out, long long ldo,
                                                 int row0, int col0, int M, int N, int t) {
    static_assert(ROWS % 4 == 0, "rows split over the four warps");
    const int warp = t / 32, lane = t % 32, valid = min(W, N - col0);
#pragma unroll 4
    for (int rr = 0; rr < ROWS / 4; ++rr) {
        const int r = warp * (ROWS / 4) + rr, gr = row0 + r;
        if (gr >= M || valid <= 0) break;  // warp-uniform: rows only grow
        TO* dst = Out + (long long)gr * ldo + col0;
        if constexpr (sizeof(TO) == 4) {
            if (lane < valid) dst[lane] = *reinterpret_cast<const TO*>(slab + piece_offset<TO, W, SWZ>(r, lane));
        } else if (reinterpret_cast<size_t>(dst) % 4 == 0) {
            const int c = 2 * lane;
            if (c + 1 < valid) {
                *reinterpret_cast<u32*>(dst + c) = *reinterpret_cast<const u32*>(slab + piece_offset<TO, W, SWZ>(r, c));
            } else if (c < valid) {
                dst[c] = *reinterpret_cast<const TO*>(slab + piece_offset<TO, W, SWZ>(r, c));
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int c = lane + 32 * h;
                if (c < valid) dst[c] = *reinterpret_cast<const TO*>(slab + piece_offset<TO, W, SWZ>(r, c));
            }
        }
    }
}

// One stmatrix x4 of a 16 x 16 fragment block: values v[4j .. 4j + 7] (rows r, r + 8 of columns 8j .., then
// of columns 8j + 8 ..) packed to 16-bit pairs, the four 8x8 matrices in that order; TRANS: .trans.
template <bool TRANS, typename TO, int V>
__device__ __forceinline__ void stmatrix_16x16(u32 addr, const float (&v)[V], int j) {
    const u32 r0 = pack2(v[4 * j + 0], v[4 * j + 1], (TO*)nullptr), r1 = pack2(v[4 * j + 2], v[4 * j + 3], (TO*)nullptr);
    const u32 r2 = pack2(v[4 * j + 4], v[4 * j + 5], (TO*)nullptr), r3 = pack2(v[4 * j + 6], v[4 * j + 7], (TO*)nullptr);
    if constexpr (TRANS) {
        stmatrix_x4_trans(addr, r0, r1, r2, r3);
    } else {
        stmatrix_x4(addr, r0, r1, r2, r3);
    }
}

// TRANS_OUT: the piece's transpose (tile columns c0 .. c0 + W - 1 = out rows, tile rows row0 .. row0 + 63
// = out columns) into the slab as W rows of 128 swizzled bytes, then to out: a TMA box of 64 columns x W
// rows at (row0, c0), clipped at out's edges, or DIRECT rows. stmatrix .trans (PTX ISA "stmatrix"):
// matrix mi = lane / 8 of step j holds tile rows 16 warp + 8 (mi & 1) .. + 7 and tile columns
// 8 (j + mi / 2) .. + 7, and lane l % 8 addresses its stored row l % 8 (= tile column 8 (j + mi / 2) + l % 8),
// whose 8 values (the matrix's tile rows) are one 16-byte chunk; the 8 rows of a matrix land in 8
// different chunks of the swizzle: no bank conflicts. The caller has synchronised the slab's last reader.
template <class Tr, int W>
__device__ __forceinline__ void store_piece_transposed(const float (&v)[W / 2], int row0, int c0,
                                                       const EpilogueArgs<Tr>& ep, unsigned char* slab,
                                                       const CUtensorMap* tm, int t, int consumer) {
    using TO = typename Tr::TO;
    static_assert(sizeof(TO) == 2 && W % 16 == 0, "16-bit output, whole 16-column stmatrix blocks");
    const int warp = t / 32, lane = t % 32, mi = lane / 8;
#pragma unroll
    for (int j = 0; j < W / 8; j += 2) {
        const u32 addr = smem_u32(slab) + piece_offset<TO, 64, true>(8 * (j + (mi >> 1)) + lane % 8,
                                                                     warp * 16 + (mi & 1) * 8);
        stmatrix_16x16<true, TO>(addr, v, j);
    }
    if constexpr (Tr::DIRECT) {
        named_barrier_sync(1 + consumer, 128);  // the piece is in the slab
        // out rows c0 .. (below N: the tile's columns), out columns row0 .. (below M: the tile's rows)
        store_piece_rows<TO, 64, true, W>(slab, ep.Out, ep.ldo, c0, row0, ep.N, ep.M, t);
    } else {
        fence_proxy_async_smem();  // generic-proxy writes read next by the TMA (see store_piece)
        named_barrier_sync(1 + consumer, 128);
        if (t == 0) {
            tma_store_2d(tm, slab, row0, c0);
            tma_store_commit();
        }
    }
}

// One piece: columns [col0, col0 + W) of the block (fragment values from index col0 / 2 on) at tile
// column n0, rows row0 .. row0 + 63. `pieces` counts this consumer's pieces: its parity picks the slab,
// and the store two pieces back (same slab) must have finished reading it (wait_group.read 1).
template <class Tr, int W, bool SWZ, int V>
__device__ __forceinline__ void store_piece(const float (&d)[V], int col0, int row0, int n0,
                                            const EpilogueArgs<Tr>& ep, unsigned char* slabs, int& pieces,
                                            const CUtensorMap* tm, int t, int consumer) {
    using TO = typename Tr::TO;
    unsigned char* slab = slabs + (pieces & 1) * Tr::SLAB_BYTES;
    if constexpr (!Tr::DIRECT) {
        if (t == 0) tma_store_wait_read<1>();
    }
    // TMA: thread 0's wait is done. DIRECT: every thread has read this slab's piece two pieces back.
    named_barrier_sync(1 + consumer, 128);
    float v[W / 2];
    const int rt = row0 + frag_row(t);
#pragma unroll
    for (int j = 0; j < W / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            const int c = n0 + col0 + 8 * j + frag_col(t) + (h & 1);
            v[4 * j + h] = ep.apply(d[col0 / 2 + 4 * j + h], h < 2 ? rt : rt + 8, c);
        }
    }
    if constexpr (kTransOut<Tr>) {
        store_piece_transposed<Tr, W>(v, row0, n0 + col0, ep, slab, tm, t, consumer);
        ++pieces;
        return;
    }
    if constexpr (sizeof(TO) == 4) {  // fp32: float2 pairs at (row, col) and (row + 8, col)
#pragma unroll
        for (int j = 0; j < W / 8; ++j) {
            const int col = 8 * j + frag_col(t), r = frag_row(t);
            st_shared_f32x2(smem_u32(slab) + piece_offset<TO, W, SWZ>(r, col), v[4 * j], v[4 * j + 1]);
            st_shared_f32x2(smem_u32(slab) + piece_offset<TO, W, SWZ>(r + 8, col), v[4 * j + 2], v[4 * j + 3]);
        }
    } else {  // 16-bit: one stmatrix per 16 x 16 block (PTX ISA "stmatrix"), lane l addresses row l % 8
        const int warp = t / 32, lane = t % 32, mi = lane / 8;
        const int srow = warp * 16 + (mi & 1) * 8 + lane % 8;
#pragma unroll
        for (int j = 0; j < W / 8; j += 2) {
            const u32 addr = smem_u32(slab) + piece_offset<TO, W, SWZ>(srow, 8 * (j + (mi >> 1)));
            stmatrix_16x16<false, TO>(addr, v, j);
        }
    }
    if constexpr (Tr::DIRECT) {
        named_barrier_sync(1 + consumer, 128);  // the piece is in the slab
        store_piece_rows<TO, W, SWZ>(slab, ep.Out, ep.ldo, row0, n0 + col0, ep.M, ep.N, t);
    } else {
        // Generic-proxy writes (st.shared, stmatrix) read next by the TMA (async proxy): each writing
        // thread fences before the barrier (PTX ISA "Memory Consistency Model: proxies", fence.proxy.async).
        fence_proxy_async_smem();
        named_barrier_sync(1 + consumer, 128);
        if (t == 0) {
            tma_store_2d(tm, slab, n0 + col0, row0);
            tma_store_commit();
        }
    }
    ++pieces;
}

// A consumer's 64-row block (rows row0 ..) of 2 V columns at tile column n0 (the tile's BN, or a column
// split's half): full pieces, then the tail.
template <class Tr, int V>
__device__ __forceinline__ void store_block(const float (&d)[V], int row0, int n0, const EpilogueArgs<Tr>& ep,
                                            unsigned char* slabs, int& pieces, const CUtensorMap* tmC,
                                            const CUtensorMap* tmC_tail, int t, int consumer) {
    constexpr int FULL = 2 * V / Tr::PIECE, TAIL = 2 * V % Tr::PIECE;
#pragma unroll
    for (int p = 0; p < FULL; ++p)
        store_piece<Tr, Tr::PIECE, true>(d, p * Tr::PIECE, row0, n0, ep, slabs, pieces, tmC, t, consumer);
    if constexpr (TAIL > 0)
        store_piece<Tr, TAIL, false>(d, FULL * Tr::PIECE, row0, n0, ep, slabs, pieces, tmC_tail, t, consumer);
}
