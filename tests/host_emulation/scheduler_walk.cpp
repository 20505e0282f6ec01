// Walk the engine kernel's tile scheduler (kernels/common/tile_scheduler.cuh) on the host, CTA by CTA,
// and print every unit: "cta tile k_begin k_end kind split" plus, for a stream-K owner, the CTAs whose
// partials it adds ("owner cta tile j..."), with the kernel's own loop condition. tests/test_plan.py
// checks the walk covers every k-step of every tile exactly once and that owners and contributors agree.
// Usage: scheduler_walk SCHEDULE tiles k_iters grid splits sk_tiles sk_ctas
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#define __device__
#define __forceinline__ inline
struct Dim3 {
    unsigned x = 0;
};
static Dim3 blockIdx, gridDim;
using std::min;

#include "common/tile_scheduler.cuh"

template <int S>
void walk(int tiles, int k_iters, ScheduleArgs a) {
    for (unsigned b = 0; b < gridDim.x; ++b) {
        blockIdx.x = b;
        TileScheduler<S> sched(tiles, k_iters, a);
        WorkUnit u;
        while (sched.next(u)) {
            std::printf("unit %u %d %d %d %d %d\n", b, u.tile, u.k_begin, u.k_end, u.kind, u.split);
            if (u.kind == UNIT_OWNER) {
                std::printf("owner %u %d", b, u.tile);
                for (int j = b + 1; j < a.sk_ctas && sched.sk_begin(j) < sched.streamed_end(u.tile); ++j)
                    std::printf(" %d", j);
                std::printf("\n");
            }
        }
    }
}

int main(int argc, char** argv) {
    if (argc != 8) return 2;
    const int sched = std::atoi(argv[1]), tiles = std::atoi(argv[2]), k_iters = std::atoi(argv[3]);
    gridDim.x = std::atoi(argv[4]);
    const ScheduleArgs a{std::atoi(argv[5]), std::atoi(argv[6]), std::atoi(argv[7])};
    if (sched == DATA_PARALLEL) walk<DATA_PARALLEL>(tiles, k_iters, a);
    if (sched == SPLIT_K) walk<SPLIT_K>(tiles, k_iters, a);
    if (sched == STREAM_K) walk<STREAM_K>(tiles, k_iters, a);
    if (sched == PINGPONG) walk<PINGPONG>(tiles, k_iters, a);  // the units of data-parallel; consumers alternate
    if (sched == SPLIT_K_GLOBAL) walk<SPLIT_K_GLOBAL>(tiles, k_iters, a);
    return 0;
}
