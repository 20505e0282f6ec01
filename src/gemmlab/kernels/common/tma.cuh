// TMA (bulk tensor copy) wrappers, PTX ISA "Data Movement: cp.async.bulk.tensor" and
// "cp.async.bulk.commit_group / wait_group". Coordinates are innermost first: (column, row).
#pragma once
#include "ptx.cuh"

// Global -> shared, completion signalled on `bar` as transaction bytes (mbarrier::complete_tx).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, u64* bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];"
        ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
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
// fenced with fence.proxy.async by the writing threads first.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                 ::"l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
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
