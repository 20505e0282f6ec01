"""Probe: where a cluster split-K launch of the engine kernel spends its time (issue 14's small-M weight
streams lose 1-1.8 us a call to cuBLAS at every candidate; session 22 ruled out the first loads' latency).
A patched copy of the kernels (kernels/common/timeline.cuh) marks, per CTA: the entry (0), the first
k-step landed for consumer 0 (2), its k-loop done (3), the partial written (4), the first cluster barrier
passed (7), [pushed: this CTA's slices landed (8)], its share of the reduction stored by thread 128 (5),
the closing cluster barrier passed (6) and the exit (1): %globaltimer (ns, 32 ns steps and up) and clock64
each. PROBE_VARIANT=pull: the pulled reduction (SPLIT_PUSH off; reduction.cuh), else the kernels as they
are (pushed where the tile fits). Eager launches of the route's plan, a synchronize after each, 30 runs
after 10 warm-ups; phase lengths from clock64 (cycles over the CTA's own clock), medians over CTAs and
runs. Records one line per shape under argv[1]. (Session 22's first records, `splitk_timeline.jsonl`
before 89bb6c4, timed the pulled form with marks inside its first item's remote loads, and a variant
with the first cluster barrier relaxed.)"""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
import gemmlab  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

SHAPES = [(64, 3072, 3072), (64, 5120, 5120), (77, 5120, 5120), (64, 4096, 3584), (1, 576, 5120),
          (256, 1536, 7168), (32, 4096, 4096)]
EV = 12
GEMM = "engine/gemm.cu"
PUSH = os.environ.get("PROBE_VARIANT", "push") != "pull"
PHASES = {"first_data": (0, 2), "k_loop": (2, 3), "partial_store": (3, 4), "cluster_barrier": (4, 7),
          **({"slices_wait": (7, 8), "reduce_store": (8, 5)} if PUSH else {"reduce_store": (7, 5)}),
          "release_barrier": (5, 6), "exit": (6, 1), "cta": (0, 1)}


_mark = parts.timeline_mark


def _after(text: str, e: int, pad: str = "            ") -> tuple:
    return parts.mark_between(GEMM, text, "", "wg == 1 && t == 0", e, pad)


def timeline_patches(addr: int) -> list:
    common = parts.timeline_common_patches(addr, EV)
    if not PUSH:
        return common + [
            ("common/gemm_traits.cuh", "#define SPLIT_PUSH_ON 1", "#define SPLIT_PUSH_ON 0"),
            (GEMM, "cluster_sync();  // every CTA's partial",
             _mark("wg == 1 && t == 0", 4) + " cluster_sync();  // every CTA's partial"),
            _after("cluster_sync();  // every CTA's partial is in its shared memory (barrier.cluster: release / "
                   "acquire)\n", 7),
            _after("split_reduce_store<Tr>(part, u.split, sargs.splits, m0, n0, ep, threadIdx.x - 128);\n", 5),
            _after("cluster_sync_relaxed();  // no CTA leaves while the cluster still reads its shared memory\n", 6)]
    return common + [
        parts.mark_between(GEMM, "", "                fence_proxy_async_smem();\n", "wg == 1 && t == 0", 4, " " * 16),
        _after("ordered for thread 128\n                cluster_sync_relaxed();\n", 7, "                "),
        _after("mbar_wait_parity(&slices, 0);\n", 8, "                "),
        _after("threadIdx.x - 128, recv);\n", 5, "                "),
        _after("cluster_sync_relaxed();  // no CTA leaves while a copy from its shared memory may be in flight\n", 6,
               "                ")]


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
        runs, err = parts.traced_plan(engine2, p, M, N, K, buf, EV)
        rec = {"suite": "splitk-timeline", "M": M, "N": N, "K": K, "plan": repr(p), "bm": p.bm, "bn": p.bn,
               "splits": p.splits, "swap_ab": p.swap_ab, "grid": p.grid, "rel_error": err}
        med = parts.median
        stats, mhz = parts.timeline_stats(runs, PHASES)  # phases in us at each CTA's clock
        rec.update(stats)
        # the cluster's CTAs arriving at the first barrier: latest - earliest, median over clusters and runs
        skew = [((r[:, 4, 0].view(-1, p.splits).max(1).values - r[:, 4, 0].view(-1, p.splits).min(1).values) / 1e3)
                .median().item() for r in runs if r.shape[0] % p.splits == 0]
        rec["cluster_arrival_skew_us"] = med(skew) if skew else None
        rec["variant"] = "push" if PUSH and p.split_push else "pull"
        k_steps = -(-K // 64) // p.splits
        rec["bytes_per_kstep"] = (p.bm + p.bn) * 128  # the A and B boxes a CTA loads a k-step
        rec["k_steps"] = k_steps
        rec.update({"gpu": gpu_info().name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")})
        print(f"{M}x{N}x{K} {'swap ' if p.swap_ab else ''}{p.bm}x{p.bn} s{p.splits} grid {p.grid}: "
              f"{parts.timeline_head(rec, k_steps)} + partial {rec['partial_store_us']:.2f}"
              f" + barrier {rec['cluster_barrier_us']:.2f} (skew {rec['cluster_arrival_skew_us']})"
              f" + slices {rec.get('slices_wait_us', 0):.2f} + reduce {rec['reduce_store_us']:.2f}"
              f" + release {rec['release_barrier_us']:.2f}" + parts.timeline_tail(rec, err), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
