// engine.gemm_grouped: grouped GEMM for mixture-of-experts layers, from the engine's named parts
// (kernels/common/): for each group g, out_g (rows_g x N) = A_g (rows_g x K) @ B[g]^T, B[g] (N x K)
// K-major (nn.Linear's weight layout), in one persistent launch.
//   gemm_traits.cuh      the compile-time choices (GemmTraits: DIRECT, data-parallel, K-major operands)
//   group_scheduler.cuh  the groups' row ranges read on the device into a tile table (GroupTable)
//   tile_scheduler.cuh   data-parallel persistent tiles over all groups' tiles
//   mainloop.cuh         the producer's TMA loads and the consumers' wgmmas, unchanged
//   epilogue_store.cuh   DIRECT stores, bounds-checked against the group's rows and N
// Layouts (LAYOUT): GROUPS_CONTIGUOUS: A (total, K), tokens sorted by group, rows from offsets; out
// (total, N). GROUPS_MASKED: A (G, capacity, K) seen as (G * capacity, K), counts say how many rows of
// each slab are valid; out (G, capacity, N), rows past a count untouched.
// One 2-D tensor map for all of A and one for B seen as (G * N, K). A tile at the end of a group loads
// BM rows that run into the next group's rows (or TMA zero fill past the tensor): each output row
// depends on its own A row only, and the epilogue stores only the group's rows. Likewise a tile at
// the right edge loads B rows of the next group's weight into columns >= N, which are never stored.
// The store cannot be a TMA store (a tile's box would cross into the next group's rows): the threads
// store each row (store_piece_rows), with row and column bounds.
#include "common/gemm_traits.cuh"
#include "common/group_scheduler.cuh"
#include "common/mainloop.cuh"
#include "common/epilogue_store.cuh"

constexpr int GROUPED_MAX_GROUPS = 512;  // the table's shared memory: 6 KB (planner: grouped.SMEM_TABLE)

template <class Tr, int LAYOUT>
__global__ void __launch_bounds__(Tr::THREADS, 1)
engine_gemm_grouped(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                    const int* __restrict__ ranges, int lead, int G, int limit, int N, int K,
                    typename Tr::TO* __restrict__ Out, long long ldo) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    static_assert(Tr::DIRECT && Tr::SCHEDULE == DATA_PARALLEL && !Tr::A_MN && !Tr::B_MN && !Tr::HAS_C,
                  "grouped: K-major operands, data-parallel, direct stores");
    static_assert(1024 + Tr::STAGES * Tr::STAGE_BYTES + Tr::SLABS_BYTES + sizeof(GroupTable<GROUPED_MAX_GROUPS>)
                      <= 227 * 1024 - 256,
                  "shared memory (with the group table)");
    extern __shared__ unsigned char smem_raw[];
    T* sA = reinterpret_cast<T*>(align_1024(smem_raw));
    T* sB = sA + Tr::STAGES * BM * BK;
    unsigned char* sC = reinterpret_cast<unsigned char*>(sB + Tr::STAGES * BN * BK);
    __shared__ Ring<Tr::STAGES> ring;
    __shared__ GroupTable<GROUPED_MAX_GROUPS> groups;

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int tiles_n = (N + BN - 1) / BN, k_iters = (K + BK - 1) / BK;
    if (threadIdx.x < 32) groups.template build<LAYOUT, BM>(ranges, lead, G, limit, tiles_n, threadIdx.x);
    if (threadIdx.x == 0) ring.init(Tr::CONSUMERS);
    __syncthreads();

    TileScheduler<DATA_PARALLEL> sched(groups.total(G), k_iters, ScheduleArgs{1, 0, 0});
    WorkUnit u;
    if (wg == 0) {
        // M = INT_MAX: every box is a whole BM rows (the rows past the group are discarded).
        produce_all<Tr>(ring, sched, sA, sB, &tmA, &tmA, &tmB, 0x7fffffff, BM, [&](int tile) {
            const GroupTile gt = groups.template locate<BM>(tile, G);
            return make_int2(gt.row0 + gt.m * BM, gt.g * N + gt.n * BN);
        });
        return;
    }

    if constexpr (Tr::CONSUMERS > 1) setmaxnreg_inc<Tr::CONSUMER_REGS>();
    const int consumer = wg - 1;
    unsigned char* slabs = sC + consumer * 2 * Tr::SLAB_BYTES;
    RingCursor cur;
    int pieces = 0;
    float acc[Tr::MI][BN / 2];
    while (sched.next(u)) {
        const GroupTile gt = groups.template locate<BM>(u.tile, G);
        consume_unit<Tr>(ring, cur, sA, sB, consumer, t, acc, u.k_begin, u.k_end);
        // The group's rows as the epilogue's M: rows >= gt.rows of the tile are not stored.
        const EpilogueArgs<Tr> ep{1.0f, 0.0f, nullptr, 0, 0, nullptr, Out + (long long)gt.row0 * ldo, ldo, gt.rows, N};
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi)
            store_block<Tr>(acc[mi], gt.m * BM + (consumer * Tr::MI + mi) * 64, gt.n * BN, ep, slabs, pieces, nullptr,
                            nullptr, t, consumer);
    }
}
