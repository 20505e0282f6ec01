// The shared-memory ring between the producer warp (TMA loads) and the consumer warpgroups (wgmma):
// STAGES slots, each with a "full" barrier (the TMA's transaction bytes complete it) and an "empty"
// barrier (one arrival per consumer warpgroup releases it). Parity-style waits as in h06 on: waiters do
// not arrive, so "full" counts only the producer's expect_tx arrival.
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier" (init, arrive.expect_tx,
// try_wait.parity) and "cp.async.bulk.tensor" (mbarrier::complete_tx::bytes).
#pragma once
#include "mbarrier.cuh"

// Where a walker (producer or consumer) stands in the ring: the slot, and the parity of the slot's
// current phase. Producer and consumers walk the same sequence of k-steps, so their cursors agree.
struct RingCursor {
    int stage = 0;
    u32 phase = 0;
    template <int STAGES>
    __device__ __forceinline__ void advance() {
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
};

template <int STAGES>
struct Ring {
    u64 full[STAGES];
    u64 empty[STAGES];

    // One thread initialises; fence.mbarrier_init makes the inits visible to the async proxy (the TMA
    // completes transactions on "full") before any arrival (PTX ISA "fence.mbarrier_init").
    __device__ __forceinline__ void init(u32 consumers) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], consumers);
        }
        fence_mbarrier_init();
    }

    // Producer: wait until the consumers released the slot's previous contents (parity of the phase
    // before: a fresh barrier's "previous phase" counts as complete, so the first STAGES waits pass),
    // then announce the bytes the TMA will deliver. Returns the barrier the loads complete on.
    __device__ __forceinline__ u64* acquire(const RingCursor& c, u32 bytes) {
        mbar_wait_parity(&empty[c.stage], c.phase ^ 1);
        mbar_expect_tx(&full[c.stage], bytes);
        return &full[c.stage];
    }

    // Consumer: wait until the slot's loads landed (the TMA's complete_tx finished the phase).
    __device__ __forceinline__ void wait_full(const RingCursor& c) { mbar_wait_parity(&full[c.stage], c.phase); }

    // Consumer: this warpgroup no longer reads the slot (its wgmmas on it completed: wgmma.wait_group).
    __device__ __forceinline__ void release(int stage) { mbar_arrive_notoken(&empty[stage]); }
};
