// Grouped GEMM (mixture-of-experts): which group, rows and tile a linear tile index belongs to.
// One launch covers every group's tiles; the groups' row ranges live in device memory (offsets or counts,
// written by the router on the GPU), so nothing is read on the host and a CUDA graph can replay the launch
// with new ranges. At kernel entry one warp turns the ranges into a table in shared memory:
//   start[g]  first row of group g in A / out (contiguous: its offset; masked: g * capacity)
//   rows[g]   its rows (clamped so that [start, start + rows) stays inside the tensor)
//   first[g]  linear index of its first tile: sum over groups h < g of ceil(rows[h] / BM) * tiles_n
// Then the data-parallel TileScheduler walks tiles 0 .. first[G) as for one GEMM, and `locate` finds a
// tile's group by binary search over `first` (empty groups own no index, so they are never found).
// Within a group the m index runs fastest, in panels of `panel` m-tiles: panel 0's m-tiles for column
// tile 0, 1, ..., then panel 1's. The CTAs working at the same time share B's column tiles (the
// expert's weight, the larger operand in MoE layers), and a panel's rows of A (a few MB) stay in L2
// while its column tiles go by; without panels a group too tall for L2 would stream all its A rows
// from HBM again for every wave. A group of at most `panel` m-tiles is one panel (plain m-fastest); a
// taller one gets ceil(tiles_m / panel) panels of equal height (the host picks `panel`).
#pragma once

enum GroupLayout { GROUPS_CONTIGUOUS = 0, GROUPS_MASKED = 1 };

// Group g's first row (x) and rows (y) from `ranges` (GroupTable::build says how each layout reads them).
template <int LAYOUT>
__device__ __forceinline__ int2 group_range(const int* __restrict__ ranges, int lead, int g, int limit) {
    if constexpr (LAYOUT == GROUPS_MASKED) return make_int2(g * limit, min(max(__ldg(ranges + g), 0), limit));
    const int b = lead ? __ldg(ranges + g) : (g > 0 ? __ldg(ranges + g - 1) : 0);
    const int e = __ldg(ranges + g + lead);
    const int s = min(max(b, 0), limit);
    return make_int2(s, min(max(e, s), limit) - s);
}

// The inclusive sum of x over lanes 0 .. lane of a full warp (shfl.sync.up).
__device__ __forceinline__ int warp_inclusive_sum(int x, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// The group of tile index t (0 <= t < first[G]): the largest g with first[g] <= t (binary search; empty
// groups own no index, so they are never found).
__device__ __forceinline__ int group_of(const int* first, int G, int t) {
    int lo = 0, hi = G - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (first[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Warp 0 (all 32 lanes): every group's row range (group_range), its tile count tiles_of(rows) and the
// linear index of its first tile, 32 groups at a time (a warp scan); record(g, first, start, rows) keeps
// them. Returns the tiles of all groups. The tables' `build`s below are this scan.
template <int LAYOUT, class TilesOf, class Record>
__device__ __forceinline__ int scan_groups(const int* __restrict__ ranges, int lead, int G, int limit, int lane,
                                           TilesOf tiles_of, Record record) {
    int carry = 0;
    for (int base = 0; base < G; base += 32) {
        const int g = base + lane;
        const int2 sr = g < G ? group_range<LAYOUT>(ranges, lead, g, limit) : make_int2(0, 0);
        const int tiles = tiles_of(sr.y);
        const int x = warp_inclusive_sum(tiles, lane);
        if (g < G) record(g, carry + x - tiles, sr.x, sr.y);
        carry += __shfl_sync(0xffffffffu, x, 31);
    }
    return carry;
}

struct GroupTile {
    int row0;  // the group's first row (A and out)
    int rows;  // the group's rows
    int g;     // the group (B's slab)
    int m, n;  // the tile inside the group: rows m * BM .., columns n * BN ..
};

template <int MAX_GROUPS>
struct GroupTable {
    int first[MAX_GROUPS + 1];
    int start[MAX_GROUPS];
    int rows[MAX_GROUPS];

    // Warp 0 (all 32 lanes) only; a __syncthreads() must follow before anyone reads the table.
    // CONTIGUOUS: `ranges` holds offsets; lead = 1: G + 1 boundaries (group g is [ranges[g], ranges[g + 1]));
    // lead = 0: G ends (torch._grouped_mm's offs: group g is [ranges[g - 1], ranges[g]), group 0 from 0).
    // `limit` = total rows of A. Offsets are clamped into [0, limit] and a group ending before it starts
    // is empty: bad offsets give wrong rows, never an access outside A or out.
    // MASKED: `ranges` holds counts; group g is rows [g * limit, g * limit + clamp(counts[g], 0, limit)),
    // limit = the capacity of a slab.
    template <int LAYOUT, int BM>
    __device__ __forceinline__ void build(const int* __restrict__ ranges, int lead, int G, int limit, int tiles_n,
                                          int lane) {
        const int total = scan_groups<LAYOUT>(
            ranges, lead, G, limit, lane, [&](int r) { return (r + BM - 1) / BM * tiles_n; },
            [&](int g, int f, int s, int r) {
                first[g] = f;
                start[g] = s;
                rows[g] = r;
            });
        if (lane == 0) first[G] = total;
    }

    __device__ __forceinline__ int total(int G) const { return first[G]; }

    // The group of tile index t (0 <= t < total): the largest g with first[g] <= t; its tile (m, n)
    // in panels of `panel` >= 1 m-tiles (see the top of this file).
    template <int BM>
    __device__ __forceinline__ GroupTile locate(int t, int G, int tiles_n, int panel) const {
        const int lo = group_of(first, G, t);
        GroupTile gt;
        gt.g = lo;
        gt.row0 = start[lo];
        gt.rows = rows[lo];
        const int tiles_m = (gt.rows + BM - 1) / BM, local = t - first[lo];
        // ceil(tiles_m / panel) panels of even height pm <= panel; (panels - 1) pm < tiles_m, so the
        // last one is not empty.
        const int panels = (tiles_m - 1) / panel + 1, pm = (tiles_m - 1) / panels + 1;  // tiles_m >= 1
        const int p = local / (pm * tiles_n), in = local - p * pm * tiles_n;
        const int h = min(pm, tiles_m - p * pm);  // this panel's m-tiles (the last may be shorter)
        gt.m = p * pm + in % h;
        gt.n = in / h;
        return gt;
    }
};
