// An optional per-CTA timeline, for benchmarks/h11_timeline.py. It compiles in only when the program is
// built with TIMELINE_BUF defined as the device address of a u64 buffer; then TIMELINE_MARK(cond, e)
// records CTA blockIdx.x's event e as (%globaltimer in ns, clock64, %smid) (PTX "Special Registers").
// Without the define every mark is empty: the kernels the library runs carry no trace of it.
#pragma once

#define TIMELINE_EVENTS 8

#ifdef TIMELINE_BUF
__device__ __forceinline__ void timeline_mark(int event) {
    unsigned long long ns;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const long long clk = clock64();
    unsigned long long* p = reinterpret_cast<unsigned long long*>(TIMELINE_BUF) +
                            (blockIdx.x * TIMELINE_EVENTS + event) * 3;
    p[0] = ns;
    p[1] = static_cast<unsigned long long>(clk);
    p[2] = sm;
}
#define TIMELINE_MARK(cond, event) \
    do {                           \
        if (cond) timeline_mark(event); \
    } while (0)
// Wait for a stage (again: the wait the k-loop does next returns at once) and mark its arrival, outside
// the k-loop: a mark inside it would change how ptxas schedules the loop being measured.
#define TIMELINE_MARK_AFTER_WAIT(bar, parity, cond, event) \
    do {                                                    \
        if (cond) {                                         \
            mbar_wait_parity(bar, parity);                  \
            timeline_mark(event);                           \
        }                                                   \
    } while (0)
#else
#define TIMELINE_MARK(cond, event) ((void)0)
#define TIMELINE_MARK_AFTER_WAIT(bar, parity, cond, event) ((void)0)
#endif
