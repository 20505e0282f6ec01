// Small PTX helpers every Hopper step uses: shared-memory addresses, fences, cluster ids.
// Citations are to the PTX ISA (version 8.x/9.x), section names.
#pragma once
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef unsigned long long u64;

// The driver's opaque TMA descriptor (cuda.h's CUtensorMap). cuda.h does not compile under NVRTC,
// so declare the same 128-byte, 64-byte-aligned struct here. Passed by value as
// `const __grid_constant__ CUtensorMap` so the TMA unit can read it from parameter space.
struct alignas(64) CUtensorMap {
    u64 opaque[16];
};

// Generic -> shared::cta 32-bit address (PTX "cvta", state-space conversion).
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// The warpgroup of this thread (threadIdx.x / 128), read from lane 0 with __shfl_sync so the compiler
// knows it is the same in every lane of the warp. A branch on it is then warp-uniform, and what the code
// behind it computes from loop counters alone (the consumers' wgmma descriptors) stays in uniform
// registers: from threadIdx.x directly, the 64 x 96 engine tile's consumer loop moved each descriptor from
// a vector register with R2UR (34 R2UR in the kernel, 5 this way) and measured 2% slower in geomean on 24
// mid-size 64-row plans (up to 13%; docs/worklog.md, session 20).
__device__ __forceinline__ int warpgroup_index() {
    return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
}

// Memory consistency model, "fence.proxy.async": shared memory written by ordinary stores that the
// async proxy (TMA, wgmma) reads next must be fenced by the writing threads before the barrier.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The same between the generic proxy and the async proxy (bulk copies) for global memory: global split-K's
// partials, written and read by bulk copies, published and acquired through generic-proxy flags.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

// "bar.sync" with an id and a thread count: a barrier for one warpgroup (or a few) only.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Programmatic dependent launch (PTX "griddepcontrol"; the launch attribute CUDA calls
// programmaticStreamSerializationAllowed, set by gemmlab.jit.launch.Launcher(pdl=True)). A kernel launched
// with it may be scheduled while the kernel before it on the stream still runs, so its set-up (barrier
// initialisation) overlaps that kernel's tail instead of following the launch gap. pdl_wait() returns
// once every prerequisite grid has completed and its memory is visible; each thread calls it before its
// first global load or store (operands, tables, workspace, output: the kernel before may write what this
// one reads, or read what it writes). In a launch without the attribute it returns at once.
__device__ __forceinline__ void pdl_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Lets the next kernel on the stream, if launched with the attribute, be scheduled once every CTA of this
// grid has said so or exited: its CTAs take SMs as they are free and stop in their own pdl_wait() until
// this grid has completed. Harmless otherwise. The engine's kernels say so at a CTA's end
// (pdl_trigger_late), so the next kernel's CTAs land on SMs as a plain launch's would: said earlier,
// while this grid still runs, the next grid's CTAs take whatever SMs have room first (the SMs a grid
// smaller than the GPU leaves idle; with several CTAs an SM, the SMs whose CTAs are done), an uneven
// spread that slowed weight streams by 3-20% (docs/worklog.md, session 14). PDL_TRIGGER_EARLY=1 (a
// probe's define) says so at the start instead.
__device__ __forceinline__ void pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

#ifndef PDL_TRIGGER_EARLY
#define PDL_TRIGGER_EARLY 0
#endif

__device__ __forceinline__ void pdl_trigger_early() {
    if (PDL_TRIGGER_EARLY) pdl_launch_dependents();
}

__device__ __forceinline__ void pdl_trigger_late() {
    if (!PDL_TRIGGER_EARLY) pdl_launch_dependents();
}

// Special registers %cluster_ctarank / %cluster_nctarank (PTX "Special Registers").
__device__ __forceinline__ u32 cluster_ctarank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// "barrier.cluster.arrive" + "barrier.cluster.wait": all threads of all CTAs in the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

// "st.shared.v2.f32": two floats to a shared-memory address (8-byte aligned).
__device__ __forceinline__ void st_shared_f32x2(u32 smem_addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(smem_addr), "f"(x), "f"(y) : "memory");
}

// "barrier.cluster.arrive.relaxed" + "barrier.cluster.wait": a cluster barrier that orders nothing but
// itself, for when each thread's own reads are complete already (their values have been used).
__device__ __forceinline__ void cluster_sync_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

// "ld.shared.v4.f32": four floats from this CTA's shared memory (16-byte aligned).
__device__ __forceinline__ float4 ld_shared_f32x4(u32 smem_addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(smem_addr));
    return v;
}

// "mapa" + "ld.shared::cluster": four floats at the same shared-memory offset in CTA `cta` of this
// cluster (distributed shared memory, PTX "Data Movement: ld" with the .shared::cluster state space).
__device__ __forceinline__ float4 ld_cluster_f32x4(u32 smem_addr, u32 cta) {
    u32 remote;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr), "r"(cta));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote));
    return v;
}

// "setmaxnreg" (sm_90a): move registers between warpgroups. Takes effect only with a register cap at
// entry (__launch_bounds__(threads, 1)) and when each role is one branch of one if/else.
template <u32 N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <u32 N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
}
