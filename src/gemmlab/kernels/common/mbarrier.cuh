// mbarrier wrappers (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier").
//
// Two styles, because the ladder shows the difference:
//  * token style (h01-h05): every waiting thread first arrives and then waits on the returned state
//    ("mbarrier.arrive" + "mbarrier.test_wait"), the way a library barrier object is used. A barrier
//    that consumers wait on must then count the consumers among its arrivals.
//  * parity style (h06 on): threads wait on a phase's parity ("mbarrier.try_wait.parity") without
//    arriving, so a "full" barrier counts only the producer, and no 64-bit token is kept.
#pragma once
#include "ptx.cuh"

// "mbarrier.init": expected arrival count for each phase.
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// "fence.mbarrier_init": make the inits visible to the async proxy and the other CTAs of the cluster
// before anyone arrives or a TMA completes on them.
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// "mbarrier.arrive": one arrival; returns the phase token (token style).
__device__ __forceinline__ u64 mbar_arrive(u64* bar) {
    u64 state;
    asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
    return state;
}

// "mbarrier.arrive.expect_tx": one arrival that also announces `bytes` of TMA transactions.
__device__ __forceinline__ u64 mbar_arrive_expect_tx(u64* bar, u32 bytes) {
    u64 state;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
                 : "=l"(state) : "r"(smem_u32(bar)), "r"(bytes) : "memory");
    return state;
}

// "mbarrier.test_wait" spun until the phase of `state` completed (token style).
__device__ __forceinline__ void mbar_wait_token(u64* bar, u64 state) {
    u32 done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(smem_u32(bar)), "l"(state) : "memory");
    } while (!done);
}

// "mbarrier.try_wait.parity": wait until the phase with parity `parity` has completed (parity style).
// try_wait suspends the thread for a hardware-chosen time before returning false, so the loop is cheap.
__device__ __forceinline__ void mbar_wait_parity(u64* bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
}

// "mbarrier.expect_tx" without arriving (parity style producer: arrive comes from the TMA count).
__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

// Plain arrival, no token kept (parity style).
__device__ __forceinline__ void mbar_arrive_notoken(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// "cp.async.mbarrier.arrive.noinc": an arrival on `bar` once this thread's earlier cp.async copies have
// landed (noinc: the barrier's expected count already includes it).
__device__ __forceinline__ void mbar_arrive_after_cp_async(u64* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Arrive on the barrier at the same shared-memory offset in CTA `cta` of this cluster
// ("mapa" to get its shared::cluster address, then "mbarrier.arrive.relaxed.cluster").
// Relaxed, not release: what the arrival announces is that this warpgroup's wgmma reads of the stage
// are done, and wgmma.wait_group already guarantees that; a release would order this thread's ordinary
// memory accesses too, which ptxas implements with MEMBAR.ALL.GPU in the middle of the k-loop.
__device__ __forceinline__ void mbar_arrive_cluster(u64* bar, u32 cta) {
    asm volatile("{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, %0, %1;\n\t"
                 "mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [remote];\n\t}"
                 ::"r"(smem_u32(bar)), "r"(cta) : "memory");
}
