// TMA (bulk tensor copy) wrappers, PTX ISA "Data Movement: cp.async.bulk.tensor" and
// "cp.async.bulk.commit_group / wait_group". Coordinates are innermost first: (column, row).
#pragma once
#include "ptx.cuh"

// The L2 eviction priority a load asks for its lines (PTX ISA "createpolicy" and the ".L2::cache_hint"
// qualifier of cp.async.bulk.tensor): L2_NORMAL issues the plain copy; L2_FIRST / L2_LAST attach a
// fractional policy (fraction 1.0) of that priority, so the L2 evicts those lines before (after) others.
enum L2Evict { L2_NORMAL = 0, L2_FIRST = 1, L2_LAST = 2 };

template <int EVICT>
__device__ __forceinline__ u64 l2_policy() {
    u64 policy = 0;
    if constexpr (EVICT == L2_FIRST) {
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    } else if constexpr (EVICT == L2_LAST) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    }
    return policy;
}

// The priorities the GEMMs' operand loads ask the L2 for. EVICT_WEIGHT (a kernel's setting,
// GemmTraits::EVICT_WEIGHT): the weight's lines evict first. L2_HINT (a probe's setting: 0 in the library)
// sets them for every instantiation: 1: the weight's lines evict first (each weight box is read by the few
// CTAs of one row of tiles and streamed past), the activations' last (re-read by every tile along the
// weight); 2: only the weight's evict first (EVICT_WEIGHT's choice); 3: both operands' evict last.
// benchmarks/probes/probe_variants.py (hint1 .. hint3) times them: on 16 weight streams (M <= 77, H200)
// 2 ran x1.017 in geomean (every one of the 16 ahead, up to x1.039), 1 x1.011, 3 x0.988
// (l2_hints_probe.jsonl); on the grouped MoE shapes 1 and 2 ran x0.97 (grouped kernels take none).
#ifndef L2_HINT
#define L2_HINT 0
#endif
template <bool WEIGHT_IS_A, bool EVICT_WEIGHT = false>
struct L2Hints {
    static constexpr int WEIGHT = (EVICT_WEIGHT || L2_HINT == 1 || L2_HINT == 2) ? L2_FIRST
                                  : L2_HINT == 3 ? L2_LAST : L2_NORMAL;
    static constexpr int ACT = (L2_HINT == 1 || L2_HINT == 3) ? L2_LAST : L2_NORMAL;
    static constexpr int A = WEIGHT_IS_A ? WEIGHT : ACT;
    static constexpr int B = WEIGHT_IS_A ? ACT : WEIGHT;
};

// Global -> shared, completion signalled on `bar` as transaction bytes (mbarrier::complete_tx); with EVICT
// other than L2_NORMAL, `policy` (l2_policy<EVICT>()) goes with it as the L2 cache hint.
template <int EVICT = L2_NORMAL>
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, u64* bar, int c0, int c1,
                                            u64 policy = 0) {
    if constexpr (EVICT == L2_NORMAL) {
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%3, %4}], [%2];"
            ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
            : "memory");
    } else {
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
            " [%0], [%1, {%3, %4}], [%2], %5;"
            ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "l"(policy)
            : "memory");
    }
}

// Same, delivered to the same smem offset in every CTA of the cluster whose bit is set in `mask`;
// each destination CTA's barrier (same offset) gets the complete_tx for its copy.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, u64* bar, int c0,
                                                      int c1, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;"
        ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
        : "memory");
}

// "cp.async.bulk.prefetch.tensor": bring the box at (c0, c1) into the L2 without a destination in shared
// memory or a barrier (a hint: nothing waits for it).
__device__ __forceinline__ void tma_prefetch_2d(const CUtensorMap* map, int c0, int c1) {
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];"
                 ::"l"(map), "r"(c0), "r"(c1) : "memory");
}

// Shared -> shared of CTA `cta` of this cluster ("cp.async.bulk.shared::cluster.shared::cta"): `bytes`
// (a multiple of 16, both addresses 16-byte aligned) from this CTA's `src` to the same offsets as `dst`
// and `bar` in the peer (mapa), completion signalled on the peer's barrier as transaction bytes.
__device__ __forceinline__ void bulk_copy_to_peer(u32 dst, u32 src, u32 bytes, u32 bar, u32 cta) {
    asm volatile(
        "{\n\t.reg .b32 d, b;\n\tmapa.shared::cluster.u32 d, %0, %3;\n\tmapa.shared::cluster.u32 b, %2, %3;\n\t"
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [d], [%1], %4, [b];\n\t}"
        ::"r"(dst), "r"(src), "r"(bar), "r"(cta), "r"(bytes) : "memory");
}

// Shared -> global bulk copy ("cp.async.bulk.global.shared::cta.bulk_group"): `bytes` (a multiple of 16,
// both addresses 16-byte aligned), completed with this thread's bulk async-group (tma_store_commit, then
// tma_store_wait_all). Shared memory written by ordinary stores is fenced for the async proxy first.
__device__ __forceinline__ void bulk_store_global(void* dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}

// Global -> shared bulk copy ("cp.async.bulk.shared::cluster.global"), its completion signalled on this
// CTA's barrier `bar` as transaction bytes (the same rules as bulk_store_global).
__device__ __forceinline__ void bulk_load_global(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Shared -> global bulk tensor store. Writes made by ordinary stores (st.shared, stmatrix) must be
// fenced with fence.proxy.async by the writing threads first. L2_STORE_HINT (a probe's setting, 0 in the
// library): 1 asks the L2 to evict the stored lines first (the output is not read again by the kernel,
// so the operands' panels keep their place).
#ifndef L2_STORE_HINT
#define L2_STORE_HINT 0
#endif
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
    if constexpr (L2_STORE_HINT == 1) {
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], %4;"
                     ::"l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1), "l"(l2_policy<L2_FIRST>()) : "memory");
    } else {
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                     ::"l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
    }
}

__device__ __forceinline__ void tma_store_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Wait until at most N committed store groups are still reading their shared-memory source.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void tma_store_wait_all() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// "prefetch.tensormap": pull the descriptor into the cache before the first copy uses it.
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
