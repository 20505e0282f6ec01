// hopper.h11_general: h10 (CLUSTER = 1) made general; this is the engine behind gemmlab.matmul.
//  * Any M, N, K: tiles are ceil-divided; the TMA zero-fills loads that fall outside the tensor and
//    clips stores, so edges need no code (a tile that ends past M loads only the A rows it has, below). (Leading dimensions must be 16-byte multiples: the Python side
//    copies operands that are not.)
//  * Either operand K-major or MN-major: an MN-major slab is loaded as 64 x 64 boxes and handed to
//    wgmma with its transpose flag and an MN-major descriptor (PTX ISA "Matrix Descriptor Format":
//    LBO = stride between 64-element MN blocks, SBO = stride between 8-deep K groups).
//  * Fused epilogue: out = act(alpha * acc + beta * C + bias) in fp32, stored as bf16, fp16 or fp32
//    through swizzled smem pieces and TMA stores.
//  * fp16 or bf16 inputs.
//  * Split-K for shapes with fewer tiles than SMs (decode M <= 128, small prefill): the `splits` CTAs
//    of a tile form one thread-block cluster, CTA u is (tile u / splits, k-range u % splits) and the
//    grid has exactly one unit per CTA. Each CTA leaves its fp32 partial in its own shared memory
//    (over the drained pipeline stages); after a cluster barrier, CTA r reads rows r * 128 / splits ..
//    of its own partial and, through distributed shared memory, of the others', adds them in a fixed
//    order (deterministic), runs the epilogue and stores those rows with plain coalesced stores. No workspace, no counters, no L2
//    round trip, and the reduction is spread over the cluster instead of falling to the last CTA.
//  * OVERLAP (16-bit output through TMA, no split-K): h12's overlapped epilogue. The fused epilogue
//    runs on the accumulators, the result is packed in registers and stored during the next tile's
//    first k-steps (common/stash.cuh).
#include "common/epilogue.cuh"
#include "common/mbarrier.cuh"
#include "common/stash.cuh"
#include "common/tile.cuh"
#include "common/timeline.cuh"
#include "common/tma.cuh"

// MN-major matrix descriptor for a 64-deep K slab stored as 64 x 64 boxes (one box = 64 K rows of 128 B).
__device__ __forceinline__ u64 desc_sw128_mn(const void* smem) {
    const u64 addr = smem_u32(smem);
    return ((addr & 0x3FFFF) >> 4) | ((u64)(8192 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// fp32 output: two floats at (row, col) of a 64 x 32 fp32 slab in the TMA 128-byte swizzle.
__device__ __forceinline__ void store_f32x2_sw128(float* slab, int row, int col, float x, float y) {
    const u32 off = row * 128 + ((((col * 4) / 16) ^ (row % 8)) * 16) + (col * 4) % 16;
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(smem_u32(slab) + off), "f"(x), "f"(y) : "memory");
}

// DIRECT output (rows not 16-byte aligned, which a TMA store cannot write): a 64 x PIECE piece, already
// in its swizzled slab, stored row by row with bounds checks. Warp w takes rows 16w .. 16w + 15 and its
// 32 lanes cover one row per store instruction (32 consecutive elements, or 32 pairs as 4-byte stores
// where the row allows), so the stores coalesce instead of each instruction touching 8 rows.
template <typename TO, int PIECE>
__device__ __forceinline__ void store_piece_rows(const TO* slab, TO* __restrict__ Out, long long ldo, int row0,
                                                 int col0, int M, int N, int t) {
    const int warp = t / 32, lane = t % 32, valid = min(PIECE, N - col0);
    const unsigned char* s = reinterpret_cast<const unsigned char*>(slab);
#pragma unroll 4
    for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr, gr = row0 + r;
        if (gr >= M || valid <= 0) break;  // warp-uniform: rows only grow
        TO* dst = Out + (long long)gr * ldo + col0;
        if constexpr (sizeof(TO) == 4) {  // a 64 x 32 fp32 slab: one element per lane
            const int c = lane;
            if (c < valid) dst[c] = *reinterpret_cast<const TO*>(s + r * 128 + ((((c * 4) / 16) ^ (r % 8)) * 16) + (c * 4) % 16);
        } else if (reinterpret_cast<size_t>(dst) % 4 == 0) {  // pairs: lane l writes columns 2l, 2l + 1
            const int c = 2 * lane;
            if (c + 1 < valid) {
                *reinterpret_cast<u32*>(dst + c) = *reinterpret_cast<const u32*>(s + sw128_offset(r, c));
            } else if (c < valid) {
                dst[c] = *reinterpret_cast<const TO*>(s + sw128_offset(r, c));
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int c = lane + 32 * h;
                if (c < valid) dst[c] = *reinterpret_cast<const TO*>(s + sw128_offset(r, c));
            }
        }
    }
}

template <typename T, typename TO, typename TBIAS, int BN, int QSIZE, int A_MN, int B_MN, int EPI, int SPLIT,
          int OVERLAP>
__global__ void __launch_bounds__(384, 1)
hopper_h11(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmA_half,
           const __grid_constant__ CUtensorMap tmB,
           const __grid_constant__ CUtensorMap tmC, const int* __restrict__ order, int M, int N, int K,
           float alpha, float beta, const TO* __restrict__ Cin, long long ldc_row, long long ldc_col,
           const TBIAS* __restrict__ bias, int splits, int a_rows, TO* __restrict__ Out, long long ldo) {
    constexpr int BM = 128, BK = 64, CONSUMERS = 2;
    constexpr bool HAS_BIAS = EPI & 1, HAS_C = EPI & 2;
    constexpr int ACT = (EPI >> 2) & 7;
    // DIRECT: an output whose rows are not 16-byte aligned (a TMA store cannot write it) is stored from the
    // slab by the threads, row by row with bounds checks (store_piece_rows).
    constexpr bool DIRECT = EPI & 32;
    constexpr int PIECE = sizeof(TO) == 4 ? 32 : 64;  // one 128-byte swizzle row per piece row
    constexpr u32 STAGE_BYTES = (BM + BN) * BK * sizeof(T);
    static_assert(!OVERLAP || (sizeof(TO) == 2 && !DIRECT && !SPLIT), "overlap: 16-bit TMA-stored output, no split");
    constexpr int LDP = BN + 8;  // SPLIT: row stride (floats) of the CTA's partial in shared memory
    static_assert(!SPLIT || BM * LDP * 4 <= QSIZE * STAGE_BYTES, "split-K: the partial must fit the stages");
    extern __shared__ unsigned char smem_raw[];
    T* sA = reinterpret_cast<T*>(align_1024(smem_raw));
    T* sB = sA + QSIZE * BM * BK;
    TO* sC = reinterpret_cast<TO*>(sB + QSIZE * BN * BK);  // CONSUMERS x 2 slabs of 64 x PIECE
    __shared__ u64 full[QSIZE], empty[QSIZE];

    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int tiles_n = (N + BN - 1) / BN, num_tiles = ((M + BM - 1) / BM) * tiles_n;
    const int k_iters = (K + BK - 1) / BK;
    if constexpr (!SPLIT) splits = 1;  // only the SPLIT instantiation carries the fixup code
    const int k_per = (k_iters + splits - 1) / splits, num_units = num_tiles * splits;
    // Probe events (benchmarks/h11_timeline.py; empty in the library's builds): 0 entry, 1 first loads
    // issued, 2 first stage landed, 3 k-loop done, 4 partial written, 5 partials visible, 6 rows reduced
    // and stored, 7 done. Marked by the producer's and the first consumer's thread 0.
    TIMELINE_MARK(threadIdx.x == 0, 0);
    if (threadIdx.x == 0) {
        for (int s = 0; s < QSIZE; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMERS);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (t == 0) {
            int s = 0;
            u32 phase = 0;
            for (int unit = blockIdx.x; unit < num_units; unit += gridDim.x) {
                const int packed = order[unit / splits], split = unit % splits;
                const int m0 = (packed >> 16) * BM, n0 = (packed & 0xffff) * BN;
                const int k_end = min(k_iters, (split + 1) * k_per);
                // Where rows m0 + 64 .. lie past M (M <= 64, the last row of tiles) only A's first a_rows
                // rows are loaded (K-major: tmA_half, a box of the rows left in the tile rounded up to 8, at
                // most 64; MN-major: one 64 x 64 box): zero-filled bytes cost the TMA as much as read ones.
                // The slot's other rows keep whatever an earlier stage (or nothing) left there: each MMA
                // output row depends on its A row alone, so they only make output rows past M, which no
                // store and no split-K reduction reads (the second consumer issues no MMAs in split
                // instantiations). Whole tiles keep one 128-row box: two 64-row boxes measured ~5% slower.
                const bool two = m0 + 64 < M;
                const u32 stage_bytes = STAGE_BYTES - (two ? 0u : u32(BM - a_rows) * BK * sizeof(T));
                for (int kt = split * k_per; kt < k_end; ++kt) {
                    mbar_wait_parity(&empty[s], phase ^ 1);
                    // The full box bytes arrive even where the box hangs over the tensor's edge (zero-filled).
                    mbar_expect_tx(&full[s], stage_bytes);
                    if constexpr (A_MN) {  // A stored (K, M): 64 x 64 boxes at (m, k)
                        tma_load_2d(sA + s * BM * BK, &tmA, &full[s], m0, kt * BK);
                        if (two) tma_load_2d(sA + s * BM * BK + 64 * BK, &tmA, &full[s], m0 + 64, kt * BK);
                    } else {  // A stored (M, K)
                        tma_load_2d(sA + s * BM * BK, two ? &tmA : &tmA_half, &full[s], kt * BK, m0);
                    }
                    if constexpr (B_MN) {  // B stored (K, N): BN / 64 boxes
#pragma unroll
                        for (int b = 0; b < BN / 64; ++b)
                            tma_load_2d(sB + s * BN * BK + b * 64 * BK, &tmB, &full[s], n0 + 64 * b, kt * BK);
                    } else {
                        tma_load_2d(sB + s * BN * BK, &tmB, &full[s], kt * BK, n0);
                    }
                    TIMELINE_MARK(kt == split * k_per, 1);
                    if (++s == QSIZE) { s = 0; phase ^= 1; }
                }
            }
        }
        if constexpr (SPLIT) {  // the consumers' two cluster barriers count every thread of the cluster
            cluster_sync();
            cluster_sync_relaxed();
        }
    } else {
        setmaxnreg_inc<232>();
        const int consumer = wg - 1, row = consumer * 64;
        TO* slabs = sC + consumer * 2 * 64 * PIECE;
        int s = 0, prev = 0;
        u32 phase = 0;
        float d[BN / 2];
        Stash<OVERLAP ? BN : 64> stash;  // OVERLAP: the previous tile, stored during this one's first k-steps
        stash.pending = false;
        stash.piece = 0;
        for (int unit = blockIdx.x; unit < num_units; unit += gridDim.x) {
            const int tile = unit / splits, split = unit % splits;
            const int packed = order[tile];
            const int m0 = (packed >> 16) * BM, n0 = (packed & 0xffff) * BN;
            const int k_begin = split * k_per, k_end = min(k_iters, k_begin + k_per);
            auto kstep = [&](int kt) {
                mbar_wait_parity(&full[s], phase);
                const T* a = sA + s * BM * BK + row * BK;  // this consumer's 64 rows (one 64 x 64 box if MN)
                const T* b = sB + s * BN * BK;
                wgmma_fence();
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const u64 da = A_MN ? desc_sw128_mn(a + 16 * 64 * k) : desc_sw128(a + 16 * k);
                    const u64 db = B_MN ? desc_sw128_mn(b + 16 * 64 * k) : desc_sw128(b + 16 * k);
                    Wgmma<BN, T>::template mma_t<A_MN, B_MN>(d, da, db, (kt == k_begin && k == 0) ? 0 : 1);
                }
                wgmma_commit();
                if (kt > k_begin) {
                    wgmma_wait<1>();
                    if (t == 0) mbar_arrive_notoken(&empty[prev]);
                }
                prev = s;
                if (++s == QSIZE) { s = 0; phase ^= 1; }
            };
            // Split-K: a consumer whose 64 rows all lie past M (M <= 64) issues no MMAs and hands each
            // stage straight back: the other consumer has the tensor cores to itself. Its zeros are never
            // stored. (A separate loop: a branch around the MMAs inside the k-loop makes ptxas serialize
            // them. Only the split instantiations carry it: in the others the extra path cost 8-11% at
            // 4095^3 and 8191^3, where M > 64 anyway.)
            if (SPLIT && m0 + row >= M) {
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
                for (int kt = k_begin; kt < k_end; ++kt) {
                    mbar_wait_parity(&full[s], phase);
                    if (t == 0) mbar_arrive_notoken(&empty[s]);
                    if (++s == QSIZE) { s = 0; phase ^= 1; }
                }
            } else {
                TIMELINE_MARK_AFTER_WAIT(&full[s], phase, threadIdx.x == 128, 2);
                int kt = k_begin;
                if constexpr (OVERLAP) {  // k_begin = 0: no split
                    ksteps_with_pieces<BN, 0>(stash, k_end, kstep, reinterpret_cast<unsigned char*>(slabs), &tmC,
                                              t, consumer);
                    kt = BN / 64;
                }
                for (; kt < k_end; ++kt) kstep(kt);
                wgmma_wait<0>();
                if (t == 0) mbar_arrive_notoken(&empty[prev]);  // the host never makes a split without k-steps
            }
            TIMELINE_MARK(threadIdx.x == 128, 3);

            const int r_top = m0 + row + frag_row(t), r_bot = r_top + 8;
            // act(alpha * acc + beta * C + bias) at output element (r, cc).
            auto epilogue_at = [&](float acc, int r, int cc) {
                float x = alpha * acc;
                if constexpr (HAS_C) {
                    if (r < M && cc < N) x += beta * to_float(Cin[r * ldc_row + cc * ldc_col]);
                }
                if constexpr (HAS_BIAS) {
                    if (cc < N) x += to_float(bias[cc]);
                }
                return activate<ACT>(x);
            };
            // The same for fragment value h (0..3) of 8-column group jj.
            auto epilogue = [&](float acc, int jj, int h) {
                return epilogue_at(acc, h < 2 ? r_top : r_bot, n0 + 8 * jj + frag_col(t) + (h & 1));
            };
            if constexpr (OVERLAP) {
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                    for (int h = 0; h < 4; ++h) d[4 * j + h] = epilogue(d[4 * j + h], j, h);
                }
#pragma unroll
                for (int i = 0; i < BN / 4; ++i) stash.st[i] = pack2(d[2 * i], d[2 * i + 1], (TO*)nullptr);
                stash.m0 = m0 + row;
                stash.n0 = n0;
                stash.pending = true;
                continue;
            }

            if constexpr (SPLIT) {
                // Split-K through the cluster. Both consumers' wgmmas are done with the stages before
                // either overwrites them with its 64 x BN partial (rows row .. row + 63, stride LDP).
                named_barrier_sync(3, 256);
                const u32 part = smem_u32(sA);  // 128 x BN fp32, row stride LDP
                const int rl = row + frag_row(t);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    const int cl = 8 * j + frag_col(t);
                    st_shared_f32x2(part + 4 * (rl * LDP + cl), d[4 * j], d[4 * j + 1]);
                    st_shared_f32x2(part + 4 * ((rl + 8) * LDP + cl), d[4 * j + 2], d[4 * j + 3]);
                }
                TIMELINE_MARK(threadIdx.x == 128, 4);
                cluster_sync();  // every CTA's partial is in its shared memory (release / acquire)
                TIMELINE_MARK(threadIdx.x == 128, 5);
                // This CTA's share: rows r0 .. r1 of the tile, four columns per item. Reads over the SM-to-SM
                // network are slow (BN = 128, 3 splits: 64 KB in 2.6 us, ~26 GB/s per SM on the H200,
                // benchmarks/h11_timeline.py), so the CTA's own partial is read locally, only the others'
                // cross, and a thread issues all its loads of an item before the first add. (Two items
                // at a time spilled registers in the heaviest epilogues.) Each element is
                // summed by one CTA in a fixed order (own rank first, then the next ranks cyclically):
                // deterministic.
                const int rows_per = (BM + splits - 1) / splits, r0 = split * rows_per, r1 = min(BM, r0 + rows_per);
                constexpr int C4 = BN / 4;
                const int items = max(0, r1 - r0) * C4;
                for (int i = threadIdx.x - 128; i < items; i += 256) {
                    const int rr = r0 + i / C4, c4 = (i % C4) * 4, r = m0 + rr, cc = n0 + c4;
                    if (r >= M || cc >= N) continue;
                    const u32 addr = part + 4 * (rr * LDP + c4);
                    float4 x[7];  // the other ranks' values
#pragma unroll
                    for (int o = 1; o < 8; ++o) {  // cluster size <= 8 (portable)
                        if (o < splits) x[o - 1] = ld_cluster_f32x4(addr, split + o < splits ? split + o : split + o - splits);
                    }
                    const float4 own = ld_shared_f32x4(addr);
                    float v[4] = {own.x, own.y, own.z, own.w};
#pragma unroll
                    for (int o = 1; o < 8; ++o) {
                        if (o < splits) {
                            v[0] += x[o - 1].x;
                            v[1] += x[o - 1].y;
                            v[2] += x[o - 1].z;
                            v[3] += x[o - 1].w;
                        }
                    }
#pragma unroll
                    for (int h = 0; h < 4; ++h) v[h] = epilogue_at(v[h], r, cc + h);
                    TO* dst = Out + (long long)r * ldo + cc;
                    if (cc + 3 < N && reinterpret_cast<size_t>(dst) % (4 * sizeof(TO)) == 0) {
                        if constexpr (sizeof(TO) == 4) {
                            *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
                        } else {
                            *reinterpret_cast<uint2*>(dst) =
                                make_uint2(pack2(v[0], v[1], (TO*)nullptr), pack2(v[2], v[3], (TO*)nullptr));
                        }
                    } else {
#pragma unroll
                        for (int h = 0; h < 4; ++h) {
                            if (cc + h < N) dst[h] = from_float<TO>(v[h]);
                        }
                    }
                }
                TIMELINE_MARK(threadIdx.x == 128, 6);
                cluster_sync_relaxed();  // no CTA leaves while the cluster still reads its shared memory
                TIMELINE_MARK(threadIdx.x == 128, 7);
                continue;
            }

            // Epilogue, PIECE columns at a time through two alternating slabs.
#pragma unroll
            for (int p = 0; p < BN / PIECE; ++p) {
                TO* slab = slabs + (p % 2) * 64 * PIECE;
                if constexpr (!DIRECT) {
                    // Two pieces back may be the previous tile's newest store (odd piece counts).
                    if (t == 0) {
                        if (p == 0) tma_store_wait_read<0>(); else tma_store_wait_read<1>();
                    }
                }
                // DIRECT: every thread has read this slab's previous piece back (two pieces ago).
                named_barrier_sync(1 + consumer, 128);
                float v[PIECE / 2];  // this thread's values of the piece, in fragment order
#pragma unroll
                for (int i = 0; i < PIECE / 2; ++i) v[i] = d[p * (PIECE / 2) + i];
#pragma unroll
                for (int j = 0; j < PIECE / 8; ++j) {
#pragma unroll
                    for (int h = 0; h < 4; ++h) v[4 * j + h] = epilogue(v[4 * j + h], p * (PIECE / 8) + j, h);
                }
                if constexpr (sizeof(TO) == 4) {
                    // fp32: each thread writes float2 pairs into the 128B-swizzled 64 x 32 slab.
#pragma unroll
                    for (int j = 0; j < PIECE / 8; ++j) {
                        const int col = 8 * j + frag_col(t), rt = frag_row(t);
                        store_f32x2_sw128(slab, rt, col, v[4 * j], v[4 * j + 1]);
                        store_f32x2_sw128(slab, rt + 8, col, v[4 * j + 2], v[4 * j + 3]);
                    }
                } else {
                    const int warp = t / 32, lane = t % 32, mi = lane / 8;
                    const int srow = warp * 16 + (mi & 1) * 8 + lane % 8;
                    const u32 base = smem_u32(slab);
#pragma unroll
                    for (int j = 0; j < PIECE / 8; j += 2) {
                        const u32 addr = base + sw128_offset(srow, 8 * (j + (mi >> 1)));
                        stmatrix_x4(addr, pack2(v[4 * j + 0], v[4 * j + 1], (TO*)nullptr),
                                    pack2(v[4 * j + 2], v[4 * j + 3], (TO*)nullptr),
                                    pack2(v[4 * j + 4], v[4 * j + 5], (TO*)nullptr),
                                    pack2(v[4 * j + 6], v[4 * j + 7], (TO*)nullptr));
                    }
                }
                if constexpr (DIRECT) {
                    named_barrier_sync(1 + consumer, 128);  // the piece is in the slab
                    store_piece_rows<TO, PIECE>(slab, Out, ldo, m0 + row, n0 + p * PIECE, M, N, t);
                    continue;
                }
                fence_proxy_async_smem();
                named_barrier_sync(1 + consumer, 128);
                if (t == 0) {
                    tma_store_2d(&tmC, slab, n0 + p * PIECE, m0 + row);
                    tma_store_commit();
                }
            }
        }
        if constexpr (OVERLAP) {
            if (stash.pending) flush_pieces<BN>(stash, reinterpret_cast<unsigned char*>(slabs), &tmC, t, consumer);
        }
        if (!DIRECT && t == 0) tma_store_wait_all<0>();
        if constexpr (!SPLIT) TIMELINE_MARK(threadIdx.x == 128, 7);
    }
}
