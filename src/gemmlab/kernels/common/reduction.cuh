// Partial sums of one tile computed by several CTAs, added in a fixed order (bitwise deterministic).
//
//  * Stream-K (global workspace): a contributor CTA writes its accumulators in fragment order (each
//    thread's values as float4s, consecutive threads consecutive 16 bytes: coalesced) to its slot and
//    raises one flag per consumer warpgroup; the owner, holding the same fragment positions in the same
//    threads, waits for each contributor's flag in CTA order and adds the partial into its registers.
//    The owner clears the flag after use, so the workspace is ready for the next launch (and for graph
//    replays) without a memset.
//  * Global split-K (SPLIT_K_GLOBAL): the `splits` CTAs of a tile share its reduction. Each writes its
//    partial to its workspace slot (fragment order, as stream-K) and raises its flag by splits - 1 (one
//    per reader); the tile's columns are cut into `splits` slices of 8-column fragment groups, and rank
//    r sums slice r of every rank's partial in rank order (fixed per element: deterministic) and stores
//    it; each reader takes 1 off each flag it read, so the flags are 0 again at the launch's end (no
//    memset). Every CTA writes one partial, reads 1 / splits of the tile from each rank and stores
//    1 / splits of it, all in parallel, where the stream-K owner reads every contributor's partial and
//    stores the whole tile alone. Bulk (Tr::GSK_BULK): the ranks exchange split-K's row slices instead:
//    each CTA puts its partial in its drained stages (as split-K does), one thread copies the slices the
//    other ranks sum to its workspace slot by bulk copies and raises its flag once they are written, then
//    bulk-copies this rank's slice of every other rank's slot into its receive slots; the sums are the
//    pushed split-K's (split_reduce_store), from shared memory.
//  * Split-K (thread-block cluster, h11's): every CTA leaves its partial in its own shared memory, and
//    CTA r adds rows r * BM / splits .. of all partials, in rank order from its own, and stores them.
//    Pushed (Tr::SPLIT_PUSH): each CTA copies the other ranks' row slices of its partial into their
//    shared memory (bulk copies, completed on the receiver's barrier), so the sums read local shared
//    memory only; else (tiles whose partial and receive slots do not fit the drained stages) CTA r reads
//    the other partials through distributed shared memory after a cluster barrier.
#pragma once
#include "epilogue_store.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"

// "red.release.gpu.global.add": the release makes every write that happens-before it (this thread's,
// and the warpgroup's through the preceding bar.sync) visible to a thread that acquires the flag
// (PTX ISA "Memory Consistency Model": release and acquire patterns; "red").
__device__ __forceinline__ void flag_release_add(int* flag, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}
// "ld.acquire.gpu": reads after it (in this thread, and in the warpgroup after a bar.sync) see what the
// releasing writer published.
__device__ __forceinline__ int flag_acquire(const int* flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}
__device__ __forceinline__ void flag_clear(int* flag) {
    asm volatile("st.relaxed.gpu.global.s32 [%0], 0;" ::"l"(flag) : "memory");
}
// A reader's mark: the slot is read within this launch and written again only by a later launch (kernel
// boundary), so no ordering is needed, only the count.
__device__ __forceinline__ void flag_take(int* flag) {
    asm volatile("red.relaxed.gpu.global.add.s32 [%0], -1;" ::"l"(flag) : "memory");
}

// Float4 q of thread t in block `blk` (64 x BN floats) of workspace slot `slot`.
template <class Tr>
__device__ __forceinline__ float4* sk_partial(float* ws, int slot, int blk, int t) {
    return reinterpret_cast<float4*>(ws + ((long long)slot * Tr::BM + blk * 64) * Tr::BN) + t;
}

// Contributor: write this consumer's blocks (those with rows below M) to slot `slot`, then raise its flag.
template <class Tr>
__device__ __forceinline__ void sk_store_partial(const float (&acc)[Tr::MI][Tr::BN / 2], float* ws, int* flags,
                                                 int slot, int consumer, int t, int m0, int M) {
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) {
        const int blk = consumer * Tr::MI + mi;
        if (m0 + blk * 64 >= M) continue;  // the owner skips the same blocks
        float4* p = sk_partial<Tr>(ws, slot, blk, t);
#pragma unroll
        for (int q = 0; q < Tr::BN / 8; ++q)  // .cg: through L2 only, where the owner's SM will read it
            __stcg(p + q * 128, make_float4(acc[mi][4 * q], acc[mi][4 * q + 1], acc[mi][4 * q + 2], acc[mi][4 * q + 3]));
    }
    named_barrier_sync(1 + consumer, 128);  // the warpgroup's writes happen-before thread 0's release
    if (t == 0) flag_release_add(&flags[2 * slot + consumer], 1);
}

// Owner: add the partials of CTAs first, first + 1, ... (while their ranges start before tile_end, the
// tile's last streamed k-step + 1) into acc, in that order.
template <class Tr, class Sched>
__device__ __forceinline__ void sk_add_partials(float (&acc)[Tr::MI][Tr::BN / 2], float* ws, int* flags,
                                                const Sched& sched, int first, long long tile_end, int consumer,
                                                int t, int m0, int M) {
    for (int j = first; j < sched.args.sk_ctas && sched.sk_begin(j) < tile_end; ++j) {
        int* flag = &flags[2 * j + consumer];
        if (t == 0) {
            while (flag_acquire(flag) == 0) __nanosleep(64);
            flag_clear(flag);  // contributor j writes no other partial in this launch
        }
        named_barrier_sync(1 + consumer, 128);  // thread 0's acquire happens-before the loads below
#pragma unroll
        for (int mi = 0; mi < Tr::MI; ++mi) {
            const int blk = consumer * Tr::MI + mi;
            if (m0 + blk * 64 >= M) continue;
            const float4* p = sk_partial<Tr>(ws, j, blk, t);
#pragma unroll
            for (int q = 0; q < Tr::BN / 8; ++q) {
                const float4 v = __ldcg(p + q * 128);
                acc[mi][4 * q] += v.x;
                acc[mi][4 * q + 1] += v.y;
                acc[mi][4 * q + 2] += v.z;
                acc[mi][4 * q + 3] += v.w;
            }
        }
    }
}

// Split-K: write this consumer's fp32 blocks into the CTA's partial (row stride LDP floats, over the
// drained stages at `part`). The caller has synchronised all consumers first (their wgmmas are done).
template <class Tr>
__device__ __forceinline__ void split_store_partial(const float (&acc)[Tr::MI][Tr::BN / 2], u32 part, int consumer,
                                                    int t) {
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) {
        const int rl = (consumer * Tr::MI + mi) * 64 + frag_row(t);
#pragma unroll
        for (int j = 0; j < Tr::BN / 8; ++j) {
            const int cl = 8 * j + frag_col(t);
            st_shared_f32x2(part + 4 * (rl * Tr::LDP + cl), acc[mi][4 * j], acc[mi][4 * j + 1]);
            st_shared_f32x2(part + 4 * ((rl + 8) * Tr::LDP + cl), acc[mi][4 * j + 2], acc[mi][4 * j + 3]);
        }
    }
}

// The four floats at `addr` in the cluster's `splits` partials, summed in a fixed order: this CTA's own
// first, then the next ranks cyclically. Pulled (PUSH false): every remote load is issued before the first
// add (the SM-to-SM network is slow: ~26 GB/s per SM in the h11 timeline), the own value read locally.
// Pushed: rank + o's value sits in this CTA's receive slot o - 1, `slot` bytes apart, at `recv`.
template <bool PUSH>
__device__ __forceinline__ float4 split_sum_f32x4(u32 addr, u32 recv, u32 slot, int rank, int splits) {
    float4 other[7];  // cluster size <= 8, the portable limit
#pragma unroll
    for (int o = 1; o < 8; ++o) {
        if (o < splits)
            other[o - 1] = PUSH ? ld_shared_f32x4(recv + (o - 1) * slot) : ld_cluster_f32x4(addr, (rank + o) % splits);
    }
    float4 sum = ld_shared_f32x4(addr);
#pragma unroll
    for (int o = 1; o < 8; ++o) {
        if (o < splits) {
            sum.x += other[o - 1].x;
            sum.y += other[o - 1].y;
            sum.z += other[o - 1].z;
            sum.w += other[o - 1].w;
        }
    }
    return sum;
}

// Split-K rows shared out: rank r sums rows r * ceil(valid / splits) .. (valid = min(BM, M - m0): a tile
// hanging over M, as at few tokens, shares out only the rows it has, so the ranks' shares stay even).
__device__ __forceinline__ int split_rows_per(int valid, int splits) { return (valid + splits - 1) / splits; }
__device__ __forceinline__ int split_rows_of(int rank, int valid, int splits) {
    const int per = split_rows_per(valid, splits);
    return max(0, min(valid, (rank + 1) * per) - rank * per);
}

// Split-K, pushed (one thread, after the partial is in shared memory and fenced for the async proxy): the
// arrival on this CTA's `bar` announcing the slices the other ranks will copy in, then this CTA's slice
// of each other rank's rows into that rank's receive slot for it (slot splits - o - 1 of rank + o: the
// receiver adds rank + o' from slot o' - 1).
template <class Tr>
__device__ __forceinline__ void split_push_slices(u32 part, u32 recv, u64* bar, int rank, int splits, int valid) {
    constexpr u32 ROW = Tr::LDP * 4;
    const u32 slot = split_rows_per(valid, splits) * ROW;
    mbar_expect_tx(bar, (splits - 1) * split_rows_of(rank, valid, splits) * ROW);
    for (int o = 1; o < splits; ++o) {
        const int dst = (rank + o) % splits, rows = split_rows_of(dst, valid, splits);
        if (rows > 0)
            bulk_copy_to_peer(recv + (splits - o - 1) * slot, part + dst * slot, rows * ROW, smem_u32(bar), dst);
    }
}

// Four consecutive outputs from dst on, `valid` of them inside the tensor: one 16- or 8-byte store when
// all are and the address is aligned for it, else one store per element.
template <typename TO>
__device__ __forceinline__ void store_out4(TO* dst, const float (&v)[4], int valid) {
    if (valid >= 4 && reinterpret_cast<size_t>(dst) % (4 * sizeof(TO)) == 0) {
        if constexpr (sizeof(TO) == 4) {
            *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            *reinterpret_cast<uint2*>(dst) = make_uint2(pack2(v[0], v[1], (TO*)nullptr), pack2(v[2], v[3], (TO*)nullptr));
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        if (h < valid) dst[h] = from_float<TO>(v[h]);
    }
}

// Split-K: CTA `rank` of `splits` reduces its share of the tile's rows inside the tensor
// (split_rows_of), four columns per item, over the consumer threads (ct = 0 .. CONSUMERS x 128 - 1),
// applies the epilogue and stores. Each element is summed by one CTA in one order (split_sum_f32x4), pushed
// or pulled alike. Consecutive threads take consecutive columns (one 16-byte store each); under TRANS_OUT
// consecutive rows, so that each of the item's four stores (one per out row) is a contiguous run across
// the warp. Pulled: after the cluster barrier. Pushed: once this CTA's barrier saw every slice land.
template <class Tr, bool PUSH = false>
__device__ __forceinline__ void split_reduce_store(u32 part, int rank, int splits, int m0, int n0,
                                                   const EpilogueArgs<Tr>& ep, int ct, u32 recv = 0) {
    constexpr int C4 = Tr::BN / 4;
    const int valid = min(Tr::BM, ep.M - m0);
    const int rows_per = split_rows_per(valid, splits), r0 = rank * rows_per;
    const int rows = split_rows_of(rank, valid, splits), items = rows * C4;
    const u32 slot = rows_per * Tr::LDP * 4;
    for (int i = ct; i < items; i += Tr::CONSUMERS * 128) {
        const int rr = r0 + (kTransOut<Tr> ? i % rows : i / C4), c4 = (kTransOut<Tr> ? i / rows : i % C4) * 4;
        const int r = m0 + rr, cc = n0 + c4;
        if (r >= ep.M || cc >= ep.N) continue;
        const float4 sum = split_sum_f32x4<PUSH>(part + 4 * (rr * Tr::LDP + c4),
                                                 recv + 4 * ((rr - r0) * Tr::LDP + c4), slot, rank, splits);
        float v[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
        for (int h = 0; h < 4; ++h) v[h] = ep.apply(v[h], r, cc + h);
        if constexpr (kTransOut<Tr>) {
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                if (cc + h < ep.N) *ep.out_at(r, cc + h) = from_float<typename Tr::TO>(v[h]);
            }
        } else {
            store_out4(ep.out_at(r, cc), v, ep.N - cc);
        }
    }
}

// Two adjacent outputs (r, c) and (r, c + 1) of a fragment, the epilogue applied: one 4-byte (16-bit
// output) or 8-byte (fp32) store where both are inside the tensor and the address is aligned, else one
// store per element inside it.
template <class Tr>
__device__ __forceinline__ void store_pair(const EpilogueArgs<Tr>& ep, int r, int c, float x0, float x1) {
    using TO = typename Tr::TO;
    if (r >= ep.M || c >= ep.N) return;
    const float v0 = ep.apply(x0, r, c), v1 = ep.apply(x1, r, c + 1);
    if constexpr (kTransOut<Tr>) {  // (r, c) and (r, c + 1) sit in two out rows
        *ep.out_at(r, c) = from_float<TO>(v0);
        if (c + 1 < ep.N) *ep.out_at(r, c + 1) = from_float<TO>(v1);
        return;
    }
    TO* dst = ep.out_at(r, c);
    if (c + 1 < ep.N && reinterpret_cast<size_t>(dst) % (2 * sizeof(TO)) == 0) {
        if constexpr (sizeof(TO) == 4) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
            *reinterpret_cast<u32*>(dst) = pack2(v0, v1, (TO*)nullptr);
        }
        return;
    }
    dst[0] = from_float<TO>(v0);
    if (c + 1 < ep.N) dst[1] = from_float<TO>(v1);
}

// Global split-K through bulk copies (Tr::GSK_BULK; see the top of this file). The partial (BM rows of LDP
// floats) is in shared memory at `part`, fenced for the async proxy and seen by every consumer thread (a
// barrier); this runs in one thread. Slot `first + rank` of the workspace holds this CTA's partial in the
// same row layout; the slice of rank d lies at d x slot bytes in both. The bulk stores complete before the
// flag's release (wait_group, then a proxy fence: the async proxy's writes ordered before the generic
// release); the readers acquire, fence, and bulk-load their slice of each other rank into receive slot
// splits - o - 1 for rank - o, as split_push_slices places them, completed on `bar`.
template <class Tr>
__device__ __forceinline__ void gsk_bulk_exchange(u32 part, u32 recv, u64* bar, float* ws, int* flags, int rank,
                                                  int splits, int first, int valid) {
    constexpr u32 ROW = Tr::LDP * 4;
    const u32 slot = split_rows_per(valid, splits) * ROW;
    unsigned char* mine = reinterpret_cast<unsigned char*>(ws + (long long)(first + rank) * Tr::BM * Tr::LDP);
    for (int o = 1; o < splits; ++o) {
        const int dst = (rank + o) % splits, rows = split_rows_of(dst, valid, splits);
        if (rows > 0) bulk_store_global(mine + dst * slot, part + dst * slot, rows * ROW);
    }
    tma_store_commit();
    tma_store_wait_all<0>();
    fence_proxy_async_global();
    flag_release_add(&flags[2 * (first + rank)], splits - 1);
    const int rows = split_rows_of(rank, valid, splits);
    mbar_expect_tx(bar, (splits - 1) * rows * ROW);
    for (int o = 1; o < splits; ++o) {
        const int src = (rank - o + splits) % splits;
        int* flag = &flags[2 * (first + src)];
        while (flag_acquire(flag) <= 0) __nanosleep(32);
        flag_take(flag);
        fence_proxy_async_global();
        const unsigned char* theirs =
            reinterpret_cast<const unsigned char*>(ws + (long long)(first + src) * Tr::BM * Tr::LDP);
        if (rows > 0)
            bulk_load_global(recv + (splits - o - 1) * slot, theirs + rank * slot, rows * ROW, smem_u32(bar));
    }
}

// Global split-K (see the top of this file): this CTA is rank `rank` of the `splits` (<= 4) CTAs
// first .. first + splits - 1 (workspace slots by CTA) that ran the tile at (m0, n0). Each writes its
// whole partial (fragment order, coalesced); after the flags, rank r sums slice r (fragment groups q of 8
// columns, q in [r Q / splits, (r + 1) Q / splits), Q = BN / 8, every row) over all ranks in rank order
// and stores it. The summing threads read 16-byte items in fragment order (consecutive threads,
// consecutive items), so they need not hold the fragment: all consumer threads share the work, with
// 4 items x splits loads in flight each. ct = consumer thread (0 .. CONSUMERS x 128 - 1).
template <class Tr>
__device__ __forceinline__ void gsk_reduce_store(const float (&acc)[Tr::MI][Tr::BN / 2], float* ws, int* flags,
                                                 int rank, int splits, int first, int consumer, int t, int m0,
                                                 int n0, const EpilogueArgs<Tr>& ep) {
    constexpr int Q = Tr::BN / 8, MAXS = 4, U = 4, CT = Tr::CONSUMERS * 128;
    const int me = first + rank, ct = consumer * 128 + t;
#pragma unroll
    for (int mi = 0; mi < Tr::MI; ++mi) {
        const int blk = Tr::first_block(consumer) + mi;
        if (m0 + blk * 64 >= ep.M) continue;  // rows past M: no rank reads them
        float4* p = sk_partial<Tr>(ws, me, blk, t);
#pragma unroll
        for (int q = 0; q < Q; ++q)
            __stcg(p + q * 128, make_float4(acc[mi][4 * q], acc[mi][4 * q + 1], acc[mi][4 * q + 2], acc[mi][4 * q + 3]));
    }
    // Every consumer thread's writes happen-before ct 0's release (bar.sync), and the others' releases
    // before the loads below (ct 0's acquires, then bar.sync). Each reader takes 1 off each flag it read.
    named_barrier_sync(3, CT);
    if (ct == 0) {
        flag_release_add(&flags[2 * me], splits - 1);
        for (int o = 1; o < splits; ++o) {
            int* flag = &flags[2 * (first + (rank + o) % splits)];
            while (flag_acquire(flag) <= 0) __nanosleep(32);
            flag_take(flag);
        }
    }
    named_barrier_sync(3, CT);
    const int q0 = rank * Q / splits, nq = (rank + 1) * Q / splits - q0;
    const int rows_left = ep.M - m0, blocks = min(Tr::BM / 64, (rows_left + 63) / 64);
    const int items = blocks * nq * 128;  // (block, q, fragment thread) of slice r, below M
    for (int i0 = ct; i0 < items; i0 += U * CT) {
        float4 v[U][MAXS];  // every load of U items issued before the first add
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * CT;
            if (i >= items) break;
            const int blk = i / (nq * 128), q = q0 + (i / 128) % nq, tf = i % 128;
#pragma unroll
            for (int j = 0; j < MAXS; ++j) {
                if (j < splits) v[u][j] = __ldcg(sk_partial<Tr>(ws, first + j, blk, tf) + q * 128);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * CT;
            if (i >= items) break;
            const int blk = i / (nq * 128), q = q0 + (i / 128) % nq, tf = i % 128;
            float4 sum = v[u][0];  // ranks 0, 1, ... in order: one order per element, deterministic
#pragma unroll
            for (int j = 1; j < MAXS; ++j) {
                if (j < splits) {
                    sum.x += v[u][j].x;
                    sum.y += v[u][j].y;
                    sum.z += v[u][j].z;
                    sum.w += v[u][j].w;
                }
            }
            const int r = m0 + blk * 64 + frag_row(tf), c = n0 + 8 * q + frag_col(tf);
            store_pair<Tr>(ep, r, c, sum.x, sum.y);
            store_pair<Tr>(ep, r + 8, c, sum.z, sum.w);
        }
    }
}
