// engine.gemm_grouped_fit: grouped GEMM with the operands swapped and each group's token tiles fitted to its
// rows (gemmlab.grouped: GroupedPlan.fit, taken at few rows a group; the 128-row ping-pong form at 128 rows a
// group and more, K >= 2048: grouped.FIT_PINGPONG_OFFERED).
// For each group g, out_g (rows_g x N) = A_g (rows_g x K) @ B[g]^T, computed as out_g^T = B[g] @ A_g^T:
// the kernel's "A" is the expert's weight (BM = 128 weight rows a tile, two consumers of 64, or 256, two
// of 128; or PINGPONG: BM = 64 or 128, each consumer a whole tile in turn, its epilogue under the other's
// k-loop), its "B" the group's tokens, a tile W tokens wide. W is chosen per group on the device: the
// group's rows r take nt = ceil(r / WMAX) token tiles of the same width W = ceil(r / nt) rounded up to Q,
// one of the widths Q, 2 Q, .., WMAX the kernel is instantiated for. So a group pads at most Q - 1 rows a
// token tile, where a tile of BM token rows pads BM / 2 on average (1.2-1.5x the rows at 80-160 rows a
// group). Fitting those measured slower than the tiled kernel (the padded rows did not bind); at a few
// rows a group, where each expert's weight streams once, it measured faster, and the planner takes it
// there (docs/worklog.md, session 30).
// Each width has its own k-loop (the wgmma's n is fixed per instruction) and its own epilogue (or, with
// SHARED_STORE, one epilogue at WMAX for all; with STORE_STEP, one a bucket of widths: below); the ring's slots hold WMAX token rows, a narrower
// tile fills the first W of them through a box of W rows (one token map a width). Stores are the dense
// engine's transposed DIRECT stores, bounded by the group's rows and N (epilogue_store.cuh): tokens past
// the group's end belong to the next group and are never stored.
// Tile order: a group's token tiles fastest, then its weight tiles, so the nt tiles that read one weight
// tile run side by side and the weight streams from HBM once; a group's tokens stay in L2.
#include "common/gemm_traits.cuh"
#include "common/group_scheduler.cuh"
#include "common/mainloop.cuh"
#include "common/epilogue_store.cuh"
#include "common/claimed_tiles.cuh"

// WIDEST_FIRST (the plan's widest_first, grouped.fit_widest_first): the table holds the groups by their token
// tiles' width, the widest first (groups of one width in group order, the empty ones last), gid the group of a
// slot. The scheduler hands the tiles out in table order, so the last wave runs the narrowest tiles: longest
// first, as in list scheduling, where group order may leave one wide group's tiles alone at the end. A group's
// tiles stay together in either order.
// LIGHT > 0 (a probe's option, off as shipped): groups of 1 .. LIGHT rows form the light class, whose tiles
// stream their weight once with little to multiply (HBM-bound), the others the heavy class (MMA-bound). In
// group order a wave of CTAs runs the light groups' tiles together (the tensor cores wait on HBM) and the
// heavy groups' together (HBM mostly idle). With LIGHT the table holds the light groups first, then the heavy
// ones (each class in group order, gid the group of a slot), and locate spreads the light class's tiles
// evenly among the heavy class's: index t is light where floor((t + 1) L / T) > floor(t L / T) (L light
// tiles of T), so every wave mixes the two. A class keeps its own order: a heavy weight tile's token tiles
// still run side by side. FitOrder<0> is empty, so the group-order table is unchanged.
// LIGHT_COST (with LIGHT; the other probe forms), where the light class runs:
//   0   spread among the heavy tiles (above);
//   -1  first: the table's order, the light class's tiles before the heavy class's (one phase each);
//   -2  last: the heavy class first in the table, the light tiles after (filling the heavy tiles' last wave);
//   > 0 on CTAs of their own: the first s CTAs walk the light tiles, the others the heavy ones, s = grid x
//       L c / (L c + H) rounded (at least one CTA each where both classes have tiles), c = LIGHT_COST / 100
//       the cost of a light tile in heavy tiles; the light CTAs load the weight evict-first (read once).
template <int MAX_G>
struct FitOrder {
    int gid[MAX_G];   // the group of each slot
    int light_tiles;  // tiles of the light class (slots first .. first[light groups])
};
template <>
struct FitOrder<0> {};

// Per group: first tile index, first row, rows, token tiles and their width.
// ORDER (with LIGHT): the classes' order in the table: LIGHT_FIRST or HEAVY_FIRST.
enum FitClassOrder { LIGHT_FIRST = 0, HEAVY_FIRST = 1 };
template <int MAX_G, int WMAX, int Q, bool WIDEST = false, int LIGHT = 0, int ORDER = LIGHT_FIRST>
struct FitTable : FitOrder<WIDEST || LIGHT ? MAX_G : 0> {
    static_assert(!(WIDEST && LIGHT), "one table order: widest first or a light class");
    int first[MAX_G + 1];
    int start[MAX_G];
    int rows[MAX_G];
    int shape[MAX_G];  // nt << 16 | W

    // A group's nt = ceil(rows / WMAX) token tiles, each of width w: its share of the rows, rounded up to Q.
    __device__ __forceinline__ static int2 fit(int r) {
        const int nt = (r + WMAX - 1) / WMAX;
        return make_int2(nt, nt ? ((r + nt - 1) / nt + Q - 1) / Q * Q : Q);
    }

    // Warp 0 only, then __syncthreads(). Contiguous offsets: lead = 1, G + 1 boundaries; lead = 0, G ends.
    __device__ __forceinline__ void build(const int* __restrict__ ranges, int lead, int G, int limit, int tiles_w,
                                          int lane) {
        if constexpr (WIDEST) {
            build_widest(ranges, lead, G, limit, tiles_w, lane);
        } else if constexpr (LIGHT == 0) {
            int2 s = make_int2(0, 0);  // this lane's group's (nt, w)
            const int total = scan_groups<GROUPS_CONTIGUOUS>(
                ranges, lead, G, limit, lane,
                [&](int r) {
                    s = fit(r);
                    return s.x * tiles_w;
                },
                [&](int g, int f, int st, int r) {
                    first[g] = f;
                    start[g] = st;
                    rows[g] = r;
                    shape[g] = s.x << 16 | s.y;
                });
            if (lane == 0) first[G] = total;
        } else {
            // A pass of scan_groups' warp scan a class (light and heavy): each group's slot is the groups of
            // the class before it and of its own class before it (a ballot), its first tile likewise.
            int tiles_before = 0, slots_before = 0;
            for (int pass = 0; pass < 2; ++pass) {
                for (int base = 0; base < G; base += 32) {
                    const int g = base + lane;
                    const int2 sr = g < G ? group_range<GROUPS_CONTIGUOUS>(ranges, lead, g, limit) : make_int2(0, 0);
                    const int2 s = fit(sr.y);
                    const bool here = g < G &&
                                      (sr.y >= 1 && sr.y <= LIGHT) == ((pass == 0) != (ORDER == HEAVY_FIRST));
                    const int tiles = here ? s.x * tiles_w : 0;
                    const int x = warp_inclusive_sum(tiles, lane);
                    const unsigned in = __ballot_sync(0xffffffffu, here);
                    if (here) {
                        const int slot = slots_before + __popc(in & ((1u << lane) - 1u));
                        first[slot] = tiles_before + x - tiles;
                        start[slot] = sr.x;
                        rows[slot] = sr.y;
                        shape[slot] = s.x << 16 | s.y;
                        this->gid[slot] = g;
                    }
                    tiles_before += __shfl_sync(0xffffffffu, x, 31);
                    slots_before += __popc(in);
                }
                if (pass == 0 && lane == 0) this->light_tiles = tiles_before;  // (HEAVY_FIRST: the heavy tiles)
            }
            if (lane == 0) first[G] = tiles_before;
        }
    }

    // WIDEST's table in three sweeps of the groups, 32 at a time, each group's range read once:
    // (1) its width class c (0 the widest, WMAX / Q - 1 the narrowest, WMAX / Q empty; NC classes) and its rank
    //     among the class's groups before it: those of the earlier sweeps' bases (class c's count so far, which
    //     lane c keeps) and of its own base below it (__match_any_sync);
    // (2) its slot, the groups of the classes before c (lane c's exclusive scan of the counts) plus its rank:
    //     its entries there, its tile count in first[];
    // (3) first[] scanned in slot order (scan_groups' warp scan).
    // Counts and starts live one a lane and are read through shuffles: an array indexed by c would be local memory.
    __device__ __forceinline__ void build_widest(const int* __restrict__ ranges, int lead, int G, int limit,
                                                 int tiles_w, int lane) {
        constexpr int NC = WMAX / Q + 1, PER = (MAX_G + 31) / 32;
        static_assert(NC <= 32, "a class a lane");
        const unsigned below = (1u << lane) - 1u;
        int count = 0;  // lane c < NC: class c's groups so far
        int cls[PER], rank[PER];
        int2 sr[PER], s[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int g = 32 * i + lane;
            sr[i] = g < G ? group_range<GROUPS_CONTIGUOUS>(ranges, lead, g, limit) : make_int2(0, 0);
            s[i] = fit(sr[i].y);
            cls[i] = g >= G ? NC : sr[i].y >= 1 ? (WMAX - s[i].y) / Q : NC - 1;  // (NC: past G, no class)
            const unsigned same = __match_any_sync(0xffffffffu, cls[i]);
            rank[i] = __shfl_sync(0xffffffffu, count, cls[i] & 31) + __popc(same & below);
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const unsigned in = __ballot_sync(0xffffffffu, cls[i] == c);
                if (lane == c) count += __popc(in);
            }
        }
        const int counted = lane < NC ? count : 0;
        const int starts = warp_inclusive_sum(counted, lane) - counted;  // lane c: class c's first slot
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int slot = __shfl_sync(0xffffffffu, starts, cls[i] & 31) + rank[i];
            if (cls[i] < NC) {
                first[slot] = s[i].x * tiles_w;
                start[slot] = sr[i].x;
                rows[slot] = sr[i].y;
                shape[slot] = s[i].x << 16 | s[i].y;
                this->gid[slot] = 32 * i + lane;
            }
        }
        __syncwarp();
        int carry = 0;
        for (int base = 0; base < G; base += 32) {
            const int slot = base + lane;
            const int tiles = slot < G ? first[slot] : 0;
            const int x = warp_inclusive_sum(tiles, lane);
            if (slot < G) first[slot] = carry + x - tiles;
            carry += __shfl_sync(0xffffffffu, x, 31);
        }
        if (lane == 0) first[G] = carry;
    }

    struct Tile {
        int row0, rows, g, wt, j, w;  // group's first row and rows, group, weight tile, token tile, width
    };
    // SPREAD (LIGHT only): t is the scheduler's index, mapped to the table's with the classes interleaved;
    // else t is the table's index.
    template <bool SPREAD = true>
    __device__ __forceinline__ Tile locate(int t, int G) const {
        if constexpr (LIGHT > 0 && SPREAD) {  // the scheduler's index t -> the table's: the classes interleaved
            const int total = first[G], L = this->light_tiles;
            const long long a = (long long)t * L;
            const int il = int(a / total);  // light tiles before t
            t = (a + L) / total > il ? il : L + (t - il);
        }
        const int lo = group_of(first, G, t);
        const int nt = shape[lo] >> 16, local = t - first[lo];
        int g = lo;
        if constexpr (WIDEST || LIGHT > 0) g = this->gid[lo];
        return Tile{start[lo], rows[lo], g, local / nt, local % nt, shape[lo] & 0xffff};
    }
};

// The same traits at token width W (the wgmma's n and the epilogue's columns); the ring keeps Tr's slots.
template <class Tr, int W>
struct AtWidth : GemmTraits<typename Tr::T, typename Tr::TO, typename Tr::TO, Tr::BM, W, Tr::STAGES, false, false,
                            false, false, 0, true, Tr::SCHEDULE, true> {};

// The first W / 2 accumulators of a block's row of Tr::BN / 2 (each block keeps its registers at every width).
template <int W, int V>
__device__ __forceinline__ float (&at_width(float (&acc)[V]))[W / 2] {
    return *reinterpret_cast<float(*)[W / 2]>(&acc[0]);
}

// A consumer's k-loop at width W: consume_unit's, the token slot at Tr::BN rows a stage; each k16 step one
// wgmma per 64-row block of the consumer's weight rows (Tr::MI: two where a consumer holds 128), against the
// same token slab.
template <class Tr, int W>
__device__ __forceinline__ void consume_at(Ring<Tr::STAGES>& ring, RingCursor& cur, const typename Tr::T* sA,
                                           const typename Tr::T* sB, int consumer, int t,
                                           float (&acc)[Tr::MI][Tr::BN / 2], int k_iters) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    int prev = 0;
    for (int kt = 0; kt < k_iters; ++kt) {
        ring.wait_full(cur);
        const T* a = sA + cur.stage * BM * BK + Tr::first_block(consumer) * 64 * BK;
        const T* b = sB + cur.stage * BN * BK;
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
            for (int mi = 0; mi < Tr::MI; ++mi)
                Wgmma<W, T>::mma(at_width<W>(acc[mi]), desc_sw128(a + mi * 64 * BK + 16 * k),
                                 desc_sw128(b + 16 * k), (kt == 0 && k == 0) ? 0 : 1);
        }
        wgmma_commit();
        if (kt > 0) {
            wgmma_wait<1>();
            if (t == 0) ring.release(prev);
        }
        prev = cur.stage;
        cur.template advance<Tr::STAGES>();
    }
    wgmma_wait<0>();
    if (t == 0) ring.release(prev);
}

// A tile's transposed DIRECT store at width W: out rows (tokens) c0 .. below `rows` of the group (out_g),
// out columns (weight rows) r0 + 64 (first block + mi) .. below N.
template <class Tr, int W>
__device__ __forceinline__ void store_at(float (&acc)[Tr::MI][Tr::BN / 2], int consumer, int t, int c0, int r0,
                                         int rows, int N, typename Tr::TO* Out, long long ldo, unsigned char* slabs,
                                         int& pieces) {
    using Tw = AtWidth<Tr, W>;
    // EpilogueArgs under TRANS_OUT: M = out's columns (N), N = out's rows (the group's rows).
    const EpilogueArgs<Tw> ep{1.0f, 0.0f, nullptr, 0, 0, nullptr, Out, ldo, N, rows};
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi)
        store_block<Tw>(at_width<W>(acc[mi]), r0 + 64 * (Tr::first_block(consumer) + mi), c0, ep, slabs, pieces,
                        nullptr, nullptr, t, consumer);
}

// The tile's k-loop and its store at width W: out rows (tokens) row0 + j W .. of the group, out columns
// (weight rows) wt BM + 64 consumer .. (ping-pong: wt BM ..; the turn passes to the other consumer
// between the two).
template <class Tr, int W>
__device__ __forceinline__ void tile_at(Ring<Tr::STAGES>& ring, RingCursor& cur, const typename Tr::T* sA,
                                        const typename Tr::T* sB, int consumer, int t,
                                        float (&acc)[Tr::MI][Tr::BN / 2], int k_iters, int c0, int r0, int rows,
                                        int N, typename Tr::TO* Out, long long ldo, unsigned char* slabs,
                                        int& pieces, Turns& turns) {
    consume_at<Tr, W>(ring, cur, sA, sB, consumer, t, acc, k_iters);
    if constexpr (Tr::PING_PONG) {
        if (t == 0) turns.pass(consumer);  // the other consumer's k-loop runs under this epilogue
    }
    store_at<Tr, W>(acc, consumer, t, c0, r0, rows, N, Out, ldo, slabs, pieces);
}

// The token map of width w (a box of w rows): tmT[w / Q - 1].
#define FIT_MAPS(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12)

// SHARED_STORE (grouped.FIT_SHARED_STORE, off until timed): each width keeps its k-loop, but one epilogue at
// WMAX serves them all, its stores bounded at the token tile's end (c0 + W rows of the group): the kernel
// then holds one copy of the epilogue's code instead of one a width (the 8-width builds run 93-168 KB of
// SASS against the tiled kernel's 44-47 KB). A narrower tile's accumulators past W / 2 are converted but
// never stored (zeroed once, so they hold values).
// STORE_STEP (0: off; the plan's store_step, grouped.fit_store_step: 64 for the ping-pong form below K = 2560,
// session 61): the same with one epilogue a STORE_STEP of widths, each at its widest (64: widths 16..64 store
// at 64, 80..128 at 128, 144..176 at 176): fewer epilogues than one a width, narrower than one at WMAX. Eleven
// epilogues, one a width, lost 6-15% at shallow K where one SM runs tiles of many widths (the epilogues'
// code, switched among; a deep k-loop hides it). SHARED_STORE is STORE_STEP = WMAX.
// CLAIM (a probe's option, off as shipped): each CTA's tiles after its first are claimed from a counter
// (ClaimedTiles, claimed_tiles.cuh), so the tiles in flight stay consecutive however unevenly the widths run:
// with WIDEST_FIRST, list scheduling's longest-first rule itself. The counter is this module's global
// fit_claims (zero when loaded, set back to zero by the last CTA of each launch), not a kernel argument: one
// launch of a build at a time, as the probe runs them.
__device__ int fit_claims[2];

template <class Tr, int MAX_G, int Q, bool SHARED_STORE = false, int STORE_STEP = 0, bool WIDEST_FIRST = false,
          int LIGHT = 0, int LIGHT_COST = 0, bool CLAIM = false>
__global__ void __launch_bounds__(Tr::THREADS, 1)
engine_gemm_grouped_fit(const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmT1,
                        const __grid_constant__ CUtensorMap tmT2, const __grid_constant__ CUtensorMap tmT3,
                        const __grid_constant__ CUtensorMap tmT4, const __grid_constant__ CUtensorMap tmT5,
                        const __grid_constant__ CUtensorMap tmT6, const __grid_constant__ CUtensorMap tmT7,
                        const __grid_constant__ CUtensorMap tmT8, const __grid_constant__ CUtensorMap tmT9,
                        const __grid_constant__ CUtensorMap tmT10, const __grid_constant__ CUtensorMap tmT11,
                        const __grid_constant__ CUtensorMap tmT12, const int* __restrict__ ranges, int lead, int G,
                        int limit, int N, int K, typename Tr::TO* __restrict__ Out, long long ldo) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, WMAX = Tr::BN, BK = Tr::BK;
    constexpr bool PP = Tr::PING_PONG;
    constexpr int STEP = SHARED_STORE ? WMAX : STORE_STEP;  // widths a bucket of one epilogue (0: one a width)
    static_assert(STEP % 16 == 0 && STEP >= 0 && !(SHARED_STORE && STORE_STEP), "store buckets of whole 16 columns");
    static_assert(Tr::CONSUMERS == 2 && (PP ? BM <= 128 : BM >= 128) && Tr::TRANS_OUT && Tr::DIRECT &&
                      WMAX % Q == 0 && WMAX / Q <= 12 && (Tr::SCHEDULE == DATA_PARALLEL || PP),
                  "fitted grouped: 128 or 256 weight rows (two consumers) or ping-pong 64 or 128, at most 12 widths, "
                  "DIRECT transposed stores");
    using Table = FitTable<MAX_G, WMAX, Q, WIDEST_FIRST, LIGHT, LIGHT_COST == -2 ? HEAVY_FIRST : LIGHT_FIRST>;
    static_assert(1024 + Tr::STAGES * Tr::STAGE_BYTES + Tr::SLABS_BYTES + sizeof(Table) <=
                      227 * 1024 - 256,
                  "shared memory (with the group table)");
    extern __shared__ unsigned char smem_raw[];
    T* sA = reinterpret_cast<T*>(align_1024(smem_raw));
    T* sB = sA + Tr::STAGES * BM * BK;
    unsigned char* sC = reinterpret_cast<unsigned char*>(sB + Tr::STAGES * WMAX * BK);
    __shared__ Ring<Tr::STAGES> ring;
    __shared__ Table groups;
    __shared__ Turns turns;  // PINGPONG only
    __shared__ TileQueue queue;  // CLAIM only

    const int wg = warpgroup_index(), t = threadIdx.x % 128;
    const int tiles_w = (N + BM - 1) / BM, k_iters = (K + BK - 1) / BK;
    pdl_wait();
    pdl_trigger_early();
    if (threadIdx.x < 32) groups.build(ranges, lead, G, limit, tiles_w, threadIdx.x);
    if (threadIdx.x == 0) {
        ring.init(Tr::SLOT_READERS);
        if constexpr (PP) turns.init();
        if constexpr (CLAIM) queue.init(Tr::CONSUMERS * 128);
    }
    __syncthreads();
    const int total = groups.first[G];
    // This CTA's tiles: first(), first() + step(), .. below end(): the scheduler's order (blockIdx.x in
    // strides of the grid), or with LIGHT_COST the table's, one class's.
    constexpr bool PART = LIGHT > 0 && LIGHT_COST > 0;
    static_assert(!(CLAIM && PART), "claimed tiles: one order for all CTAs");
    int t0 = 0, t_end = 0, stride = 0;
    bool light_cta = false;
    if constexpr (PART) {
        t0 = blockIdx.x, t_end = total, stride = gridDim.x;
        const int L = groups.light_tiles, H = total - L;
        if (L > 0 && H > 0 && gridDim.x > 1) {
            const long long lc = (long long)L * LIGHT_COST;
            const int s = min(max(int((2LL * gridDim.x * lc + lc + 100LL * H) / (2 * (lc + 100LL * H))), 1),
                              (int)gridDim.x - 1);
            light_cta = (int)blockIdx.x < s;
            if (light_cta) t_end = L, stride = s;
            else t0 = L + blockIdx.x - s, stride = gridDim.x - s;
        }
    }
    auto first = [&] { if constexpr (PART) return t0; else return (int)blockIdx.x; };
    auto end = [&] { if constexpr (PART) return t_end; else return total; };
    auto step = [&] { if constexpr (PART) return stride; else return (int)gridDim.x; };
    constexpr bool SPREAD = LIGHT_COST == 0;  // (-1, -2: the table's order as it stands)
    // CLAIM: the walk's tiles from the queue (-1 past this CTA's last), which the producer fills and every
    // consumer thread reads; else first(), first() + step(), .. below end().
    ClaimedTiles claimed(&queue, fit_claims, total, k_iters, wg == 0);
    auto claim = [&] {
        WorkUnit u;
        return claimed.next(u) ? u.tile : -1;
    };
    auto start = [&] { if constexpr (CLAIM) return claim(); else return first(); };
    auto more = [&](int tile) { if constexpr (CLAIM) return tile >= 0; else return tile < end(); };
    auto after = [&](int tile) { if constexpr (CLAIM) return claim(); else return tile + step(); };

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            RingCursor cur;
            using H = L2Hints<true>;  // the weight is A here
            const u64 pw = l2_policy<H::A>(), pt = l2_policy<H::B>();
            const u64 pw_first = PART ? l2_policy<L2_FIRST>() : pw;  // PART: the light CTAs' weight loads
            for (int tile = start(); more(tile); tile = after(tile)) {
                const auto gt = groups.template locate<SPREAD>(tile, G);
                const int w_row = gt.g * N + gt.wt * BM, t_row = gt.row0 + gt.j * gt.w;
                const CUtensorMap* tm = &tmT1;
#define FIT_PICK(i) \
    if (gt.w == i * Q) tm = &tmT##i;
                FIT_MAPS(FIT_PICK)
#undef FIT_PICK
                const u32 bytes = u32(BM + gt.w) * BK * sizeof(T);
                for (int kt = 0; kt < k_iters; ++kt) {
                    u64* bar = ring.acquire(cur, bytes);
                    if (PART && light_cta)  // read once: evict-first
                        tma_load_2d<L2_FIRST>(sA + cur.stage * BM * BK, &tmW, bar, kt * BK, w_row, pw_first);
                    else
                        tma_load_2d<H::A>(sA + cur.stage * BM * BK, &tmW, bar, kt * BK, w_row, pw);
                    tma_load_2d<H::B>(sB + cur.stage * WMAX * BK, tm, bar, kt * BK, t_row, pt);
                    cur.template advance<Tr::STAGES>();
                }
            }
        }
        return;
    }

    setmaxnreg_inc<Tr::CONSUMER_REGS>();
    const int consumer = wg - 1;
    unsigned char* slabs = sC + consumer * 2 * Tr::SLAB_BYTES;
    RingCursor cur;
    int pieces = 0;
    float acc[Tr::MI][WMAX / 2];
    if constexpr (STEP > 0) {
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi)
#pragma unroll
            for (int j = 0; j < WMAX / 2; ++j) acc[mi][j] = 0.0f;
    }
    int unit = 0;  // PINGPONG: this CTA's tiles go to consumer 0, 1, 0, 1, ...
    u32 turn_parity = 0;
    for (int tile = start(); more(tile); tile = after(tile)) {
        if constexpr (PP) {
            if ((unit & 1) != consumer) {  // the other consumer's tile: step over its k-steps in the ring
                ++unit;
                cur.template skip<Tr::STAGES>(k_iters);
                continue;
            }
            if (unit++ > 0) turns.wait(consumer, turn_parity);
        }
        const auto gt = groups.template locate<SPREAD>(tile, G);
        // out of group g: rows row0 .. row0 + rows; this tile's tokens j w .., weight rows (out columns) wt BM ..
        typename Tr::TO* out_g = Out + (long long)gt.row0 * ldo;
        const int c0 = gt.j * gt.w, r0 = gt.wt * BM;
        if constexpr (STEP > 0) {
            switch (gt.w / Q) {
#define FIT_LOOP(i)                                                                          \
    case i:                                                                                  \
        if constexpr (i * Q <= WMAX) consume_at<Tr, i * Q>(ring, cur, sA, sB, consumer, t, acc, k_iters); \
        break;
                FIT_MAPS(FIT_LOOP)
#undef FIT_LOOP
            }
            if constexpr (PP) {
                if (t == 0) turns.pass(consumer);  // the other consumer's k-loop runs under this epilogue
            }
            const int bounded = min(gt.rows, c0 + gt.w);
            switch ((gt.w + STEP - 1) / STEP) {  // bucket i: widths up to i STEP, stored at min(i STEP, WMAX)
#define FIT_STORE(i)                                                                                         \
    case i:                                                                                                  \
        if constexpr (STEP > 0 && (i - 1) * STEP < WMAX)                                                     \
            store_at<Tr, (i * STEP < WMAX ? i * STEP : WMAX)>(acc, consumer, t, c0, r0, bounded, N, out_g, ldo, \
                                                              slabs, pieces);                               \
        break;
                FIT_MAPS(FIT_STORE)
#undef FIT_STORE
            }
            continue;
        }
        switch (gt.w / Q) {
#define FIT_CASE(i)                                                                                                 \
    case i:                                                                                                         \
        if constexpr (i * Q <= WMAX)                                                                                \
            tile_at<Tr, i * Q>(ring, cur, sA, sB, consumer, t, acc, k_iters, c0, r0, gt.rows, N, out_g, ldo, slabs, \
                               pieces, turns);                                                                      \
        break;
            FIT_MAPS(FIT_CASE)
#undef FIT_CASE
        }
    }
    pdl_trigger_late();
}
