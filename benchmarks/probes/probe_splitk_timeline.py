"""Probe: where a cluster split-K launch of the engine kernel spends its time (issue 14's small-M weight
streams lose 1-1.8 us a call to cuBLAS at every candidate; session 22 ruled out the first loads' latency
and the reduction's DSMEM round trips). A patched copy of the kernels (kernels/common/timeline.cuh) marks,
per CTA, the entry (0), the first k-step landed for consumer 0 (2), its k-loop done (3), the partials
written (4), the first cluster barrier passed (7), thread 128's first item of the reduction summed (8) and
stored (9), its share of the reduction stored by thread 128 (5), the
closing cluster barrier passed (6) and the exit (1): %globaltimer (ns, 32 ns steps and up) and clock64
each. Eager launches of the route's plan, a synchronize after each, 30 runs after 10 warm-ups; phase
lengths from clock64 (cycles over the CTA's own clock), medians over CTAs and runs. Records one line per
shape under argv[1]."""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
import gemmlab  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

SHAPES = [(64, 3072, 3072), (64, 5120, 5120), (77, 5120, 5120), (64, 4096, 3584), (16, 1152, 1024), (1, 576, 5120),
          (256, 1536, 7168), (32, 4096, 4096)]
EV = 12
RED = "common/reduction.cuh"
GEMM, LOOP = "engine/gemm.cu", "common/mainloop.cuh"
PHASES = {"first_data": (0, 2), "k_loop": (2, 3), "partial_store": (3, 4), "cluster_barrier": (4, 7),
          "reduce_store": (7, 5), "first_item_loads": (7, 8), "first_item_store": (8, 9), "other_items": (9, 5),
          "release_barrier": (5, 6), "exit": (6, 1), "cta": (0, 1)}


# PROBE_VARIANT=relaxed: the first cluster barrier without release / acquire (no MEMBAR.ALL.GPU before its
# arrive): a measurement of that fence's cost only, not a correct kernel (the partials' shared-memory
# writes are then not ordered before the other CTAs' DSMEM reads).
VARIANT_PATCHES = {"as-is": [], "relaxed": [
    (GEMM, "cluster_sync();  // every CTA's partial", "cluster_sync_relaxed();  // every CTA's partial")]}


def timeline_patches(addr: int) -> list:
    mark = lambda cond, e: f"TIMELINE_MARK({cond}, {e});"  # noqa: E731
    return [
        ("common/timeline.cuh", "#define TIMELINE_EVENTS 8", f"#define TIMELINE_EVENTS {EV}"),
        # inside the reduction: thread 128's first item summed (the mark waits for the sum: its condition
        # reads it) and stored
        (RED, "        const float4 sum = cluster_sum_f32x4(part + 4 * (rr * Tr::LDP + c4), rank, splits);\n",
         "        const float4 sum = cluster_sum_f32x4(part + 4 * (rr * Tr::LDP + c4), rank, splits);\n"
         "        " + mark("ct == 0 && i == ct && sum.x != 1.2345e-30f", 8) + "\n"),
        (RED, "            store_out4(ep.out_at(r, cc), v, ep.N - cc);\n        }\n",
         "            store_out4(ep.out_at(r, cc), v, ep.N - cc);\n        }\n        " + mark("ct == 0 && i == ct", 9) + "\n"),
        (GEMM, '#include "common/gemm_traits.cuh"',
         f'#define TIMELINE_BUF {addr:#x}ull\n#include "common/timeline.cuh"\n#include "common/gemm_traits.cuh"'),
        (GEMM, "t = threadIdx.x % 128;\n", "t = threadIdx.x % 128;\n    " + mark("threadIdx.x == 0", 0) + "\n"),
        (GEMM, "u.k_begin, u.k_end, rows);\n", "u.k_begin, u.k_end, rows);\n        " + mark("wg == 1 && t == 0", 3) + "\n"),
        (GEMM, "cluster_sync();  // every CTA's partial",
         mark("wg == 1 && t == 0", 4) + " cluster_sync();  // every CTA's partial"),
        (GEMM, "cluster_sync();  // every CTA's partial is in its shared memory (barrier.cluster: release / acquire)\n",
         "cluster_sync();  // every CTA's partial is in its shared memory (barrier.cluster: release / acquire)\n"
         "            " + mark("wg == 1 && t == 0", 7) + "\n"),
        (GEMM, "threadIdx.x - 128);\n", "threadIdx.x - 128);\n            " + mark("wg == 1 && t == 0", 5) + "\n"),
        (GEMM, "cluster_sync_relaxed();  // no CTA leaves while the cluster still reads its shared memory\n",
         "cluster_sync_relaxed();  // no CTA leaves while the cluster still reads its shared memory\n            "
         + mark("wg == 1 && t == 0", 6) + "\n"),
        (GEMM, "    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();",
         "    " + mark("wg == 1 && t == 0", 1) + "\n    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();"),
        (LOOP, "        ring.wait_full(cur);\n        // This consumer's rows",
         "        ring.wait_full(cur);\n        " + mark("consumer == 0 && t == 0 && kt == k_begin", 2)
         + "\n        // This consumer's rows")] + VARIANT_PATCHES[os.environ.get("PROBE_VARIANT", "as-is")]


def main():
    buf = torch.zeros(132 * EV * 3, dtype=torch.int64, device="cuda")
    parts.PATCHES["splitk-timeline"] = timeline_patches(buf.data_ptr())
    compiler.KERNEL_ROOT = parts.patched_root("splitk-timeline")
    from gemmlab import engine2
    from gemmlab.gpu import gpu_info
    out = open(sys.argv[1], "a")
    for M, N, K in SHAPES:
        p = gemmlab.plan(M, N, K).plan
        if p is None or p.schedule != "split_k":
            print(f"{M}x{N}x{K}: route {gemmlab.plan(M, N, K)!r} is not split-K; skipped")
            continue
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        o = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ w.float().t()
        runs = [r.view(132, EV, 3)[: p.grid].double() for r in parts.traced_runs(engine2, p, a, w, o, buf)]
        err = ((o.float() - ref).norm() / ref.norm()).item()
        rec = {"suite": "splitk-timeline", "M": M, "N": N, "K": K, "plan": repr(p), "bm": p.bm, "bn": p.bn,
               "splits": p.splits, "swap_ab": p.swap_ab, "grid": p.grid, "rel_error": err}
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        mhz = [(((r[:, 1, 1] - r[:, 0, 1]) / (r[:, 1, 0] - r[:, 0, 0])) * 1e3).median().item() for r in runs]
        rec["cta_sm_mhz"] = med(mhz)
        for name, (e0, e1) in PHASES.items():  # cycles between the marks, in us at the CTA's clock
            rec[name + "_us"] = med([((r[:, e1, 1] - r[:, e0, 1]) / mz).median().item() for r, mz in zip(runs, mhz)])
        rec["span_us"] = med([((r[:, 1, 0].max() - r[:, 0, 0].min()) / 1e3).item() for r in runs])
        rec["start_spread_us"] = med([((r[:, 0, 0].max() - r[:, 0, 0].min()) / 1e3).item() for r in runs])
        # the cluster's CTAs arriving at the first barrier: latest - earliest, median over clusters and runs
        skew = [((r[:, 4, 0].view(-1, p.splits).max(1).values - r[:, 4, 0].view(-1, p.splits).min(1).values) / 1e3)
                .median().item() for r in runs if r.shape[0] % p.splits == 0]
        rec["cluster_arrival_skew_us"] = med(skew) if skew else None
        rec["variant"] = os.environ.get("PROBE_VARIANT", "as-is")
        rec["kloop_end_spread_us"] = med([((r[:, 3, 0].max() - r[:, 3, 0].min()) / 1e3).item() for r in runs])
        k_steps = -(-K // 64) // p.splits
        rec["bytes_per_kstep"] = (p.bm + p.bn) * 128  # the A and B boxes a CTA loads a k-step
        rec["k_steps"] = k_steps
        rec.update({"gpu": gpu_info().name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")})
        print(f"{M}x{N}x{K} {'swap ' if p.swap_ab else ''}{p.bm}x{p.bn} s{p.splits} grid {p.grid}: span "
              f"{rec['span_us']:.2f} us (starts spread {rec['start_spread_us']:.2f}, k-loop ends spread "
              f"{rec['kloop_end_spread_us']:.2f}); CTA {rec['cta_us']:.2f} = first data {rec['first_data_us']:.2f}"
              f" + k-loop {rec['k_loop_us']:.2f} ({k_steps} k-steps) + partial {rec['partial_store_us']:.2f}"
              f" + barrier {rec['cluster_barrier_us']:.2f} (skew {rec['cluster_arrival_skew_us']}) + reduce {rec['reduce_store_us']:.2f} + release {rec['release_barrier_us']:.2f} + exit "
              f"{rec['exit_us']:.2f} at {rec['cta_sm_mhz']:.0f} MHz (err {err:.1e})", flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
