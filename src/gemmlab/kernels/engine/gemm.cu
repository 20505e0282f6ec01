// engine.gemm: the GEMM of gemmlab's engine, composed of named parts (kernels/common/):
//   gemm_traits.cuh     every compile-time choice by name (GemmTraits), written by gemmlab.planner.Plan
//   pipeline.cuh        the shared-memory ring (full / empty mbarriers, cursors)
//   tile_scheduler.cuh  data-parallel, split-K (clusters), hybrid stream-K and global split-K units
//   mainloop.cuh        the producer's TMA loads and the consumers' wgmmas of one unit
//   epilogue_store.cuh  fused epilogue and stores (TMA pieces, an unswizzled tail, DIRECT rows)
//   reduction.cuh       stream-K and global split-K partials through a global workspace, split-K through DSMEM
// h11's logic (any M, N, K via TMA bounds and short A and B boxes; K- or MN-major operands; alpha / beta * C /
// bias / activation in fp32; bf16 / fp16 / fp32 output; fp16 or bf16 inputs) over a wider tile space:
// 64, 128 or 256 rows (one or two consumer warpgroups, one or two m64 wgmmas each per k16) by 16 .. 256
// columns, or ping-pong: two consumers with whole 64- or 128-row tiles each, in turn, or (64-row tiles)
// two consumers with half the columns each. One CTA per SM
// (persistent), a producer warpgroup of which one thread issues the loads.
#include "common/gemm_traits.cuh"
#include "common/mainloop.cuh"
#include "common/reduction.cuh"

template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, 1)
engine_gemm(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmA_short,
            const __grid_constant__ CUtensorMap tmB, const __grid_constant__ CUtensorMap tmC,
            const __grid_constant__ CUtensorMap tmC_tail, const int* __restrict__ order, int M, int N, int K,
            float alpha, float beta, const typename Tr::TO* __restrict__ Cin, long long ldc_row,
            long long ldc_col, const typename Tr::TBIAS* __restrict__ bias, typename Tr::TO* __restrict__ Out,
            long long ldo, int a_rows, int splits, int sk_tiles, int sk_ctas, float* workspace, int* flags,
            const __grid_constant__ CUtensorMap tmB_short, int b_rows) {
    using T = typename Tr::T;
    constexpr int BM = Tr::BM, BN = Tr::BN, BK = Tr::BK;
    extern __shared__ unsigned char smem_raw[];
    T* sA = reinterpret_cast<T*>(align_1024(smem_raw));
    T* sB = sA + Tr::STAGES * BM * BK;
    unsigned char* sC = reinterpret_cast<unsigned char*>(sB + Tr::STAGES * BN * BK);
    __shared__ Ring<Tr::STAGES> ring;
    __shared__ Turns turns;  // PINGPONG only
    __shared__ u64 slices;   // SPLIT_PUSH, GSK_BULK: the other ranks' row slices of the partial landed

    const int wg = Tr::UNIFORM_WG ? warpgroup_index() : static_cast<int>(threadIdx.x / 128), t = threadIdx.x % 128;
    // B multicast: the rows of tiles padded to whole pairs (the host's order table lists the pairs).
    const int tiles_m = ((M + BM - 1) / BM + Tr::MCAST - 1) / Tr::MCAST * Tr::MCAST;
    const int tiles_n = (N + BN - 1) / BN, num_tiles = tiles_m * tiles_n;
    const int k_iters = (K + BK - 1) / BK;
    if (threadIdx.x == 0) {
        if constexpr (Tr::PING_PONG) turns.init();
        if constexpr (Tr::SPLIT_PUSH || Tr::GSK_BULK) mbar_init(&slices, 1);
        ring.init(Tr::SLOT_READERS * Tr::MCAST);  // (then fence.mbarrier_init.release.cluster)
    }
    // B multicast: the peer's loads and releases land on this CTA's barriers, so both are initialised
    // before either CTA starts (barrier.cluster orders the inits before the peer's first use).
    if constexpr (Tr::MCAST > 1) {
        cluster_sync();
    } else {
        __syncthreads();
    }
    // Programmatic dependent launch: the set-up above overlapped the previous kernel's tail; nothing global
    // (operands, workspace, output) is read or written before it has completed, except the L2 hints of
    // prewarm_l2 (EARLY_L2; the order table is written once, by the host, when the plan is built).
    if constexpr (EARLY_L2 > 0) {
        if (threadIdx.x == 0) {
            TileScheduler<Tr::SCHEDULE> first(num_tiles, k_iters, ScheduleArgs{splits, sk_tiles, sk_ctas});
            WorkUnit f;
            if (first.next(f)) {
                const int packed = order[f.tile];
                prewarm_l2<Tr>(&tmA, &tmB, (packed >> 16) * BM, (packed & 0xffff) * BN, f.k_begin, f.k_end);
            }
        }
    }
    pdl_wait();
    pdl_trigger_early();

    const ScheduleArgs sargs{splits, sk_tiles, sk_ctas};
    TileScheduler<Tr::SCHEDULE> sched(num_tiles, k_iters, sargs);
    WorkUnit u;
    if (wg == 0) {
        // setmaxnreg (PTX ISA "setmaxnreg"): with two consumers the producer gives its registers to them
        // (128 x (40 + 2 x 232) <= 64 K). One consumer (256 threads) has 240+ at entry already.
        if constexpr (Tr::CONSUMERS > 1) setmaxnreg_dec<40>();
        if (t == 0) {
            RingCursor cur;
            while (sched.next(u)) {
                const int packed = order[u.tile];
                produce_unit<Tr>(ring, cur, sA, sB, &tmA, &tmA_short, &tmB, (packed >> 16) * BM, (packed & 0xffff) * BN,
                                 u.k_begin, u.k_end, M, a_rows, NoExtraLoads{}, BEdge{&tmB_short, N, b_rows});
            }
        }
        if constexpr (Tr::SCHEDULE == SPLIT_K) {  // the consumers' cluster barriers count every thread
            if constexpr (Tr::SPLIT_PUSH) {
                cluster_sync_relaxed();
            } else {
                cluster_sync();
            }
            cluster_sync_relaxed();
        }
        if constexpr (Tr::MCAST > 1) cluster_sync();  // the consumers' closing barrier (below)
        return;
    }

    if constexpr (Tr::CONSUMERS > 1) setmaxnreg_inc<Tr::CONSUMER_REGS>();
    const int consumer = wg - 1;
    const EpilogueArgs<Tr> ep{alpha, beta, Cin, ldc_row, ldc_col, bias, Out, ldo, M, N};
    unsigned char* slabs = sC + consumer * 2 * Tr::SLAB_BYTES;
    RingCursor cur;
    int pieces = 0;
    float acc[Tr::MI][Tr::CN / 2];
    int unit = 0;        // PINGPONG: this CTA's units go to consumer 0, 1, 0, 1, ...
    u32 turn_parity = 0;
    while (sched.next(u)) {
        if constexpr (Tr::PING_PONG) {
            if ((unit & 1) != consumer) {  // the other consumer's tile: step over its k-steps in the ring
                ++unit;
                cur.template skip<Tr::STAGES>(u.k_end - u.k_begin);
                continue;
            }
            if (unit++ > 0) turns.wait(consumer, turn_parity);
        }
        const int packed = order[u.tile];
        const int m0 = (packed >> 16) * BM, n0 = (packed & 0xffff) * BN;
        // This consumer's blocks hold rows of A (else it multiplies nothing). Streamed schedules
        // always multiply: the skip's branches cost 128 x 256 stream-K its last registers (a 24-byte spill).
        constexpr bool STREAMED = Tr::SCHEDULE == STREAM_K || Tr::SCHEDULE == SPLIT_K_GLOBAL;
        const bool rows = STREAMED || m0 + Tr::first_block(consumer) * 64 < M;
        consume_unit<Tr>(ring, cur, sA, sB, consumer, t, acc, u.k_begin, u.k_end, rows);
        if constexpr (Tr::PING_PONG) {
            if (t == 0) turns.pass(consumer);
        }

        if constexpr (Tr::SCHEDULE == SPLIT_K) {
            // Both consumers' wgmmas are done with the stages before either overwrites them (bar 3).
            named_barrier_sync(3, Tr::CONSUMERS * 128);
            const u32 part = smem_u32(sA);
            split_store_partial<Tr>(acc, part, consumer, t);
            if constexpr (Tr::SPLIT_PUSH) {
                // The partial's stores are read next by the bulk copies (async proxy): fenced by each
                // writer, then a barrier of the consumers. The receive slots lie in the peers' drained
                // stages, so no copy starts before every CTA of the cluster has left its k-loop (a relaxed
                // cluster barrier: no data crosses CTAs through it; its wait also orders the peers'
                // `slices` inits, released by their fence.mbarrier_init, before the copies complete on
                // them). Then one thread copies the other ranks' slices out, and every thread waits for
                // this CTA's slices to land.
                const u32 recv = part + BM * Tr::LDP * 4;
                fence_proxy_async_smem();
                named_barrier_sync(3, Tr::CONSUMERS * 128);  // the fenced partial, ordered for thread 128
                cluster_sync_relaxed();
                if (threadIdx.x == 128)
                    split_push_slices<Tr>(part, recv, &slices, u.split, sargs.splits, min(BM, ep.M - m0));
                mbar_wait_parity(&slices, 0);
                split_reduce_store<Tr, true>(part, u.split, sargs.splits, m0, n0, ep, threadIdx.x - 128, recv);
                cluster_sync_relaxed();  // no CTA leaves while a copy from its shared memory may be in flight
            } else {
                cluster_sync();  // every CTA's partial is in its shared memory (barrier.cluster: release / acquire)
                split_reduce_store<Tr>(part, u.split, sargs.splits, m0, n0, ep, threadIdx.x - 128);
                cluster_sync_relaxed();  // no CTA leaves while the cluster still reads its shared memory
            }
        } else {
            if constexpr (Tr::GSK_BULK) {
                if (u.kind == UNIT_SPLIT) {  // the ranks exchange row slices through the workspace (bulk)
                    // Both consumers' wgmmas are done with the stages before either overwrites them (bar 3);
                    // the partial's stores are fenced for the bulk copies by each writer, then barred for
                    // thread 128, which copies; every thread waits for this rank's slices to land.
                    named_barrier_sync(3, Tr::CONSUMERS * 128);
                    const u32 part = smem_u32(sA), recv = part + BM * Tr::LDP * 4;
                    split_store_partial<Tr>(acc, part, consumer, t);
                    fence_proxy_async_smem();
                    named_barrier_sync(3, Tr::CONSUMERS * 128);
                    const int valid = min(BM, ep.M - m0);
                    if (threadIdx.x == 128)
                        gsk_bulk_exchange<Tr>(part, recv, &slices, workspace, flags, u.split, sargs.splits,
                                              sched.unit_cta() - u.split, valid);
                    mbar_wait_parity(&slices, 0);
                    split_reduce_store<Tr, true>(part, u.split, sargs.splits, m0, n0, ep, threadIdx.x - 128, recv);
                    continue;
                }
            }
            if constexpr (Tr::SCHEDULE == SPLIT_K_GLOBAL && !Tr::GSK_BULK) {
                if (u.kind == UNIT_SPLIT) {  // the tile's ranks reduce and store it together
                    gsk_reduce_store<Tr>(acc, workspace, flags, u.split, sargs.splits, sched.unit_cta() - u.split, consumer,
                                         t, m0, n0, ep);
                    continue;
                }
            }
            if constexpr (Tr::SCHEDULE == STREAM_K) {
                if (u.kind == UNIT_CONTRIBUTOR) {
                    sk_store_partial<Tr>(acc, workspace, flags, blockIdx.x, consumer, t, m0, M);
                    continue;
                }
                if (u.kind == UNIT_OWNER) {
                    sk_add_partials<Tr>(acc, workspace, flags, sched, blockIdx.x + 1, sched.streamed_end(u.tile),
                                        consumer, t, m0, M);
                }
            }
            if (Tr::MCAST > 1 && m0 >= M) continue;  // a pair's padding tile: nothing to store (a block past
            // M otherwise stores nothing either way: skipping it here costs heavy epilogues a spill)
#pragma unroll
            for (int mi = 0; mi < Tr::MI; ++mi)
                store_block<Tr>(acc[mi], m0 + (Tr::first_block(consumer) + mi) * 64, n0 + Tr::first_col(consumer), ep,
                                slabs, pieces, &tmC, &tmC_tail, t, consumer);
        }
    }
    pdl_trigger_late();  // this CTA's last unit is stored or on its way: the next kernel may be scheduled
    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();  // the slabs stay valid until the stores read them
    // B multicast: neither CTA leaves while the other's releases or loads may still reach its barriers
    // and shared memory.
    if constexpr (Tr::MCAST > 1) cluster_sync();
}
