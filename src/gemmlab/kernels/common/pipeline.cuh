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
    // Step over n slots (another walker's k-steps): every wrap flips the phase.
    template <int STAGES>
    __device__ __forceinline__ void skip(int n) {
        const int s = stage + n;
        phase ^= (s / STAGES) & 1;
        stage = s % STAGES;
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
    // With B multicast (CTAS = 2) both CTAs' loads write the slot, so the release goes to the "empty"
    // barrier of every CTA of the cluster (whose counts are consumers x CTAS).
    template <int CTAS = 1>
    __device__ __forceinline__ void release(int stage) {
        mbar_arrive_notoken(&empty[stage]);
        if constexpr (CTAS > 1) {  // the peers' barriers through the cluster (mapa), this CTA's directly
            const u32 me = cluster_ctarank();
#pragma unroll
            for (u32 r = 1; r < CTAS; ++r) mbar_arrive_cluster(&empty[stage], (me + r) % CTAS);
        }
    }
};

// Ping-pong consumers take turns at the ring: a consumer starts a unit's k-loop only after the other
// consumer finished the k-loop of the unit before. Besides ordering the tensor-core work (one's epilogue
// runs under the other's wgmmas), this keeps the parity waits sound: a consumer that skipped the other's
// k-steps waits on slots whose previous phase is then complete, never on one two phases behind (whose
// parity would read as done). One barrier per consumer, one arrival (by the other's thread 0) per turn.
struct Turns {
    u64 bar[2];
    __device__ __forceinline__ void init() {
        mbar_init(&bar[0], 1);
        mbar_init(&bar[1], 1);
    }
    // Consumer c: wait for its turn (parity: this consumer's count of turns waited, mod 2).
    __device__ __forceinline__ void wait(int c, u32& parity) {
        mbar_wait_parity(&bar[c], parity);
        parity ^= 1;
    }
    // Consumer c's thread 0, after the k-loop: the other consumer's turn.
    __device__ __forceinline__ void pass(int c) { mbar_arrive_notoken(&bar[c ^ 1]); }
};
